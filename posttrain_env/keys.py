"""Per-job nonces and per-episode secrets, derived from one server key inside activities.

Nothing derived here is ever returned to a workflow: workflow state and history hold no
capability or secret (DESIGN §9). The key lives in a 0600 file under the state dir.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path


class ServerKey:
    def __init__(self, key: bytes) -> None:
        if len(key) < 32:
            raise ValueError("the server key must be at least 32 bytes")
        self._key = key

    @classmethod
    def load_or_create(cls, path: Path) -> ServerKey:
        """Read the key file, creating it (0600, 32 random bytes) on first use."""
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return cls(path.read_bytes())
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(32))
        return cls(path.read_bytes())

    def _derive(self, purpose: str, subject: str) -> str:
        return hmac.new(self._key, f"{purpose}\0{subject}".encode(), hashlib.sha256).hexdigest()

    def job_nonce(self, job_key: str) -> str:
        """The nonce of trusted log lines for the job whose workflow id is `job_key`."""
        return self._derive("job-nonce", job_key)[:32]

    def hidden_split_seed(self, episode_id: str) -> str:
        """The grader's only secret: which examples form the episode's hidden split."""
        return self._derive("hidden-split-seed", episode_id)[:32]

    def session_tag(self, nonce: str) -> str:
        """The tag that makes `nonce` a session id this deployment minted (128 bits)."""
        return self._derive("session-id", nonce)[:32]

    def episode_token(self, episode_id: str) -> str:
        """The bearer capability of an episode's MCP endpoint (128+ bits, recomputable)."""
        return self._derive("episode-token", episode_id)
