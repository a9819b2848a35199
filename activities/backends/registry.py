"""Every jobs backend, by name: the one registry of them (docs/backends.md).

A backend is a folder under `activities/backends/` whose `info.py` declares `BACKEND`, a
`BackendInfo`: its name, its capabilities and how to build it. It is registered here once it
passes the conformance suite (tests/backends/), which runs over every entry of `BACKENDS`.
Reading this registry loads only the declarations, never a backend's code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.backends.fake import info as fake
from activities.backends.hf import info as hf
from activities.backends.interface import BackendInfo, JobsBackend, OrphanSource
from activities.backends.local import info as local
from activities.backends.replay import info as replay

BACKENDS: dict[str, BackendInfo] = {
    info.name: info for info in (local.BACKEND, hf.BACKEND, fake.BACKEND, replay.BACKEND)
}


class UnknownBackend(ValueError):
    """POSTTRAIN_BACKEND names no registered backend; the message lists those that exist."""


def backend_info(name: str) -> BackendInfo:
    """The registered backend called `name`, as its settings make it here (`in_force`: the
    replay backend over `hf` spends money). Raises UnknownBackend, or SystemExit when the
    backend's own settings are invalid."""
    try:
        info = BACKENDS[name]
    except KeyError:
        raise UnknownBackend(
            f"POSTTRAIN_BACKEND={name!r} names no backend; choose one of {', '.join(BACKENDS)}"
        ) from None
    return info.in_force(backend_info) if info.in_force is not None else info


if TYPE_CHECKING:  # pyright's check that every backend's class has the whole interface
    from activities.backends.fake.backend import FakeBackend
    from activities.backends.hf.backend import HfBackend
    from activities.backends.local.backend import LocalBackend
    from activities.backends.replay.backend import ReplayBackend

    def _every_backend_is_a_jobs_backend(
        fake: FakeBackend, hf: HfBackend, local: LocalBackend, replay: ReplayBackend
    ) -> tuple[list[JobsBackend], list[OrphanSource]]:
        # A member missing from a class (a method added to JobsBackend and not to a backend)
        # fails the type check here, not an activity at run time.
        return [fake, hf, local, replay], [hf, replay]
