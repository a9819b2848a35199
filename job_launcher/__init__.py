"""What runs inside a job: the stdlib-only launcher (install wheels, seccomp, close fds, drop the
uid, run the agent's script), its builder, requirement validation and the trusted log lines."""
