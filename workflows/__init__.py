"""Layer 4, workflows: deterministic Temporal code only (no I/O, clock, randomness or environment).

One folder per feature; a feature's pure rules sit beside its workflow and are tested without
Temporal.

episode/     SessionWorkflow (session.py: a client session; `reset` starts an episode, `close`
             ends it) and EpisodeWorkflow (workflow.py: steps, deadline, end, reward); its tools
             (tools.py, one handler per entry of `posttrain_env.tools`), its jobs (jobs.py),
             what it sends besides answers (outbox.py), the grader-side contamination check
             (contamination.py); pure: rules.py, timing.py, state.py, recent.py, ledger.py
             (money in micro-USD), payload_guard.py
job/         JobWorkflow (workflow.py: one job of any role, submit to settle) and the
             WatcherWorkflow (watcher.py: one listing call per look, for every live job)
campaign/    CampaignWorkflow (workflow.py, contract.py; pure: rules.py, retries.py) and
             RolloutWorkflow (rollout.py, rollout_contract.py; pure: rollout_rules.py)
operations/  AccountWorkflow (the server-wide caps), DeploymentWorkflow (the key's fingerprint),
             ReaperWorkflow (orphaned jobs), RetentionWorkflow (old job folders), and what
             operators search by (search_attributes.py, visibility.py)

Shared: ids.py (workflow ids, signal names), policies.py (timeouts and retries), waiting.py,
history.py (when to continue as new).

A workflow's inputs, reports and carried state (pydantic models) live in a contract module
beside it (`contract.py`, `<workflow>_contract.py`), imported through
`workflow.unsafe.imports_passed_through()`: the sandbox imports a workflow's own module afresh
for every workflow instance, and building models there cost a fifth of a workflow process's time
at thousands of new jobs (tests/test_worker_sandbox.py checks that none is built).

Workflows call activities through their interfaces (`posttrain_common/contracts/activities.py`),
never their code, and import only the layers below (tests/test_layers.py checks it).
"""
