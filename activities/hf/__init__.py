"""Pieces of the Hugging Face Jobs backend (`activities/hf/backend.py`), one purpose per module:

labels      the labels every job carries (deployment, episode, idempotency key) and the backend ref
stages      a `JobInfo` as a `BackendJob`: stage mapping and running time
prices      `list_jobs_hardware` prices with a TTL cache
inputs      repo id checks and dataset/model resolution without the broker's token
errors      Hub errors as `TransientBackendError` (retried) or `ToolError(hf_error)` (not)
submission  what `run_uv_job` is called with, and the security checks on it
artifacts   `/model` for an evaluation: the evaluated job's outputs, capped, read-only
reaper      activities of the orphan reaper and its Temporal Schedule
"""
