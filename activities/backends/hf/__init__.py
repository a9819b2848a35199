"""Pieces of the Hugging Face Jobs backend (`activities/backends/hf/backend.py`), one purpose per
module:

labels      the labels every job carries (deployment, episode, idempotency key), the client-side
            label check, and the backend ref (namespace, job id, artifacts folder)
stages      a `JobInfo` as a `BackendJob`: stage mapping, running time, the billing rule
missing     when a job the Hub answers 404 for counts as vanished (settled at its worst case)
http        bounded HTTP under every Hub call (huggingface_hub's client factory), no library
            retries, every socket wait cut at the call's deadline
calls       the one way the backend calls the sync Hub client: own threads, a deadline per call
attempt_clock  when the worker began each activity attempt (the deadlines count from it)
namespaces  the namespaces this deployment has jobs in, noted for the orphan reaper
prices      `list_jobs_hardware` prices with a TTL cache
inputs      repo id checks and dataset/model resolution without the broker's token
errors      Hub errors as `HubTransientError` (retried by Temporal, after the Hub's own wait) or
            `ToolError(hf_error)` (not retried), naming what to fix
submission  what `run_uv_job` is called with, and the security checks on it
artifacts   `/model` for an evaluation: the evaluated job's outputs, capped, read-only
factory     the backend built from the settings: the broker's token goes into one HfApi
"""
