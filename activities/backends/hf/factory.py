"""Building the Hugging Face backend from the settings (`BACKEND.build`)."""

from __future__ import annotations

from huggingface_hub import HfApi

from activities.backends.hf.backend import HfBackend, HfBackendConfig
from activities.backends.hf.http import install_hub_client
from activities.backends.hf.labels import deployment_id
from activities.backends.hf.namespaces import NamespaceNotes
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings


def build(settings: Settings, key: ServerKey) -> HfBackend:
    """The broker's token goes into exactly one place, the HfApi that starts jobs (DESIGN §6).
    SystemExit naming HF_TOKEN when it is not set."""
    token = settings.hf_token.get_secret_value().strip() if settings.hf_token else ""
    if not token:
        raise SystemExit(
            "POSTTRAIN_BACKEND=hf needs HF_TOKEN: set it to the broker's Hugging Face token "
            "(it starts paid jobs; no job ever sees it), or choose another backend."
        )
    config = HfBackendConfig()
    # Every Hub request of this process bounded, and retried by Temporal only.
    install_hub_client(config.http)
    return HfBackend(
        HfApi(token=token, library_name="posttrain-env"),
        HfApi(token=False, library_name="posttrain-env"),
        # Every worker of the deployment holds its key: they all watch and reap the same jobs.
        deployment=deployment_id(key),
        namespace=settings.namespace,
        config=config,
        # Where jobs were started, for the reaper (activities/backends/hf/namespaces.py).
        namespaces=NamespaceNotes(settings.state_dir / "hf_namespaces.json"),
    )
