"""What the replay backend records of one job, and the key it finds it by (pure).

The key is a SHA-256 of the canonical JSON of `JobInputs`: what decides a job's outcome and
crosses no secret. In it, and why:

- `role` and `task_id`: an agent job, a dev evaluation and the grader of the same artifact are
  different runs; the task fixes the evaluator's parameters and, with the base model, what a
  script trains.
- `script_sha256`: the agent's script (an evaluation's: the task's evaluator script, helpers
  embedded, as the job receives it).
- `dependencies` (sorted: the resolver does not depend on their order), `flavor` (the hardware
  decides the running time, hence the cost), `datasets` (each repo at its resolved commit) and
  the `base_model` at its resolved commit.
- `task_params` (evaluations): the task's `[evaluation]` table, as the evaluator reads it.
- `evaluated` (evaluations): the key of the agent job whose outputs are mounted at /model, so a
  recorded score belongs to the artifact of one script and its inputs, never to a job id.

Left out on purpose: job ids, workflow ids, the nonce and the grader's hidden-split seed (they
differ in every episode by design; a replayed grading is the recorded run's seed's), and the
job's timeout (a replay ends at the request's timeout when the recorded run ran longer; a run
that timed out is replayed only under a timeout no longer than the one it met).
"""

from __future__ import annotations

import difflib
import hashlib
import json
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from posttrain_common.contracts.jobs import JobRole, RepoRef
from posttrain_env.limits import KIB, MAX_LOG_LINE_BYTES, MAX_LOG_TAIL, MIB

RECORDING_FORMAT = 1
# A recording's size as stored (JSON, UTF-8): a script of at most 256 KiB and the end of the
# job's log fit; a file larger than this is refused on write and on read.
MAX_RECORDING_BYTES = 1 * MIB
# The end of a job's log that is kept: as many lines as `jobs_logs` can ever show, each cut as
# it would be shown.
MAX_RECORDED_LINES = MAX_LOG_TAIL
MAX_RECORDED_LINE_BYTES = MAX_LOG_LINE_BYTES
# How many recorded keys a `not_recorded` answer names.
NEAREST_KEYS = 3
# Scripts compared line by line for the nearest keys: longer scripts are compared on this prefix.
SIMILARITY_PREFIX_BYTES = 64 * KIB
# Where a trusted line's nonce was (the recorded job's own, never kept): at replay, the
# replaying job's nonce takes its place on the lines listed in `Recording.trusted` only.
NONCE_PLACEHOLDER = "<nonce>"


class JobInputs(BaseModel):
    """What a job's recording key hashes (module docstring: what is in it, and why)."""

    role: JobRole
    task_id: str
    script_sha256: str
    dependencies: list[str] = Field(default_factory=list)
    flavor: str
    datasets: list[RepoRef] = Field(default_factory=list)
    base_model: RepoRef
    task_params: str = ""
    evaluated: str | None = None

    def canonical(self) -> JobInputs:
        return self.model_copy(
            update={
                "dependencies": sorted(self.dependencies),
                "datasets": sorted(self.datasets, key=lambda d: (d.repo_id, d.revision)),
            }
        )

    def key(self) -> str:
        body = self.canonical().model_dump(mode="json")
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(f"replay-v{RECORDING_FORMAT}:{text}".encode()).hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


RecordedState = Literal["succeeded", "failed", "timed_out"]


class Recording(BaseModel):
    """One job's recorded outcome (stored as `<store>/recordings/<key>.json`)."""

    format: Literal[1] = RECORDING_FORMAT
    key: str
    inputs: JobInputs
    script: str = ""  # an agent job's script (for the nearest keys); "" for evaluations
    # How it ended. Cancelled and lost jobs are never recorded: they say nothing of the script.
    state: RecordedState
    queue_s: float = Field(ge=0)
    running_s: float = Field(ge=0)  # the billed running time
    timeout_s: int = Field(gt=0)  # the timeout the recorded run had
    message: str = ""
    # The end of its log; the lines at `trusted` carried the job's nonce (now NONCE_PLACEHOLDER).
    lines: list[str] = Field(default_factory=list)
    trusted: list[int] = Field(default_factory=list)
    # True when the log was not recorded (built from an audit record) and `lines` were written
    # from what the record says (an evaluation's score line).
    log_synthesized: bool = False
    artifact_bytes: int | None = None
    source: str  # where it came from: "fall-through:<backend>" or "audit:<episode>/<job>"
    recorded_at: datetime


class RecordingTooLarge(ValueError):
    """A recording over MAX_RECORDING_BYTES."""


def bounded_log(lines: list[str], nonce: str) -> tuple[list[str], list[int]]:
    """The end of a job's log as recorded: its last MAX_RECORDED_LINES lines, each cut to
    MAX_RECORDED_LINE_BYTES, the job's nonce replaced; and the indexes of the lines that held
    it (its trusted lines)."""
    kept: list[str] = []
    trusted: list[int] = []
    for line in lines[-MAX_RECORDED_LINES:]:
        if nonce and nonce in line:
            trusted.append(len(kept))
            line = line.replace(nonce, NONCE_PLACEHOLDER)
        raw = line.encode()
        if len(raw) > MAX_RECORDED_LINE_BYTES:
            line = raw[:MAX_RECORDED_LINE_BYTES].decode(errors="ignore")
        kept.append(line)
    return kept, trusted


def fit(recording: Recording) -> bytes:
    """The recording as stored, its log's oldest lines dropped until it fits
    MAX_RECORDING_BYTES. Raises RecordingTooLarge when even without a log it does not."""
    while True:
        data = recording.model_dump_json().encode()
        if len(data) <= MAX_RECORDING_BYTES:
            return data
        if not recording.lines:
            raise RecordingTooLarge(
                f"a recording of {len(data)} bytes without its log is over the limit of "
                f"{MAX_RECORDING_BYTES} bytes"
            )
        drop = max(1, len(recording.lines) // 4)
        recording = recording.model_copy(
            update={
                "lines": recording.lines[drop:],
                "trusted": [i - drop for i in recording.trusted if i >= drop],
            }
        )


def replayed_lines(recording: Recording, nonce: str) -> list[str]:
    """The recorded log as the replaying job prints it: its trusted lines with its own nonce."""
    trusted = set(recording.trusted)
    return [
        line.replace(NONCE_PLACEHOLDER, nonce) if i in trusted else line
        for i, line in enumerate(recording.lines)
    ]


class NearKey(BaseModel):
    """A recorded key close to a job that was not recorded, and how its inputs differ."""

    key: str
    similarity: float  # of the scripts, 0..1 (1.0: the same script)
    differs: list[str]  # the JobInputs fields that differ


def nearest(
    inputs: JobInputs, script: str, recorded: list[tuple[JobInputs, str]], count: int
) -> list[NearKey]:
    """The `count` recordings of the same role closest to `inputs`: most similar script first,
    then fewest differing inputs."""
    mine = inputs.canonical().model_dump(mode="json")
    lines = _lines(script)
    near: list[NearKey] = []
    for other, other_script in recorded:
        if other.role is not inputs.role:
            continue
        theirs = other.canonical().model_dump(mode="json")
        differs = sorted(field for field in mine if mine[field] != theirs.get(field))
        if "script_sha256" not in differs:
            similarity = 1.0
        elif inputs.role is JobRole.agent:
            matcher = difflib.SequenceMatcher(None, lines, _lines(other_script), autojunk=False)
            similarity = round(matcher.ratio(), 4)
        else:
            similarity = 0.0  # another evaluator script: nothing to compare
        near.append(NearKey(key=other.key(), similarity=similarity, differs=differs))
    near.sort(key=lambda n: (-n.similarity, len(n.differs), n.key))
    return near[:count]


def _lines(script: str) -> list[str]:
    return script.encode()[:SIMILARITY_PREFIX_BYTES].decode(errors="ignore").splitlines()
