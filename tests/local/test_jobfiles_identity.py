"""A job phase's recorded sandbox identity (`sandbox.json`), as cancel reads it to kill the
sandbox: a phase whose sandbox never reported its pid is recorded without one, and cancelling
then must not fail (it failed with KeyError in a CI run that cancelled during the install)."""

from __future__ import annotations

import os
import subprocess
import sys

from activities.backends.local import jobfiles as jf


def test_a_phase_recorded_without_a_pid_is_not_alive_and_nothing_is_signalled() -> None:
    assert jf.is_alive({"phase": "install"}) is False
    assert jf.kill({"phase": "install"}) is False
    assert jf.is_alive(None) is False and jf.kill(None) is False


def test_a_live_process_is_alive_until_killed_and_a_reused_pid_is_not_it() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ident = jf.identity(child.pid)
        assert ident is not None and jf.is_alive(ident)
        # The same pid with another start time is another process: never signalled.
        assert not jf.is_alive({**ident, "start": ident["start"] + 1})
        assert jf.kill(ident) is True
        child.wait(timeout=10)
        assert not jf.is_alive(ident)
    finally:
        if child.poll() is None:
            os.kill(child.pid, 9)
            child.wait()
