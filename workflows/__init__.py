"""Layer 3, workflows: deterministic Temporal code only (no I/O, clock, randomness or environment).

Sessions and episodes
session.py            SessionWorkflow: a client session; `reset` starts an episode, `close` ends it
episode.py            EpisodeWorkflow: the life of one episode (steps, deadline, end, reward)
episode_contract.py   what is said to an episode (re-exported from `contracts.episode_calls`)
episode_tools.py      the nine tools, each bound to its entry of `posttrain_env.tools`
episode_jobs.py       starting, cancelling and following the episode's jobs
episode_outbox.py     what it sends besides answers: the session's reply, the close, the audit
episode_contamination.py  the grader-side contamination check at the end of a submit
episode_rules.py      rules, views, answers and status, from the episode's state (pure)
episode_timing.py     its deadline, the run loop's timer, when the session's reply is due (pure)
episode_state.py      what an episode carries through continue-as-new
recent.py             the answers an episode remembers, so a retried request runs once (pure)
ledger.py             money, in micro-USD (pure)

Jobs and the server
job.py                JobWorkflow: one job of any role, submit to settle
watcher.py            WatcherWorkflow: one listing call per look, for every live job
account.py            AccountWorkflow: the server-wide caps
reaper.py             ReaperWorkflow: orphaned Hugging Face jobs (a Schedule starts it)
retention.py          RetentionWorkflow: one sweep of old job folders (a Schedule starts it)

Campaigns
campaign.py           CampaignWorkflow: rollouts over tasks x agents x epochs, `concurrency` at once
campaign_contract.py  what a campaign starts with and carries
campaign_rules.py, campaign_retries.py  its order, admission, bookkeeping, `campaign retry` (pure)
rollout.py            RolloutWorkflow: one agent driving one episode to its end (one attempt)
rollout_contract.py   what a rollout starts with and carries; rollout_rules.py: its record (pure)

Shared
history.py, visibility.py  when to continue as new; the search attributes operators filter on
ids.py, policies.py, waiting.py   workflow ids and signal names, timeouts and retries, waiting

Workflows call activities through their interfaces (`posttrain_common.contracts.activities`), never
their code, and import only the ground (`posttrain_env`, `job_launcher`) and each other
(tests/test_layers.py checks it). A module marked pure calls no Temporal API: it is tested
without a server.
"""
