"""Layer 2, activities: every side effect, behind interfaces, touching the world and nothing else.

Episodes and jobs
jobs.py               start, watch, cancel and read jobs (implements `contracts.activities.JobsApi`)
episodes.py           set episodes up, the server-wide spend cap (`EpisodesApi`)
audit.py              an ended episode's audit record, read from its history (`AuditApi`)
contamination.py      the grader-side contamination check (`ContaminationApi`);
                      contamination_scan.py, dataset_bytes.py: its n-gram scan and bounded reads
launcher_report.py    what the launcher's nonce-bearing lines say about a job (pure)
retention.py          the retention sweep (`RetentionApi`); retention_plan.py: what it deletes
storage.py            where a backend keeps its jobs' folders (their sizes; deleting them)

Campaigns
campaigns.py          plan a campaign, keep its records, send a rollout's calls (`CampaignsApi`)
campaign_store.py     a campaign's folder: conversations, agent turns, records
agent_turns.py        agent turns in processes of their own, on the agent worker only (`AgentsApi`)

Backends (one folder each; a backend imports none of the others)
backend.py            the one interface every jobs backend implements (`JobsBackend`)
fake/                 the scriptable, file-backed backend (development and tests)
local/                jobs on this machine in bubblewrap sandboxes (the embedded default)
hf/                   Hugging Face Jobs (paid), and the orphan reaper's activities
ports.py              what an activity asks of other workflows, implemented by the worker's wiring

No module here imports `workflows/` (tests/test_layers.py checks it): a call to another workflow
goes through `ports.py`, and every such call is listed in `posttrain_server/wiring.py`.
A backend takes plain configuration; building it from settings is the wiring's.
"""
