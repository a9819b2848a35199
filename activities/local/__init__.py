"""The local jobs backend's parts: the job folder on disk, the bubblewrap command, the supervisor
process of one job, and the local hub of models and datasets (`activities/local_backend.py` puts
them together behind `JobsBackend`)."""
