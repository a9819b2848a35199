"""An episode's set-up, as an activity prepares it at reset (pure; no secret in here)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from posttrain_common.contracts.jobs import RepoRef
from posttrain_env.limits import CONTINUE_AS_NEW_HISTORY_BYTES
from posttrain_env.models import FlavorPrice, TaskSpec


class Caps(BaseModel):
    """Server-wide limits, enforced through the account workflow when set."""

    account_workflow_id: str
    spend_cap_micro_usd: int | None = None
    max_live_episodes: int | None = None

    @property
    def enabled(self) -> bool:
        """A spend cap is set: each reservation is checked against it."""
        return self.spend_cap_micro_usd is not None

    @property
    def tracked(self) -> bool:
        """Any cap is set: the episode is admitted, reported and retired in the account."""
        return self.enabled or self.max_live_episodes is not None


class FlavorLimits(BaseModel):
    """What one job of a flavor may use on the backend that runs it."""

    vcpus: float
    memory_bytes: int
    processes: int  # processes and threads
    disk_bytes: int  # /data, /tmp and its packages together
    files: int  # files and folders on that disk


class JobLimits(BaseModel):
    """A backend's limits per job, by flavor, and the limits its host holds only by a weaker
    stand-in (e.g. no memory control group: memory limited per process). `task_info` shows it."""

    flavors: dict[str, FlavorLimits]
    not_enforced: list[str] = Field(default_factory=list)


class StorageTerms(BaseModel):
    """What an episode's artifacts may hold and cost (DESIGN §12, "Storage is money"): its
    storage cap, a job's artifact cap, and the price locked for the episode (micro-USD per TB
    and month, charged once per artifact for `billed_days`)."""

    cap_bytes: int = Field(gt=0)
    artifact_cap_bytes: int = Field(gt=0)
    micro_usd_per_tb_month: int = Field(ge=0)
    billed_days: float = Field(ge=0)


class EpisodeSetup(BaseModel):
    """What an episode is started with (prepared by an activity at reset)."""

    episode_id: str
    task: TaskSpec
    base_model: RepoRef  # revision resolved to a commit, once per episode
    prices: dict[str, FlavorPrice]
    prices_simulated: bool = False
    cancel_confirm_s: int = 120
    watcher_workflow_id: str
    # Its jobs are followed by this many watcher shards (`workflows.ids.watcher_shard_id`); 1
    # in the setups of episodes started before sharding, whose jobs keep the one watcher.
    watch_shards: int = 1
    caps: Caps
    session_workflow_id: str | None = None
    # None: continue as new when Temporal suggests it; else past this many history events.
    continue_as_new_events: int | None = None
    # Continue as new past this many bytes of history, whatever the event count.
    continue_as_new_bytes: int = CONTINUE_AS_NEW_HISTORY_BYTES
    # What each job may use on this backend (None: the backend does not say; histories
    # recorded before this field decode with None).
    job_limits: JobLimits | None = None
    # The Python version the backend's agent jobs run; None: unknown (an episode started
    # before it was recorded), checked as this server's.
    job_python_version: str | None = None
    # What an operator filters on (search attributes, DESIGN §10): the backend's name, the
    # deployment's name (POSTTRAIN_DEPLOYMENT) and the campaign the episode belongs to, if any.
    backend: str | None = None
    deployment: str | None = None
    campaign_id: str | None = None
    # The backend knows a job's whole run when it starts (the replay backend): the episode asks
    # it first and keeps such a job in its table, with no workflow of its own
    # (`workflows/episode/known.py`). False in the setups of episodes started before.
    known_runs: bool = False
    # None in the setups of episodes started before storage was capped and charged: their jobs
    # keep what the backend allows, uncounted.
    storage: StorageTerms | None = None


class PrepareEpisode(BaseModel):
    task_id: str
    episode_id: str
    # The workflow told when the episode closes (`EpisodeClosed`): a session, or a rollout.
    session_workflow_id: str | None = None
    # A commit of the backend's base model, pinned by a campaign for all its rollouts; None:
    # the task's revision, resolved now.
    base_model_revision: str | None = None


class ServerSpend(BaseModel):
    """An episode's new committed spend, checked against the server-wide cap."""

    account_workflow_id: str
    episode_id: str
    committed_micro_usd: int
    cap_micro_usd: int
