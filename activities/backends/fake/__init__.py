"""The fake jobs backend (development and tests): `backend.py`, file-backed and scriptable."""
