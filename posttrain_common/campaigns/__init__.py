"""Ground: evaluation campaigns as a user writes and reads them, pure (no Temporal, no server).

spec.py           a campaign spec (TOML): tasks x agents x epochs, concurrency, the dollar budget
records.py        what every finished attempt leaves in the campaign's folder, nothing secret
retry.py          which rollouts `campaign retry` runs again, and a finished campaign's counters
report.py         a campaign's numbers, from its records only
report_files.py, plots.py  the report written out: CSV, PNG plots (matplotlib Agg), Markdown

The CLI, the campaign and rollout workflows, the activities and a report all import these.
"""
