"""The contamination check's input and result (pure; docs/tasks.md, "Contamination check").

The check's result crosses Temporal once, as an activity result the episode keeps for its
audit record: `summary` is what the agent sees (`episode_end.contamination`, counts only);
`evidence` may quote test items and goes to the audit record only. It is bounded by
construction (MAX_CONTAMINATION_* in `posttrain_env/limits.py`): at most that many matches,
places per match and characters per snippet, and the sources scanned counted, not listed
beyond a cap.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from posttrain_env.limits import cut_text
from posttrain_env.models import ContaminationSpec, ContaminationSummary

# Sources named in the evidence, at most (more are counted in `sources_unlisted`).
MAX_LISTED_SOURCES = 64


class CheckContamination(BaseModel):
    """The check's input: the episode (its scripts and mounted datasets are read from its own
    history, so no script crosses Temporal again) and the task's declaration, as the episode
    started with it."""

    episode_id: str
    task_id: str
    family: str | None = None  # the folder holding the test items, when not the task's own
    spec: ContaminationSpec


class ContaminationSource(BaseModel):
    """One thing scanned: `script:<sha256>`, `dataset:<repo_id>@<revision>` or
    `outputs:<job_id>` (what an agent job left under /data/outputs/)."""

    where: str
    bytes_read: int = 0  # as scanned: a compressed file counts decompressed
    cut: bool = False  # not read to its end (a byte or file cap, or the check's time)
    error: str | None = None  # why it could not be read (it then counts as not scanned)
    # Files scanned only as raw bytes in a format that usually hides its text, by format
    # (`parquet`: compressed pages; `zip`; a second layer of compression): see
    # `activities/contamination/dataset_bytes.py`.
    opaque_files: dict[str, int] = Field(default_factory=dict)

    @property
    def unread(self) -> bool:
        """Something of this source was not scanned (cut, or not read at all)."""
        return self.cut or self.error is not None


class ContaminationMatch(BaseModel):
    """A test item found: how much of it, where, and the first n-gram found (normalized)."""

    item_id: str
    found_ngrams: int
    item_ngrams: int
    places: list[str] = Field(default_factory=list)  # `script:…` / `dataset:…/<path>`
    snippet: str = ""


class ContaminationEvidence(BaseModel):
    """The audit record's part: what was looked for, where, and what was found."""

    test_items: str  # the task's file, relative to its folder
    items: int  # test items checked (items with no word are not counted)
    ngram: int
    threshold: float
    sources: list[ContaminationSource] = Field(default_factory=list)
    sources_unlisted: int = 0
    matches: list[ContaminationMatch] = Field(default_factory=list)
    matches_unlisted: int = 0
    error: str | None = None  # why the check could not run (summary: `check_failed`)


class ContaminationReport(BaseModel):
    summary: ContaminationSummary
    evidence: ContaminationEvidence | None = None


def skipped_generated() -> ContaminationReport:
    """A task whose hidden split is generated inside the grader: nothing to look for."""
    return ContaminationReport(
        summary=ContaminationSummary(checked=False, skipped="hidden_split_generated")
    )


def check_failed(spec: ContaminationSpec, why: str) -> ContaminationReport:
    """The check could not run: reported as such, and the reward stands (nothing was shown)."""
    return ContaminationReport(
        summary=ContaminationSummary(checked=False, skipped="check_failed"),
        evidence=ContaminationEvidence(
            test_items=spec.test_items or "",
            items=0,
            ngram=spec.ngram,
            threshold=spec.threshold,
            error=cut_text(why),
        ),
    )


def unchecked(spec: ContaminationSpec, why: str) -> ContaminationReport:
    """The task's test items are not on this deployment and its operator accepts unchecked
    rewards (POSTTRAIN_ACCEPT_UNCHECKED_REWARDS): nothing was looked for, the reward stands,
    and every report says so."""
    return ContaminationReport(
        summary=ContaminationSummary(checked=False, skipped="unchecked"),
        evidence=ContaminationEvidence(
            test_items=spec.test_items or "",
            items=0,
            ngram=spec.ngram,
            threshold=spec.threshold,
            error=cut_text(why),
        ),
    )


def reward_under_policy(reward: float, summary: ContaminationSummary) -> float:
    """The reward once the task's policy has spoken: 0 for a flagged episode under
    `zero_reward`; otherwise as the grader scored it."""
    if summary.flagged and summary.policy == "zero_reward":
        return 0.0
    return reward
