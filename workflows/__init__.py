"""Temporal workflows: deterministic code only (no I/O, clock, randomness or environment).

session.py           SessionWorkflow: a client session; `reset` starts an episode, `close` ends it
episode.py           EpisodeWorkflow: steps, deadline, end and reward of one episode
episode_contract.py  what the gateway and the session say to an episode (ToolCall, ToolResult, ...)
episode_tools.py     the nine tools, each bound to its entry of `posttrain_env.tools`
episode_jobs.py      starting, cancelling and following the episode's jobs
episode_rules.py     the episode's rules and views (pure, tested without Temporal)
episode_state.py     what an episode carries through continue-as-new
recent.py            the answers an episode remembers, so a retried request runs once
job.py               JobWorkflow: one job of any role, submit to settle
watcher.py           WatcherWorkflow: one listing call per look, for every live job
account.py           AccountWorkflow: the server-wide caps
reaper.py            ReaperWorkflow: orphaned Hugging Face jobs
ledger.py            money, in micro-USD (pure)
ids.py, policies.py, waiting.py   workflow ids and signal names, timeouts and retries, waiting

Workflows call activities through their interfaces (`posttrain_env.contracts.activities`), never
their code, and may import only `posttrain_env` and each other.
"""
