"""deploy/'s Compose files, checked without Docker (docs/deployment.md, "Temporal on
PostgreSQL"): each validates against the Compose Specification's JSON schema, alone and merged
as the docs combine them; third-party images are pinned; our services are given only settings
our code reads, each role only its own secrets; the PostgreSQL cluster starts in the documented
order; and the schema job's script runs Temporal's schema steps and stops at the first failure."""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.compose import (
    BASE,
    COMPOSE_FILES,
    DEPLOY,
    EXAMPLE_ENV,
    MTLS,
    POSTGRES,
    MissingVariable,
    env_file,
    interpolate,
    load,
    ours,
    project,
    schema_errors,
    settings_read,
    variables,
)

# deploy/example.env with its blanks filled as an operator would (none of these is real).
FILLED = {
    "POSTTRAIN_SERVER_KEY": "ab" * 32,
    "POSTGRES_PASSWORD": "a-database-password",
    "POSTTRAIN_API_KEYS": "a-client-key",
    "HF_TOKEN": "hf_not_a_real_token",
    "TEMPORAL_TLS_DIR": "./temporal-tls",
}


def filled_env() -> dict[str, str]:
    return {**env_file(EXAMPLE_ENV), **FILLED}


SHAPES = {
    "alone": (BASE,),
    "on PostgreSQL": (BASE, POSTGRES),
    "with mTLS": (BASE, MTLS),
}


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda path: path.name)
def test_each_file_as_written_is_valid_compose(path: Path) -> None:
    assert schema_errors(load(path)) == []


@pytest.mark.parametrize("files", SHAPES.values(), ids=list(SHAPES))
def test_each_documented_combination_interpolated_is_valid_compose(files: tuple[Path, ...]) -> None:
    merged = project(*files, env=filled_env())
    assert schema_errors(merged) == []
    assert {"setup", "gateway-1", "gateway-2", "worker"} <= set(merged["services"])


def test_the_schema_check_catches_a_misspelt_key_and_a_wrong_type() -> None:
    broken = copy.deepcopy(load(BASE))
    broken["services"]["worker"]["enviroment"] = {"A": "b"}
    broken["services"]["gateway-1"]["ports"] = "8000:8000"
    errors = schema_errors(broken)
    assert any("enviroment" in error for error in errors), errors
    assert any(error.startswith("services/gateway-1/ports") for error in errors), errors


def test_a_required_setting_left_blank_stops_the_interpolation_naming_it() -> None:
    env = {**filled_env(), "POSTTRAIN_SERVER_KEY": ""}
    with pytest.raises(MissingVariable, match="POSTTRAIN_SERVER_KEY"):
        project(BASE, env=env)


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda path: path.name)
def test_third_party_images_are_pinned_to_a_version(path: Path) -> None:
    for name, service in load(path)["services"].items():
        image = service.get("image")
        if image is None or "build" in service:  # ours, built from this repository
            continue
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: {image} names no tag"
        assert tag != "latest" and any(c.isdigit() for c in tag), f"{name}: {image}"


@pytest.mark.parametrize("files", SHAPES.values(), ids=list(SHAPES))
def test_our_services_are_given_only_settings_our_code_reads(files: tuple[Path, ...]) -> None:
    read = settings_read()
    services = project(*files, env=filled_env())["services"]
    given = {name: set(s.get("environment", {})) for name, s in services.items() if ours(s)}
    assert set(given) == {"setup", "gateway-1", "gateway-2", "worker"}
    for name, names in given.items():
        assert names <= read, f"{name} is given {sorted(names - read)}, which nothing reads"


def test_each_role_holds_only_its_own_secrets_and_runs_its_own_command() -> None:
    services = project(BASE, POSTGRES, env=filled_env())["services"]
    gateways = [services["gateway-1"], services["gateway-2"]]
    worker, setup = services["worker"], services["setup"]
    for gateway in gateways:
        assert gateway["command"][:3] == ["posttrain-env", "server", "--no-worker"]
        assert "HF_TOKEN" not in gateway["environment"]
        assert gateway["environment"]["POSTTRAIN_API_KEYS"] == "a-client-key"
    assert worker["command"] == ["posttrain-env", "worker"]
    assert "POSTTRAIN_API_KEYS" not in worker["environment"]
    assert worker["environment"]["HF_TOKEN"] == "hf_not_a_real_token"
    assert worker["deploy"]["replicas"] >= 2  # losing one loses nothing
    assert setup["command"] == ["posttrain-env", "temporal", "setup"]
    assert {"HF_TOKEN", "POSTTRAIN_API_KEYS"}.isdisjoint(setup["environment"])
    assert setup["profiles"] == ["setup"] and setup["restart"] == "no"
    # Equal on every process: the key, the Temporal and the task queue.
    shared = ("POSTTRAIN_SERVER_KEY", "TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE")
    for name in (*shared, "POSTTRAIN_TASK_QUEUE"):
        assert len({s["environment"][name] for s in [*gateways, worker, setup]}) == 1, name


def test_the_postgres_cluster_starts_in_the_documented_order() -> None:
    services = project(BASE, POSTGRES, env=filled_env())["services"]

    def after(name: str) -> dict[str, str]:
        return {dep: c["condition"] for dep, c in services[name].get("depends_on", {}).items()}

    assert after("temporal-schema") == {"postgresql": "service_healthy"}
    assert after("temporal") == {"postgresql": "service_healthy"}
    assert after("temporal-ui") == {"temporal": "service_healthy"}
    for name in ("setup", "gateway-1", "gateway-2", "worker"):
        assert after(name) == {"temporal": "service_healthy"}, name
    assert services["temporal-schema"]["profiles"] == ["setup"]  # run once, by hand
    postgres = services["postgresql"]
    assert postgres["healthcheck"]["test"][0] == "CMD-SHELL"
    assert any(v.endswith(":/var/lib/postgresql/data") for v in postgres["volumes"])
    assert "healthcheck" in services["temporal"]
    # The server and its schema job reach the same database as the same user.
    database = ("DB", "DB_PORT", "POSTGRES_SEEDS", "POSTGRES_USER", "POSTGRES_PWD")
    for name in database:
        assert (
            services["temporal"]["environment"][name]
            == (services["temporal-schema"]["environment"][name])
        )
    assert services["temporal"]["environment"]["POSTGRES_PWD"] == FILLED["POSTGRES_PASSWORD"]
    assert services["temporal"]["environment"]["DB"] == "postgres12"
    # Our processes reach it where example.env says.
    assert services["worker"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"


def test_the_files_the_cluster_mounts_exist_and_the_dynamic_config_is_yaml() -> None:
    services = load(POSTGRES)["services"]
    for name in ("temporal-schema", "temporal"):
        for volume in services[name]["volumes"]:
            source = volume.split(":", 1)[0]
            assert (DEPLOY / source).is_file(), f"{name} mounts {source}, which is not there"
    config = yaml.safe_load((DEPLOY / "temporal-dynamicconfig.yaml").read_text())
    assert config["frontend.enableUpdateWorkflowExecution"] == [{"value": True}]
    assert config["frontend.enableExecuteMultiOperation"] == [{"value": True}]
    mounted = services["temporal"]["volumes"][0].split(":")[1]
    path = services["temporal"]["environment"]["DYNAMIC_CONFIG_FILE_PATH"]
    assert mounted == f"/etc/temporal/{path}"


def test_every_required_variable_is_in_example_env() -> None:
    listed = set(env_file(EXAMPLE_ENV)) | {"TEMPORAL_TLS_DIR"}  # mTLS: cloud-mtls.env.example
    for path in COMPOSE_FILES:
        required = {name for name, op in variables(path).items() if op in (":?", "?", None)}
        assert required <= listed, f"{path.name}: {sorted(required - listed)} not listed"


def test_the_mtls_overlay_mounts_the_certificates_in_every_process_of_ours() -> None:
    services = project(BASE, MTLS, env=filled_env())["services"]
    for name, service in services.items():
        if ours(service):
            assert "./temporal-tls:/etc/temporal-tls:ro" in service["volumes"], name
    assert "shared:/shared" in services["worker"]["volumes"]  # its own volume kept


def run_schema_script(tmp_path: Path, failing: str | None = None) -> tuple[int, list[str]]:
    """deploy/temporal-schema.sh with a stand-in temporal-sql-tool that records its arguments
    (and fails on the call whose arguments contain `failing`)."""
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "temporal-sql-tool"
    tool.write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\ncase "$*" in *"{failing or "never"}"*) exit 3;; esac\n'
    )
    tool.chmod(0o755)
    env = load(POSTGRES)["services"]["temporal-schema"]["environment"]
    env = interpolate(env, filled_env())
    done = subprocess.run(
        ["sh", str(DEPLOY / "temporal-schema.sh")],
        env={**env, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.returncode, calls.read_text().splitlines() if calls.exists() else []


def test_the_schema_job_runs_temporals_steps_for_both_databases(tmp_path: Path) -> None:
    status, calls = run_schema_script(tmp_path)
    assert status == 0
    connect = "--plugin postgres12 --ep postgresql -u temporal -p 5432"
    assert calls == [
        f"{connect} --db temporal_visibility create",
        f"{connect} --db temporal setup-schema -v 0.0",
        f"{connect} --db temporal update-schema -d "
        "/etc/temporal/schema/postgresql/v12/temporal/versioned",
        f"{connect} --db temporal_visibility setup-schema -v 0.0",
        f"{connect} --db temporal_visibility update-schema -d "
        "/etc/temporal/schema/postgresql/v12/visibility/versioned",
    ]


def test_the_schema_job_stops_at_the_first_failure(tmp_path: Path) -> None:
    status, calls = run_schema_script(tmp_path, failing="--db temporal setup-schema")
    assert status == 3
    assert calls[-1].endswith("--db temporal setup-schema -v 0.0") and len(calls) == 2


def documented_steps() -> list[list[str]]:
    """The `dc ...` lines of docs/deployment.md's "Temporal on PostgreSQL", as words."""
    text = (DEPLOY.parent / "docs" / "deployment.md").read_text()
    section = text.split("### Temporal on PostgreSQL", 1)[1].split("\n### ", 1)[0]
    return [
        line.split("#", 1)[0].split() for line in section.splitlines() if line.startswith("dc ")
    ]


def test_the_documented_steps_name_services_of_the_project_in_their_profiles() -> None:
    services = project(BASE, POSTGRES, env=filled_env())["services"]
    steps = documented_steps()
    assert len(steps) == 5
    order: list[str] = []
    for words in steps:
        profile = words[words.index("--profile") + 1] if "--profile" in words else None
        after = "--rm" if "run" in words else "-d"
        named = words[words.index(after) + 1 :]
        for name in named:
            assert name in services, f"{' '.join(words)}: no service {name}"
            assert services[name].get("profiles") == ([profile] if profile else None), words
        order += named or ["(every service)"]
    # The steps' order is the dependencies' order; the last starts everything else.
    assert order.index("postgresql") < order.index("temporal-schema") < order.index("temporal")
    assert order.index("temporal") < order.index("setup") < order.index("(every service)")


def test_the_docs_name_the_images_the_files_pin() -> None:
    text = (DEPLOY.parent / "docs" / "deployment.md").read_text()
    for service in load(POSTGRES)["services"].values():
        if "image" in service:
            assert f"`{service['image']}`" in text or service["image"] == "postgres:16"
    assert "PostgreSQL 16 (`postgres:16`" in text
