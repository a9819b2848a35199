"""The local jobs backend's parts (`activities/backends/local/backend.py` puts them behind
`JobsBackend`):

hub.py         base models and datasets by repo id and content-hash revision
plan.py        what a job runs: files, phases (bwrap command lines), environments
sandbox.py     the bubblewrap command line of one phase
store.py       job folders: create and start, read state, reconcile, cancel
jobfiles.py    the files of a job folder, process identity, usage, the artifact (stdlib)
job_runner.py  the detached supervisor of one job (stdlib)
resources.py   what one job may use, by flavor, scaled to this machine (stdlib)
containment.py what holds each limit on this host (control groups, a filesystem, stand-ins)
cgroups.py     the control groups of the jobs and of each job (stdlib)
scratch.py     each job's filesystems, and removing trees of any depth (stdlib)
factory.py     the backend built from the settings, and what holds its limits on this host
"""
