"""Layer 1, the server's ground: what every layer of the service shares, pure or nearly so.

contracts/      what the layers say to each other (pydantic models) and the activities'
                interfaces: workflows import these, never the activities
campaigns/      campaigns as a user writes them (spec) and as they are recorded (records, retry)
failures.py     the client's errors as Temporal failures and back; what Temporal's errors mean
keys.py         the deployment's server key and what is derived from it (nonces, tokens, ids)
settings.py     the server's settings, read once from the environment (never by agents)
pip_config.py   this machine's pip `find-links` (read only)
version.py      the service's installed version, as servers report it

Imports nothing of the project but the client's contract (`posttrain_env`); every other layer
of the service may import it (tests/test_layers.py checks the whole graph).
"""
