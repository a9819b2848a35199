"""Server settings, read once from the environment by the server and the worker (never by agents).

Not imported by `posttrain_env/__init__.py`: the client pulls in no server configuration.
"""

from __future__ import annotations

import math
import os
from datetime import timedelta
from pathlib import Path

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from posttrain_common.contracts.retention import DEFAULT_MAX_FOLDERS, RetentionPolicy
from posttrain_common.contracts.watching import DEFAULT_WATCH_SHARDS, MAX_WATCH_SHARDS
from posttrain_common.keys import KEY_FILE_SETTING, KEY_HEX_SETTING, ServerKey, ServerKeyError
from posttrain_common.pip_config import pip_find_links
from posttrain_env.limits import (
    CONTINUE_AS_NEW_HISTORY_BYTES,
    GIB,
    KIB,
    LOCAL_CPU_SHARE,
    LOCAL_JOB_DISK_BYTES,
    LOCAL_JOB_FILES,
    LOCAL_JOB_PROCESSES,
    LOCAL_MEMORY_SHARE,
    STORAGE_DAYS_WHEN_KEPT_FOREVER,
    STORAGE_USD_PER_TB_MONTH,
)
from posttrain_env.models import MICRO

# Retention settings above a century are surely a typo (and timedelta has its own limit).
MAX_RETENTION_DAYS = 36_500


# The Temporal connection settings (field -> Temporal's environment name), for messages.
TEMPORAL_TLS_FILE_SETTINGS = {
    "temporal_tls_client_cert_path": "TEMPORAL_TLS_CLIENT_CERT_PATH",
    "temporal_tls_client_key_path": "TEMPORAL_TLS_CLIENT_KEY_PATH",
    "temporal_tls_server_ca_cert_path": "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
}
TEMPORAL_TLS_SETTINGS = {
    "temporal_api_key": "TEMPORAL_API_KEY",
    "temporal_tls": "TEMPORAL_TLS",
    **TEMPORAL_TLS_FILE_SETTINGS,
    "temporal_tls_server_name": "TEMPORAL_TLS_SERVER_NAME",
}


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "posttrain-env"


class Settings(BaseSettings):
    # No error quotes its input: a model-level error would quote every setting, the server key
    # and HF_TOKEN among them. Each message names its setting instead.
    model_config = SettingsConfigDict(
        env_prefix="POSTTRAIN_", extra="ignore", hide_input_in_errors=True
    )

    hf_token: SecretStr | None = Field(default=None, validation_alias="HF_TOKEN")
    # A registered backend's name (`activities/backends/registry.py`, checked where the backend
    # is built). `hf` spends money and must be chosen explicitly; `fake` is for development.
    backend: str = Field(default="local", pattern=r"^[a-z][a-z0-9_]{0,31}$")
    namespace: str | None = None
    state_dir: Path = Field(default_factory=default_state_dir)
    # The deployment's server key (docs/security.md, "One key per deployment"): a file of the bytes
    # `ServerKey` writes, or hex for platforms that inject secrets as environment; at most one.
    # Neither: `<state_dir>/server.key`, created on first use, but only on the embedded Temporal
    # (`posttrain_server.deployment_key` refuses to start with TEMPORAL_ADDRESS set).
    server_key_file: Path | None = None
    server_key: SecretStr | None = None
    temporal_address: str = Field(
        default="127.0.0.1:7233", validation_alias=AliasChoices("TEMPORAL_ADDRESS")
    )
    temporal_namespace: str = Field(
        default="default", validation_alias=AliasChoices("TEMPORAL_NAMESPACE")
    )
    # How to reach a Temporal of your own (docs/deployment.md, "Production shape"), under the names
    # Temporal's own CLI and SDKs read (its "environment configuration"), so one environment
    # serves `temporal workflow list` and our processes alike. An API key (Temporal Cloud)
    # turns TLS on unless TEMPORAL_TLS=false; TEMPORAL_TLS=true alone is TLS with the system's
    # roots; a client certificate and its key (mTLS) go together. Only beside TEMPORAL_ADDRESS.
    temporal_api_key: SecretStr | None = Field(default=None, validation_alias="TEMPORAL_API_KEY")
    temporal_tls: bool | None = Field(default=None, validation_alias="TEMPORAL_TLS")
    temporal_tls_client_cert_path: Path | None = Field(
        default=None, validation_alias="TEMPORAL_TLS_CLIENT_CERT_PATH"
    )
    temporal_tls_client_key_path: Path | None = Field(
        default=None, validation_alias="TEMPORAL_TLS_CLIENT_KEY_PATH"
    )
    temporal_tls_server_ca_cert_path: Path | None = Field(
        default=None, validation_alias="TEMPORAL_TLS_SERVER_CA_CERT_PATH"
    )
    # The name the server's certificate must hold, when it is not the address's host.
    temporal_tls_server_name: str | None = Field(
        default=None, validation_alias="TEMPORAL_TLS_SERVER_NAME"
    )
    task_queue: str = "posttrain"
    # This deployment's name, shown on every episode (`PtDeployment`) so that operators of a
    # Temporal namespace shared by several deployments can tell their episodes apart.
    deployment: str = Field(default="default", min_length=1, max_length=100)
    # Agent turns run on this queue only, in `posttrain-env agent-worker` (never beside the
    # broker's secrets).
    agent_task_queue: str = "posttrain-agents"
    # Turns one agent worker runs at once (each in a process of its own).
    agent_turns_at_once: int = Field(default=16, ge=1, le=1024)
    # Turns started per second on the agent task queue, by every agent worker together (Temporal
    # paces the queue's dispatch): an LLM provider's request rate, or what the Temporal server
    # sustains (docs/deployment.md#capacity). None: a turn starts as soon as a slot is free.
    agent_turns_per_second: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # Campaign folders (records, conversations); default `<state dir>/campaigns`. The server's
    # worker and the agent worker must both see it.
    campaigns_dir: Path | None = None
    # The embedded Temporal dev server (used when TEMPORAL_ADDRESS is not set): gRPC and UI ports.
    temporal_port: int = Field(default=7233, gt=0, lt=65536)
    temporal_ui_port: int = Field(default=8233, gt=0, lt=65536)
    # The Temporal UI of an external Temporal (TEMPORAL_ADDRESS), for the links `posttrain-env
    # episodes show` prints; the embedded server's UI is on temporal_ui_port.
    temporal_ui_url: str | None = None
    api_keys: str = ""  # comma-separated
    # Host names the gateway answers to besides loopback (comma-separated), e.g. a real domain
    # behind a proxy. Requests naming any other Host or Origin are refused (DNS rebinding).
    allowed_hosts: str = ""
    cancel_confirm_s: int = Field(default=120, gt=0)
    # How often the reconciler (and, on Hugging Face, the orphan reaper) runs: a workflow
    # terminated from outside is wound down within one period (docs/operations.md).
    reaper_every_s: float = Field(default=600.0, ge=1.0, le=86_400.0)
    job_python: str = "/usr/bin/python3"
    # Folders of wheels that local jobs and evaluators install from besides PyPI (comma-
    # separated), e.g. a CPU build of torch; the server's setting, never anything a job sets.
    # Unset: the find-links of this machine's pip configuration; empty: none.
    local_find_links: str | None = None
    max_live_episodes: int | None = Field(default=None, gt=0)
    spend_cap_usd: float | None = Field(default=None, gt=0)
    # How often the job watcher looks at running jobs. None: 2 s for the local backend (reading
    # files costs nothing), 30 s otherwise (on Hugging Face each look is one Hub listing).
    watch_interval_s: float | None = Field(default=None, gt=0)
    # Jobs are followed by this many watcher workflows, each job's by a stable hash of its id
    # (no single workflow holds every running job: DESIGN §11). A change applies to episodes
    # started after it; an episode's jobs stay with the shards it started with.
    watch_shards: int = Field(default=DEFAULT_WATCH_SHARDS, ge=1, le=MAX_WATCH_SHARDS)
    # Workflows a worker keeps in memory (the SDK's default, 1,000). An evicted workflow is
    # replayed from its history at its next task: a worker that runs more open workflows than
    # this (about three per live episode, and one per running job) spends its CPU replaying.
    max_cached_workflows: int = Field(default=1000, ge=0, le=1_000_000)
    # A worker process collects its oldest generation of garbage every this many seconds and
    # only then (posttrain_server/full_collections.py: with thousands of workflows cached,
    # Python's own schedule stopped each workflow process for seconds every few minutes).
    # 0: Python's own schedule.
    worker_full_collection_every_s: float = Field(default=600, ge=0, le=86_400)
    # Where episodes' audit records are written (default: <state_dir>/audit).
    audit_dir: Path | None = None
    # Where task specs live (default: the `tasks` package shipped with the server).
    tasks_dir: Path | None = None
    # A task whose contamination check has no test items here (`posttrain-env tasks fetch
    # <task>` writes them) does not start: `reset` answers `not_ready` naming that command. True
    # lets such an episode run and be rewarded unchecked (`episode_end.contamination.skipped`:
    # `unchecked`, in the audit record and campaign reports too): an operator's explicit choice.
    accept_unchecked_rewards: bool = False
    # The fake backend's scenario, a JSON file of `activities.backends.fake.backend.FakeScenario`
    # (what
    # each job does; out-of-process tests). None: every job queues, runs and succeeds.
    fake_scenario: Path | None = None
    # Continue an episode as new past this many history events (default: when Temporal
    # suggests it, ~4,000 events on the dev server). Lower it to exercise the path.
    continue_as_new_events: int | None = Field(default=None, ge=100)
    # Continue an episode as new past this many bytes of history (Temporal's limit is 50 MB).
    continue_as_new_bytes: int = Field(default=CONTINUE_AS_NEW_HISTORY_BYTES, ge=64 * KIB)
    # The local backend's jobs (docs/backends.md, "Local backend"): all jobs together use at most
    # these
    # shares of the machine's memory and CPUs (the rest is the server's reserve); each job at
    # most its flavor's size, and this disk, files and processes.
    local_memory_share: float = Field(default=LOCAL_MEMORY_SHARE, gt=0, le=1)
    local_cpu_share: float = Field(default=LOCAL_CPU_SHARE, gt=0, le=1)
    local_job_disk_gib: float = Field(default=LOCAL_JOB_DISK_BYTES / GIB, gt=0)
    local_job_files: int = Field(default=LOCAL_JOB_FILES, ge=1000)
    local_job_processes: int = Field(default=LOCAL_JOB_PROCESSES, ge=32)
    # Retention (docs/operations.md): the job folders of episodes that ended more than this
    # many days ago are deleted by the retention sweep; submitted artifacts after their own
    # time, which may not be shorter. 0 (or empty): kept forever.
    job_retention_days: float = Field(default=14, ge=0, le=MAX_RETENTION_DAYS, allow_inf_nan=False)
    submitted_retention_days: float = Field(
        default=90, ge=0, le=MAX_RETENTION_DAYS, allow_inf_nan=False
    )
    # The price of an artifact's storage, in USD per TB and 30-day month (docs/deployment.md,
    # "Storage"): the Hub's list price of pay-as-you-go private storage by default; simulated
    # on the local backend. Each agent job's artifact is charged once, when it ends, for
    # `job_retention_days` (kept forever: a year).
    storage_usd_per_tb_month: float = Field(
        default=STORAGE_USD_PER_TB_MONTH, ge=0, le=1_000_000, allow_inf_nan=False
    )
    # Folders one sweep acts on at most (a sweep runs every hour; the rest waits for the next).
    retention_max_folders: int = Field(default=DEFAULT_MAX_FOLDERS, ge=1, le=100_000)
    # Prometheus metrics (posttrain_common/metrics.py). Off (POSTTRAIN_METRICS=off): the
    # gateway neither times calls nor serves /metrics.
    metrics: bool = True
    # Where `posttrain-env worker` serves its metrics (http://<host>:<port>/metrics); unset: it
    # serves none. Each worker on a machine needs its own port. Inside `server` the worker's
    # series are on the gateway's /metrics instead.
    worker_metrics_port: int | None = Field(default=None, gt=0, lt=65536)
    # Where the Temporal SDK's own metrics are served (its Rust core's Prometheus exporter, in
    # the processes that keep running: gateway, worker, agent worker; one-shot commands ignore
    # it); unset: nowhere.
    temporal_metrics_port: int | None = Field(default=None, gt=0, lt=65536)
    # The address both bind; 0.0.0.0 for a Prometheus on another host (a container's).
    metrics_host: str = "127.0.0.1"

    @field_validator(
        "max_live_episodes",
        "spend_cap_usd",
        "tasks_dir",
        "audit_dir",
        "campaigns_dir",
        "continue_as_new_events",
        "watch_interval_s",
        "server_key_file",
        "server_key",
        "temporal_api_key",
        "temporal_tls",
        "temporal_tls_client_cert_path",
        "temporal_tls_client_key_path",
        "temporal_tls_server_ca_cert_path",
        "temporal_tls_server_name",
        "worker_metrics_port",
        "temporal_metrics_port",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("job_retention_days", "submitted_retention_days", mode="before")
    @classmethod
    def _empty_is_forever(cls, value: object) -> object:
        return 0 if isinstance(value, str) and value.strip() == "" else value

    @field_validator("server_key")
    @classmethod
    def _server_key_is_a_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            try:
                ServerKey.from_hex(value.get_secret_value())
            except ServerKeyError as exc:
                raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _one_server_key(self) -> Settings:
        if self.server_key_file is not None and self.server_key is not None:
            raise ValueError(
                f"{KEY_FILE_SETTING} and {KEY_HEX_SETTING} are both set: give the deployment's "
                "key one way only"
            )
        return self

    @field_validator(
        "temporal_tls_client_cert_path",
        "temporal_tls_client_key_path",
        "temporal_tls_server_ca_cert_path",
    )
    @classmethod
    def _a_readable_file(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        # Read at every connect; checked here so that a wrong path stops a process before it
        # starts, naming the setting (never the file's content: the key is a secret).
        if value is not None:
            setting = TEMPORAL_TLS_SETTINGS[info.field_name or ""]
            try:
                with value.open("rb") as handle:
                    handle.read(1)
            except OSError as exc:
                raise ValueError(f"{setting}={value}: cannot be read ({exc.strerror})") from None
        return value

    @model_validator(mode="after")
    def _temporal_tls_fits_together(self) -> Settings:
        given = [
            TEMPORAL_TLS_SETTINGS[name]
            for name in TEMPORAL_TLS_SETTINGS
            if getattr(self, name) is not None
        ]
        if given and not self.temporal_is_external:
            raise ValueError(
                f"{', '.join(given)} set without TEMPORAL_ADDRESS: they are for a Temporal of "
                "your own (the embedded one is plain, on 127.0.0.1); set TEMPORAL_ADDRESS too"
            )
        cert, key = self.temporal_tls_client_cert_path, self.temporal_tls_client_key_path
        if (cert is None) != (key is None):
            raise ValueError(
                "TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH go together "
                "(a client certificate and its private key): set both or neither"
            )
        certificates = [
            TEMPORAL_TLS_SETTINGS[name]
            for name in TEMPORAL_TLS_FILE_SETTINGS
            if getattr(self, name) is not None
        ]
        if self.temporal_tls is False and (certificates or self.temporal_tls_server_name):
            named = certificates + (
                ["TEMPORAL_TLS_SERVER_NAME"] if self.temporal_tls_server_name else []
            )
            raise ValueError(f"TEMPORAL_TLS=false contradicts {', '.join(named)}")
        return self

    @model_validator(mode="after")
    def _submitted_kept_at_least_as_long(self) -> Settings:
        job, submitted = self.job_retention_days or math.inf, self.submitted_retention_days
        if (submitted or math.inf) < job:
            raise ValueError(
                f"POSTTRAIN_SUBMITTED_RETENTION_DAYS={submitted:g} is shorter than "
                f"POSTTRAIN_JOB_RETENTION_DAYS={self.job_retention_days:g} (0 is forever): "
                "submitted artifacts are kept at least as long as other job folders"
            )
        return self

    @property
    def audit_folder(self) -> Path:
        """Where audit records are written (POSTTRAIN_AUDIT_DIR, else `<state dir>/audit`)."""
        return self.audit_dir or self.state_dir / "audit"

    @property
    def storage_billed_days(self) -> float:
        """The days an artifact is charged for: as long as job folders are kept."""
        return self.job_retention_days or float(STORAGE_DAYS_WHEN_KEPT_FOREVER)

    @property
    def retention_policy(self) -> RetentionPolicy:
        def after(days: float) -> timedelta | None:
            return timedelta(days=days) if days > 0 else None

        return RetentionPolicy(
            job_after=after(self.job_retention_days),
            submitted_after=after(self.submitted_retention_days),
            max_folders=self.retention_max_folders,
        )

    @property
    def campaign_root(self) -> Path:
        return self.campaigns_dir or self.state_dir / "campaigns"

    @property
    def server_key_path(self) -> Path:
        """The implicit key's file (the embedded Temporal's deployments only)."""
        return self.state_dir / "server.key"

    @property
    def temporal_is_external(self) -> bool:
        """TEMPORAL_ADDRESS was given: a Temporal that other machines' processes may share."""
        return "temporal_address" in self.model_fields_set

    @property
    def spend_cap_micro_usd(self) -> int | None:
        return None if self.spend_cap_usd is None else round(self.spend_cap_usd * MICRO)

    @property
    def local_find_link_list(self) -> list[str]:
        if self.local_find_links is None:
            return pip_find_links()
        return [path.strip() for path in self.local_find_links.split(",") if path.strip()]

    @property
    def allowed_host_list(self) -> list[str]:
        return [host.strip() for host in self.allowed_hosts.split(",") if host.strip()]

    @property
    def api_key_list(self) -> list[str]:
        return [key.strip() for key in self.api_keys.split(",") if key.strip()]
