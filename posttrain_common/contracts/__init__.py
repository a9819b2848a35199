"""What the layers say to each other, as pure pydantic models, and the activities' interfaces.
Workflows import these, never the activities; activities implement them, never importing
workflows; the gateway speaks the episode's contract without loading either (DESIGN §10).

activities.py     the activities' interfaces, as workflows call them (`execute_activity_method`)
episode_calls.py  what the gateway, a session and a rollout say to an episode, what it answers
episodes.py       an episode's set-up, prepared at reset (no secret in here)
jobs.py           jobs as the episode and the backends speak of them (no secret in here)
audit.py          an episode's audit record (and `audit.schema.json`, its JSON Schema)
contamination.py  the contamination check's input and result
campaigns.py      what the campaign and rollout workflows say to their activities
retention.py      retention of job folders: the policy and the sweep's result

A field added later gets a default, so that recorded histories and carried state still decode.
"""
