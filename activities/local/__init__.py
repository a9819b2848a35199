"""The local jobs backend's parts (`activities/local/backend.py` puts them behind `JobsBackend`):

hub.py         base models and datasets by repo id and content-hash revision
plan.py        what a job runs: files, phases (bwrap command lines), environments
sandbox.py     the bubblewrap command line of one phase
store.py       job folders: create and start, read state, reconcile, cancel
jobfiles.py    the files of a job folder, process identity, usage, the artifact (stdlib)
job_runner.py  the detached supervisor of one job (stdlib)
"""
