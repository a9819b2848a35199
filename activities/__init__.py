"""Activities: every side effect, behind interfaces, touching the world and nothing else.

jobs.py        start, watch, cancel and read jobs (implements `contracts.activities.JobsApi`)
episodes.py    set episodes up, the server-wide spend cap (`EpisodesApi`)
backend.py     the one interface every jobs backend implements (`JobsBackend`)
ports.py       what an activity asks of other workflows, implemented by the worker's wiring
fake/          the scriptable, file-backed backend (development and tests)
local/         jobs on this machine in bubblewrap sandboxes (the embedded default)
hf/            Hugging Face Jobs (paid), and the orphan reaper's activities

No module here imports `workflows/` (a test checks it): a call to another workflow goes through
`ports.py`, and every such call is listed in `posttrain_env/entrypoints/wiring.py`.
"""
