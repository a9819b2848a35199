"""Per-job nonces and per-episode secrets, derived from one server key inside activities.

Nothing derived here is ever returned to a workflow: workflow state and history hold no
capability or secret (DESIGN §9). Every process of one deployment holds the same key
(docs/security.md,
"One key per deployment"): given as a file (`POSTTRAIN_SERVER_KEY_FILE`) or as hex in the
environment (`POSTTRAIN_SERVER_KEY`), or, for a deployment on its embedded Temporal, a 0600 file
under the state dir created on first use. No error message, repr or log line carries the key.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

MIN_KEY_BYTES = 32
KEY_FILE_SETTING = "POSTTRAIN_SERVER_KEY_FILE"
KEY_HEX_SETTING = "POSTTRAIN_SERVER_KEY"
# 64 bits of the fingerprint: enough that two keys never pass for one, and it says nothing of
# the key (an HMAC under it, not a hash of it).
FINGERPRINT_HEX_CHARS = 16


class ServerKeyError(ValueError):
    """A server key that cannot be used. The message names the setting and what to fix, never
    the key."""


class ServerKey:
    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"the server key must be at least {MIN_KEY_BYTES} bytes")
        self._key = key

    def __repr__(self) -> str:
        return f"ServerKey(fingerprint={self.fingerprint()!r})"

    @classmethod
    def load_or_create(cls, path: Path) -> ServerKey:
        """Read the key file, creating it (0600, 32 random bytes) on first use."""
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return cls(path.read_bytes())
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(MIN_KEY_BYTES))
        return cls(path.read_bytes())

    @classmethod
    def from_file(cls, path: Path, setting: str = KEY_FILE_SETTING) -> ServerKey:
        """A key file given by an operator: the bytes `load_or_create` writes (at least 32, any
        values), in a regular file that only its owner may read or write (as ssh insists of a
        private key: a key readable by another user lets that user mint sessions and forge
        score lines). Raises ServerKeyError naming `setting`."""
        try:
            info = path.stat()  # follows links: a mounted secret is often a link to its file
        except FileNotFoundError:
            raise ServerKeyError(f"{setting}={path}: no such file") from None
        except OSError as exc:
            raise ServerKeyError(f"{setting}={path}: cannot be read ({exc.strerror})") from None
        if not stat.S_ISREG(info.st_mode):
            raise ServerKeyError(f"{setting}={path}: not a regular file")
        if info.st_mode & 0o077:
            raise ServerKeyError(
                f"{setting}={path}: its mode is {stat.filemode(info.st_mode)}, so other users "
                f"may read or change it; make it readable by its owner only (chmod 600 {path}), "
                f"or give the key as hex in {KEY_HEX_SETTING} where the platform mounts secrets "
                "readable by all"
            )
        try:
            key = path.read_bytes()
        except OSError as exc:
            raise ServerKeyError(f"{setting}={path}: cannot be read ({exc.strerror})") from None
        if len(key) < MIN_KEY_BYTES:
            raise ServerKeyError(
                f"{setting}={path}: holds {len(key)} bytes; a key has at least {MIN_KEY_BYTES} "
                f"(make one with `posttrain-env key new {path}`)"
            )
        return cls(key)

    @classmethod
    def from_hex(cls, text: str, setting: str = KEY_HEX_SETTING) -> ServerKey:
        """A key given as hex (at least 64 digits: 32 bytes). Raises ServerKeyError naming
        `setting`, never quoting the value."""
        try:
            key = binascii.unhexlify(text.strip())
        except (binascii.Error, ValueError):
            raise ServerKeyError(
                f"{setting} is not hexadecimal: give the key as hex digits "
                f"(e.g. `python -c 'import secrets; print(secrets.token_hex({MIN_KEY_BYTES}))'`)"
            ) from None
        if len(key) < MIN_KEY_BYTES:
            raise ServerKeyError(
                f"{setting} holds {len(key)} bytes; a key has at least {MIN_KEY_BYTES} "
                f"({2 * MIN_KEY_BYTES} hex digits)"
            )
        return cls(key)

    def _derive(self, purpose: str, subject: str) -> str:
        return hmac.new(self._key, f"{purpose}\0{subject}".encode(), hashlib.sha256).hexdigest()

    def fingerprint(self) -> str:
        """A public name of this key: equal for equal keys, and nothing can be learnt of the key
        from it. Recorded on the deployment's workflow so that every process can check that it
        holds the deployment's key."""
        return self._derive("deployment-fingerprint", "")[:FINGERPRINT_HEX_CHARS]

    def deployment_label(self) -> str:
        """This deployment's label value on Hugging Face jobs (activities/backends/hf/labels.py).
        Computed
        exactly as it always was, so jobs labelled before stay this deployment's."""
        digest = hashlib.sha256(b"posttrain-deployment\0" + self._key).hexdigest()
        return "d" + digest[:24]

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


def write_new_key(path: Path) -> ServerKey:
    """A new random key in a new 0600 file at `path` (never over an existing file: a key in use
    would be lost). Raises ServerKeyError."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ServerKeyError(f"{path} exists already: a key is never overwritten") from None
    except OSError as exc:
        raise ServerKeyError(f"{path}: cannot be created ({exc.strerror})") from None
    key = secrets.token_bytes(MIN_KEY_BYTES)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key)
    return ServerKey(key)
