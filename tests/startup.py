"""How long a test waits for a Temporal server it starts (a dev server, the time-skipping test
server) to answer.

The SDK waits 5 s by default (`dev_server_startup_timeout`, `test_server_startup_timeout`);
beside 16 busy processes (scripts/ci-under-load) eleven tests of one loaded default set failed
there, "ephemeral server ... did not start within 5s", and two more at the test server's. How
fast a server starts is no test's subject (bench/ measures start-up), so the wait is generous."""

from __future__ import annotations

from datetime import timedelta

DEV_SERVER_STARTUP = timedelta(minutes=2)
# A server command that is expected to refuse and exit (a bad setting, a port taken): it exits in
# seconds idle; beside 16 busy processes two took over the 60 s allowed before. What is tested is
# that it refuses and says why, not how fast.
START_REFUSAL_S = 240
