"""Evaluation campaigns as a user writes and reads them: the spec (`spec.py`) and the records
every finished attempt leaves in the campaign's folder (`records.py`). Pure: the CLI, the
workflows, the activities and a report all import these."""
