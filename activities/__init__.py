"""Layer 3, activities: every side effect, behind interfaces, touching the world and nothing else.

One folder per feature; each activity class implements its interface in
`posttrain_common/contracts/activities.py`, which is what workflows call.

backends/       the one `JobsBackend` interface (interface.py), the registry of backends
                (registry.py) and one folder per backend: fake/, local/, hf/; each declares
                itself in its info.py (name, capabilities, how to build it) and imports none
                of the others
jobs/           start, watch, cancel and read jobs (`JobsApi`); what the launcher's trusted lines
                say (launcher_report.py); the orphan reaper (`ReaperApi`, reaper.py)
episodes/       set episodes up, the server-wide caps (`EpisodesApi`)
campaigns/      plan campaigns, keep their folders (store.py), send a rollout's calls
                (`CampaignsApi`); agent turns, on the agent worker only (agent_turns.py)
contamination/  the grader-side contamination check (`ContaminationApi`): its n-gram scan
                (scan.py) and bounded dataset reads (dataset_bytes.py)
records/        an ended episode's audit record (`AuditApi`), retention of job folders
                (`RetentionApi`, retention_plan.py: what it deletes, pure)
heartbeat.py    heartbeats for activities that wait on another service
ports.py        what an activity asks of other workflows, implemented by the worker's wiring

No module here imports `workflows/` (tests/test_layers.py checks it): a call to another workflow
goes through `ports.py`, and every such call is listed in `posttrain_server/wiring.py`.
"""
