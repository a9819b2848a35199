"""Evaluation campaigns as a user writes them and as they are recorded, pure (no Temporal).

spec.py           a campaign spec (TOML): tasks x agents x epochs, concurrency, the dollar budget
records.py        what every finished attempt leaves in the campaign's folder, nothing secret
retry.py          which rollouts `campaign retry` runs again, and a finished campaign's counters

The campaign and rollout workflows, their activities, the CLI and the report
(`posttrain_server/campaigns/`) all import these.
"""
