"""What the launcher's own nonce-bearing lines say about a job (pure; DESIGN §9).

The launcher's supervisor prints `POSTTRAIN_LAUNCHER <nonce> <json>` lines: the versions it
installed, the sandbox it set up (`loopback_tcp` true, or false and why: AF_UNIX sockets only),
then either how the script exited or the stage that failed before the script ran (config,
packages, venv, install, prepare, seccomp, fds, uid, exec, supervisor). Only lines with
the job's nonce count, so an agent's script cannot forge a stage. The broker reads them to tell
the agent why a job failed in its `message` (without a `jobs_logs` step), and the audit record
keeps the installed versions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from job_launcher.trusted_lines import LAUNCHER_TAG, trusted_payloads
from posttrain_env.limits import MAX_LAUNCHER_ERROR_CHARS, MAX_LAUNCHER_PACKAGES

# Versions kept per job (a job may install many packages; the record stays bounded).
MAX_PACKAGES = MAX_LAUNCHER_PACKAGES
MAX_ERROR_CHARS = MAX_LAUNCHER_ERROR_CHARS


@dataclass(frozen=True)
class LauncherReport:
    installed: dict[str, str] = field(default_factory=dict)
    installer: str | None = None
    failed_stage: str | None = None  # the script never ran
    error: str | None = None
    exit_code: int | None = None  # the script ran and exited
    signal: int | None = None
    # The sandbox's sockets: TCP on loopback (True), AF_UNIX only (False, and why); None: the
    # launcher never said (it failed before, or predates the loopback policy).
    loopback_tcp: bool | None = None
    loopback_reason: str | None = None

    @property
    def failure_message(self) -> str | None:
        """The job's message when the launcher says why it failed; None otherwise."""
        if self.failed_stage is not None:
            return (
                f"the job failed in the launcher's {self.failed_stage} stage, before the "
                f"script ran: {self.error or 'no detail'}"
            )
        if self.signal is not None:
            return f"the script was killed by signal {self.signal}"
        if self.exit_code:
            return f"the script exited with code {self.exit_code}"
        return None


def read_launcher_lines(lines: Iterable[str], nonce: str) -> LauncherReport:
    """The report of the launcher's lines with `nonce` (the last final line wins)."""
    installed: dict[str, str] = {}
    installer = stage = error = None
    exit_code = sig = None
    loopback: bool | None = None
    why: str | None = None
    for payload in trusted_payloads(lines, LAUNCHER_TAG, nonce):
        kind = payload.get("stage")
        if not isinstance(kind, str):
            continue
        if kind == "sandbox":
            loopback, why = _sandbox_of(payload, None, None)
        elif kind == "installed":
            packages = payload.get("packages")
            if isinstance(packages, dict):
                for name, version in list(packages.items())[:MAX_PACKAGES]:
                    if len(installed) >= MAX_PACKAGES:  # in all lines together, not each
                        break
                    if isinstance(name, str) and isinstance(version, str):
                        installed[name[:200]] = version[:100]
            if isinstance(payload.get("installer"), str):
                installer = payload["installer"][:20]
        elif kind == "exit":
            loopback, why = _sandbox_of(payload, loopback, why)
            code, got_sig = payload.get("exit_code"), payload.get("signal")
            exit_code = code if isinstance(code, int) and not isinstance(code, bool) else None
            sig = got_sig if isinstance(got_sig, int) and not isinstance(got_sig, bool) else None
            stage = error = None
        else:
            loopback, why = _sandbox_of(payload, loopback, why)
            message = payload.get("error")
            stage = kind[:40]
            error = message[:MAX_ERROR_CHARS] if isinstance(message, str) else None
            exit_code = sig = None
    return LauncherReport(installed, installer, stage, error, exit_code, sig, loopback, why)


def _sandbox_of(
    payload: dict, loopback: bool | None, why: str | None
) -> tuple[bool | None, str | None]:
    """The sandbox a line reports (the sandbox line, or a final line repeating it), else what
    was known before."""
    on = payload.get("loopback_tcp")
    if not isinstance(on, bool):
        return loopback, why
    reason = payload.get("loopback_reason")
    return on, reason[:MAX_ERROR_CHARS] if isinstance(reason, str) and not on else None
