"""t0_artifact end to end on the local backend: the generated tiny model, the reference
solution as an agent job, and the task's evaluator as dev and grader jobs (no Temporal)."""

from __future__ import annotations

import asyncio

from job_launcher.trusted_lines import read_score
from posttrain_common.contracts.jobs import RepoRef
from tasks.registry import evaluator_script, load_task
from tests.local.conftest import Jobs, trained_t0_artifact

SEED = "POSTTRAIN_HIDDEN_SPLIT_SEED"


def test_the_reference_solution_scores_full_marks_on_both_splits(jobs: Jobs) -> None:
    model, agent, evaluator = trained_t0_artifact(jobs)
    scores = {}
    for role, secrets in (("dev", {}), ("grader", {SEED: "a-hidden-seed"})):
        job = jobs.run(
            evaluator,
            role=role,
            artifact_ref=agent.ref,
            base_model=model,
            secrets=secrets,
            timeout_s=120,
            timeout=60,
        )
        assert job.state.value == "succeeded", jobs.logs(job.ref)
        reading = read_score(jobs.logs(job.ref, 10_000), jobs.nonces[job.ref])
        assert reading.valid, (reading.reason, jobs.logs(job.ref))
        scores[role] = reading.score
    assert scores == {"dev": 1.0, "grader": 1.0}


def test_the_base_model_copied_unchanged_does_not_score_full_marks(jobs: Jobs) -> None:
    task = load_task("t0_artifact")
    assert task.base_model.local is not None
    revision = asyncio.run(jobs.backend.resolve_model(task.base_model.local, "main"))
    model = RepoRef(repo_id=task.base_model.local, revision=revision)
    copy = (
        "import glob, shutil\n"
        "for f in glob.glob('/base_model/*.safetensors'):\n"
        "    shutil.copy(f, '/data/outputs/')\n"
    )
    agent = jobs.run(copy, base_model=model)
    assert agent.state.value == "succeeded", jobs.logs(agent.ref)
    job = jobs.run(evaluator_script(task), role="dev", artifact_ref=agent.ref, base_model=model)
    reading = read_score(jobs.logs(job.ref, 10_000), jobs.nonces[job.ref])
    assert reading.valid, (reading, jobs.logs(job.ref))
    assert reading.score < 1.0 and reading.details["doubled_exact"] is False
