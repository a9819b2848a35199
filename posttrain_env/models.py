"""The public contract: tool arguments and results, errors, spend and episode end.

Defined once here and imported by the gateway, the workflows and the client alike. This module
is pure (pydantic and the standard library only) so that workflow code may import it.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from posttrain_env.errors import ErrorType
from posttrain_env.limits import (
    DEFAULT_JOBS_PAGE,
    DEFAULT_LOG_TAIL,
    DEFAULT_WAIT_TIMEOUT_S,
    MAX_CURSOR_CHARS,
    MAX_DATASETS,
    MAX_DEPENDENCIES,
    MAX_FLAVOR_CHARS,
    MAX_JOB_ID_CHARS,
    MAX_JOBS_PAGE,
    MAX_LOG_TAIL,
    MAX_REPO_ID_CHARS,
    MAX_REQUIREMENT_CHARS,
    MAX_SCRIPT_BYTES,
    MAX_STEPS,
    MAX_WAIT_TIMEOUT_S,
    cut_text,
)

# Text that a job, an agent or an artifact controls, cut where it enters the system.
BoundedText = Annotated[str, AfterValidator(cut_text)]

MICRO = 1_000_000


def usd(micro_usd: int) -> float:
    """Micro-USD (the ledger's unit) as a float of USD, for the edge only."""
    return micro_usd / MICRO


# ---------------------------------------------------------------------------------------------
# Tool arguments
# ---------------------------------------------------------------------------------------------


class ToolArgs(BaseModel):
    """Base of every tool's arguments: unknown keys refused, each field mapped to an error type."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # Which error type a failure on a field is reported as; anything else is invalid_argument.
    field_error_types: ClassVar[dict[str, ErrorType]] = {}


class NoArgs(ToolArgs):
    pass


class JobsSubmitArgs(ToolArgs):
    script: str = Field(description="The Python training script (UTF-8, at most 256 KiB).")
    flavor: str = Field(
        max_length=MAX_FLAVOR_CHARS, description="Hardware flavor, one of task_info's flavors."
    )
    timeout_minutes: int = Field(gt=0, description="Hard time limit; the budget reserves it.")
    dependencies: list[Annotated[str, Field(max_length=MAX_REQUIREMENT_CHARS)]] = Field(
        default_factory=list,
        max_length=MAX_DEPENDENCIES,
        description="PyPI requirement strings (names, extras, versions, markers); wheels only.",
    )
    datasets: list[Annotated[str, Field(max_length=MAX_REPO_ID_CHARS)]] = Field(
        default_factory=list,
        max_length=MAX_DATASETS,
        description="Public Hugging Face dataset repo ids, mounted at /datasets/<repo_id>.",
    )

    field_error_types: ClassVar[dict[str, ErrorType]] = {
        "script": ErrorType.invalid_script,
        "flavor": ErrorType.flavor_not_allowed,
        "timeout_minutes": ErrorType.timeout_not_allowed,
        "dependencies": ErrorType.invalid_dependency,
        "datasets": ErrorType.dataset_not_allowed,
    }

    @field_validator("script")
    @classmethod
    def _script_size(cls, script: str) -> str:
        size = len(script.encode("utf-8", errors="surrogatepass"))
        if size > MAX_SCRIPT_BYTES:
            raise ValueError(f"the script is {size} bytes; the limit is {MAX_SCRIPT_BYTES}")
        return script


class JobIdArgs(ToolArgs):
    job_id: str = Field(
        max_length=MAX_JOB_ID_CHARS, description="A job id returned by jobs_submit (job-<12 hex>)."
    )


class JobsWaitArgs(JobIdArgs):
    timeout_s: int = Field(
        default=DEFAULT_WAIT_TIMEOUT_S,
        ge=0,
        le=MAX_WAIT_TIMEOUT_S,
        description="Return at the job's next state change or after this many seconds.",
    )


class JobsStatusArgs(ToolArgs):
    job_id: str | None = Field(
        default=None,
        max_length=MAX_JOB_ID_CHARS,
        description="One job; when omitted, a page of the episode's jobs, oldest first.",
    )
    limit: int = Field(
        default=DEFAULT_JOBS_PAGE,
        ge=1,
        le=MAX_JOBS_PAGE,
        description="Without job_id: how many jobs one page holds at most.",
    )
    cursor: str | None = Field(
        default=None,
        max_length=MAX_CURSOR_CHARS,
        description="Without job_id: the `next_cursor` of the previous page (omit for the first).",
    )

    @model_validator(mode="after")
    def _one_job_or_a_page(self) -> JobsStatusArgs:
        if self.job_id is not None and self.cursor is not None:
            raise ValueError("pass either job_id (one job) or cursor (the next page), not both")
        return self


class JobsLogsArgs(JobIdArgs):
    tail: int = Field(
        default=DEFAULT_LOG_TAIL, ge=1, le=MAX_LOG_TAIL, description="Last lines to return."
    )


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


class JobState(enum.StrEnum):
    queued = "queued"
    running = "running"
    cancelling = "cancelling"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    timed_out = "timed_out"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {JobState.succeeded, JobState.failed, JobState.cancelled, JobState.timed_out}
)


class JobView(BaseModel):
    """What the agent sees of one of its jobs."""

    job_id: str
    state: JobState
    flavor: str
    timeout_minutes: int
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    running_s: float = 0.0
    reserved_usd: float = 0.0
    cost_usd: float = 0.0
    overrun_usd: float | None = None
    # True when the backend lost the job and its cost is the whole reservation, a worst case.
    settled_at_worst_case: bool | None = None
    # True when the job never ran: its outcome (running time, cost, score) was replayed from a
    # recording by the replay backend (docs/training.md). None: it ran.
    replayed: bool | None = None
    # What the job's sandbox allowed its script, once it has ended: TCP between its own
    # processes on 127.0.0.1/::1 (True: torch.distributed, DDP, vLLM work), or AF_UNIX sockets
    # only (False, with `loopback_reason`: the platform refused what the policy needs). None:
    # not known yet.
    loopback_tcp: bool | None = None
    loopback_reason: str | None = None
    artifact: str | None = None
    # An agent job that ended: the bytes its artifact keeps against the episode's storage cap
    # (apparent sizes). None while it runs, and for jobs whose backend did not say.
    stored_bytes: int | None = None
    # Its outputs were not kept (over a cap, or what an artifact cannot hold): the typed error
    # (`{"type", "message"}`, with `cap`, `cap_bytes` and `over_by_bytes` for a cap) that
    # `dev_evaluate` and `submit` answer for this job.
    outputs_error: dict[str, Any] | None = None
    message: str = ""


class SettledSpend(BaseModel):
    usd: float = 0.0
    gpu_s: float = 0.0
    jobs: int = 0
    calls: int = 0


class ReservedSpend(BaseModel):
    usd: float = 0.0


class ReplayedSpend(BaseModel):
    """The part of the settled spend whose jobs never ran: their outcomes were replayed from
    recordings of earlier runs (the replay backend), at the cost those runs were billed."""

    usd: float = 0.0
    jobs: int = 0  # replayed agent jobs among `settled.jobs`
    calls: int = 0  # replayed dev evaluations among `settled.calls`


class StorageSpend(BaseModel):
    """What the episode's artifacts hold against its storage cap, and what they cost. Bytes
    are apparent sizes (what uploading or mounting them costs)."""

    bytes: int = 0  # kept by the artifacts of its ended agent jobs
    reserved_bytes: int = 0  # held for its live agent jobs: what each may still keep
    cap_bytes: int | None = None  # None: no cap (an episode started before storage counted)
    usd: float = 0.0  # the storage part of `settled.usd` (charged when each job ended)


class ServiceSpend(BaseModel):
    """The episode's spend, on every observation (DESIGN §4). Version 2 added `storage`;
    `settled.usd` and `reserved.usd` include the storage charged and held."""

    version: Literal[1, 2] = 2
    settled: SettledSpend = Field(default_factory=SettledSpend)
    reserved: ReservedSpend = Field(default_factory=ReservedSpend)
    storage: StorageSpend = Field(default_factory=StorageSpend)
    final: bool = True
    # Present only when some settled job was replayed (never on a backend that runs its jobs).
    replayed: ReplayedSpend | None = None

    @model_serializer(mode="wrap")
    def _without_absent_replay(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("replayed") is None:
            data.pop("replayed", None)
        return data


class EndReason(enum.StrEnum):
    submitted = "submitted"
    max_steps = "max_steps"
    time_limit = "time_limit"
    score_failed = "score_failed"
    reset = "reset"
    cancelled = "cancelled"
    # An operator ended it: `posttrain-env episodes cancel|end`, or a cancel or terminate of its
    # workflow through Temporal (the UI, `temporal workflow cancel`). Reward None.
    cancelled_by_operator = "cancelled_by_operator"
    # A rollout's agent stopped without submitting (or ran out of turns or of its LLM budget):
    # reward 0, as for the other limits. Only the grader's failure gives reward None.
    abandoned = "abandoned"
    # The replay backend (a stand-in service) had no recorded outcome for the evaluation a
    # `submit` or a `dev_evaluate` asked for (an evaluator or a tasks folder that drifted from
    # the recording): reward None, and not a measurement. Never the grader's fault
    # (`score_failed`). `episode_end.replay_miss` names the key and the nearest recorded ones.
    replay_miss = "replay_miss"


# What a task does when its test items are found in what the agent controlled: `report` (the
# reward stands, the counts are shown) or `zero_reward` (a flagged episode's reward is 0). A
# Literal, not an enum: task specs are validated strictly, and TOML gives a string.
ContaminationPolicy = Literal["report", "zero_reward"]


class ContaminationSummary(BaseModel):
    """`episode_end.contamination`: the counts of the grader-side contamination check, all an
    agent ever sees of it (the evidence, which may quote test items, goes to the audit record
    only). Present on an end by `submit` when the task has a `[contamination]` table."""

    checked: bool
    flagged: bool = False
    # The task's policy; "none" when nothing was checked.
    policy: ContaminationPolicy | Literal["none"] = "none"
    matched_items: int = 0
    # Why nothing was checked: `hidden_split_generated` (the task's hidden split is generated
    # inside the grader, so there are no test items to find), `check_failed`, or `unchecked`
    # (the task's test items are not on the deployment, whose operator accepts unchecked
    # rewards: POSTTRAIN_ACCEPT_UNCHECKED_REWARDS).
    skipped: str | None = None
    # When checked: how many mounted datasets were not read to their end (cut at a byte cap,
    # not read at all, or unreadable). A count only, never which: 0 means all were read.
    unread_datasets: int | None = None


# How many recorded keys `episode_end.replay_miss` names (the replay backend's NEAREST_KEYS).
MAX_NEAREST_RECORDINGS = 3


class NearRecording(BaseModel):
    """A recorded key close to the one a replay missed, and which of its inputs differ."""

    key: BoundedText
    similarity: float = 0.0  # of the scripts, 0..1 (1.0: the same script)
    differs: list[BoundedText] = Field(default_factory=list, max_length=16)


class ReplayMiss(BaseModel):
    """`episode_end.replay_miss`: the evaluation the replay backend had no recording for."""

    tool: Literal["submit", "dev_evaluate"]
    job_id: BoundedText  # the agent job it would have evaluated
    key: BoundedText | None = None  # the recording key looked for
    nearest: list[NearRecording] = Field(default_factory=list)
    message: BoundedText = ""

    @field_validator("nearest")
    @classmethod
    def _few(cls, nearest: list[NearRecording]) -> list[NearRecording]:
        return nearest[:MAX_NEAREST_RECORDINGS]


class EpisodeEnd(BaseModel):
    reason: EndReason
    reward: float | None = None
    # Set when the score line was missing, repeated or out of range: the reward is then 0. An
    # evaluator's reason: cut where it enters, as every reason is.
    invalid_score: BoundedText | None = None
    contamination: ContaminationSummary | None = None
    # True when some job of the episode was replayed from a recording (the replay backend): the
    # reward was not measured. Absent otherwise.
    replayed: bool | None = None
    # With reason `replay_miss`: what the replay backend missed.
    replay_miss: ReplayMiss | None = None
    # How many of the episode's calls the replay backend answered `not_recorded` (an unseen
    # script at `jobs_submit` included); absent when none was.
    replay_misses: int | None = None

    def view(self) -> dict[str, Any]:
        """As clients see it: `reward` always present (null: no reward), other fields when set."""
        return {**self.model_dump(mode="json", exclude_none=True), "reward": self.reward}


class FlavorPrice(BaseModel):
    """A hardware flavor with its price locked for the episode's reservations."""

    name: str
    micro_usd_per_minute: int = Field(ge=0)
    accelerators: int = Field(default=0, ge=0)
    accelerator: str | None = None

    def view(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "price_per_minute_micro_usd": self.micro_usd_per_minute,
            "price_per_minute_usd": usd(self.micro_usd_per_minute),
            "accelerator": self.accelerator,
            "accelerators": self.accelerators,
        }


# ---------------------------------------------------------------------------------------------
# Task specification (tasks/<task_id>/task.toml)
# ---------------------------------------------------------------------------------------------


EvaluationParam = int | float | str | bool | list[str] | list[int]


class EvaluationDataset(BaseModel):
    """A public dataset mounted read-only at `/datasets/<repo_id>` in the task's evaluation jobs
    (dev and grader), at a pinned commit: the evaluator's own data (e.g. a benchmark's splits),
    never the agent's choice."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    repo_id: str = Field(pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
    revision: str = Field(pattern=r"^[0-9a-f]{40}$")


class BaseModelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    repo_id: str = Field(pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
    # A commit, or a branch/tag that is resolved to a commit once per episode and recorded.
    revision: str = "main"
    # Name of a model of the local hub (a generated tiny model) the local backend uses instead;
    # None: Hugging Face only. `local_revision` is its own revision (or branch, resolved once).
    local: str | None = None
    local_revision: str = "main"


# The contamination check's defaults (docs/tasks.md, "Contamination check"): 13-word n-grams, as in
# GPT-3's and later contamination studies; an item is matched when half its n-grams are found.
DEFAULT_CONTAMINATION_NGRAM = 13
DEFAULT_CONTAMINATION_THRESHOLD = 0.5


class ContaminationSpec(BaseModel):
    """The `[contamination]` table: where the task's test items come from, and what happens
    when they are found in the agent's scripts or mounted datasets.

    Either `hidden_split = "generated"` (the grader generates its hidden items itself; nothing
    to check, the check is skipped), or `test_items`, a JSON Lines file in the task's folder (or
    its family's), one `{"id": ..., "text": ...}` per line, with `policy`, `ngram`, `threshold`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden_split: Literal["public", "generated"] = "public"
    test_items: str | None = None
    policy: ContaminationPolicy = "report"
    # Words per n-gram (after normalization); an item shorter than this is one n-gram.
    ngram: int = Field(default=DEFAULT_CONTAMINATION_NGRAM, ge=1, le=64)
    # The fraction of an item's n-grams that must be found for the item to be matched.
    threshold: float = Field(default=DEFAULT_CONTAMINATION_THRESHOLD, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _items_or_generated(self) -> ContaminationSpec:
        if self.hidden_split == "generated" and self.test_items is not None:
            raise ValueError(
                "a generated hidden split has no test items: set either "
                'hidden_split = "generated" or test_items, not both'
            )
        if self.hidden_split == "public" and self.test_items is None:
            raise ValueError(
                "test_items is required (a JSON Lines file in the task's folder), unless "
                'the hidden split is generated inside the grader (hidden_split = "generated")'
            )
        return self

    @property
    def checks(self) -> bool:
        """True when there are test items to look for."""
        return self.test_items is not None


class TaskSpec(BaseModel):
    """One task: what the agent is asked, what it may use, and its limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_]*$")
    prompt: str = Field(min_length=1)
    base_model: BaseModelSpec
    flavors: list[str] = Field(min_length=1)
    max_timeout_minutes: int = Field(gt=0)
    budget_usd: float = Field(gt=0)
    max_steps: int = Field(default=100, gt=0, le=MAX_STEPS)
    time_limit_s: int = Field(gt=0)
    score_timeout_s: int = Field(gt=0)
    max_concurrent_jobs: int = Field(default=2, gt=0)
    max_dev_evaluations: int = Field(default=5, ge=0)
    eval_flavor: str
    eval_timeout_minutes: int = Field(gt=0)
    # None: the backend's default cap (20 GiB on Hugging Face, 2 GiB local).
    artifact_cap_bytes: int | None = Field(default=None, gt=0)
    # What all of one episode's artifacts may hold together; None: the backend's default
    # (100 GiB on Hugging Face, 8 GiB local; posttrain_env/limits.py, "storage").
    storage_cap_bytes: int | None = Field(default=None, gt=0)
    dataset_denylist: list[str] = Field(default_factory=list)
    # Relative to the task's folder (or to its family's); checked when an evaluation starts.
    evaluator: str = "evaluator.py"
    # The task whose folder holds this task's evaluator (and reference solution): members of a
    # family share them and differ only in their parameters. None: the task's own folder.
    family: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9_]*$")
    # The evaluator's parameters (the `[evaluation]` table), handed to every evaluation job.
    evaluation: dict[str, EvaluationParam] = Field(default_factory=dict)
    # Datasets mounted in every evaluation job (`[[evaluation_datasets]]`), at pinned commits.
    evaluation_datasets: list[EvaluationDataset] = Field(default_factory=list)
    # Where the test items come from, for the grader-side contamination check (the
    # `[contamination]` table). None: the task declares nothing and nothing is checked.
    contamination: ContaminationSpec | None = None

    @property
    def budget_micro_usd(self) -> int:
        # round(), not int(): 0.29 * 1e6 is 289999.99999999994 in binary floating point.
        return round(self.budget_usd * MICRO)

    def limits_view(self, prices: dict[str, FlavorPrice]) -> dict[str, Any]:
        """The reset metadata's `task` block (DESIGN §9)."""
        return {
            "max_steps": self.max_steps,
            "time_limit_s": self.time_limit_s,
            "budget_usd": self.budget_usd,
            "max_timeout_minutes": self.max_timeout_minutes,
            "score_timeout_s": self.score_timeout_s,
            "flavors": [prices[f].view() for f in self.flavors if f in prices],
        }


# Where a call came from. The episode answers every path alike; the path is kept as data (for
# the audit record) and the edge shapes the answer for its transport: the metadata it carries
# (`StepMetadata.view`) and what to do after the end (`worded_for`).
ToolPath = Literal["step", "mcp", "openenv_mcp", "rollout"]


class StepMetadata(BaseModel):
    """Everything an episode reports with an answer. Only the OpenEnv `step` path carries
    `service_spend` and `episode_end` (DESIGN §9); the edge leaves them out elsewhere."""

    episode_id: str
    steps_used: int
    steps_left: int
    time_left_s: float
    prices_simulated: bool = False
    service_spend: ServiceSpend = Field(default_factory=ServiceSpend)
    episode_end: EpisodeEnd | None = None

    def view(self, path: ToolPath) -> dict[str, Any]:
        """What `path` carries: every path the steps and the time left; only `step` the spend
        and the end."""
        view: dict[str, Any] = {
            "episode_id": self.episode_id,
            "steps_used": self.steps_used,
            "steps_left": self.steps_left,
            "time_left_s": self.time_left_s,
        }
        if self.prices_simulated:
            view["prices_simulated"] = True
        if path == "step":
            view["service_spend"] = self.service_spend.model_dump(mode="json")
            if self.episode_end is not None:
                view["episode_end"] = self.episode_end.view()
        return view
