"""The contamination check reads what agent jobs left under /data/outputs/ (issue 28), through
the real episode workflow on the time-skipping server with the fake backend, on the shipped
`math_word_problems_tiny` task (its test items, n-gram and threshold): a run that kept the
public test set it trained on beside its weights is flagged and scores 0 under the task's
`zero_reward` policy, though its script quotes no test problem; a run that trained on the train
set is not, and keeps its reward. The flag is on `episode_end`, in the audit record (with the
evidence) and in the campaign report (tests/operator/test_campaign_contamination.py)."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from tasks.registry import TASKS_DIR, load_task
from tests.tasks.conftest import load_module
from tests.workflows.harness import running_worker
from tests.workflows.test_contamination import play

TASK = "math_word_problems_tiny"
FAMILY = "math_word_problems"
EVALUATOR = load_module(TASKS_DIR / FAMILY / "evaluator.py", "math_evaluator_outputs")
# The scripts quote no problem: only the outputs can give a run away.
CONTAMINATED = "print('CONTAMINATED: trains on problems it generates')\n"
CLEAN = "print('CLEAN: trains on problems it generates')\n"
WEIGHTS_HEADER = '{"__metadata__":{"format":"pt"}}'


def jsonl(problems: list[tuple[str, str, str]]) -> str:
    return "\n".join(json.dumps({"question": q, "reply": f"#### {a}"}) for _, q, a in problems)


def scenario() -> FakeScenario:
    test = EVALUATOR.tiny_problems("test", load_task(TASK).evaluation["test_items"])
    train = EVALUATOR.tiny_problems("train", 5000)
    weights = "\0" * 8 + WEIGHTS_HEADER  # what the check reads of a weights file: its header
    return FakeScenario(
        jobs=[
            FakeJobScript(
                role=JobRole.agent,
                script_contains="CONTAMINATED",
                run_s=10,
                outputs={"data/train.jsonl": jsonl(test), "model.safetensors": weights},
            ),
            FakeJobScript(
                role=JobRole.agent,
                script_contains="CLEAN",
                run_s=10,
                outputs={"train.jsonl": jsonl(train), "model.safetensors": weights},
            ),
            FakeJobScript(queue_s=1, run_s=30, score=0.8),
        ]
    )


def ship_task(tasks_dir: Path) -> None:
    """The shipped tiny task and its family's files, as the worker's tasks folder holds them."""
    for name in (TASK, FAMILY):
        shutil.copytree(TASKS_DIR / name, tasks_dir / name, ignore=shutil.ignore_patterns("*.pyc"))


async def test_a_run_that_kept_the_test_set_in_its_outputs_is_flagged_and_scores_0(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, scenario()) as h:
        ship_task(tmp_path / "tasks")
        final, status, record = await play(h, TASK, CONTAMINATED)

    counts = {
        "checked": True,
        "flagged": True,
        "policy": "zero_reward",
        "matched_items": 200,
        "unread_datasets": 0,
    }
    assert final.metadata["episode_end"] == {"reason": "submitted", "reward": 0.0,
                                             "contamination": counts}  # fmt: skip
    assert final.reward == 0.0 and status["end"]["reward"] == 0.0
    assert record["end"]["reward"] == 0.0
    assert record["contamination"]["summary"] == {**counts, "skipped": None}
    evidence = record["contamination"]["evidence"]
    assert (evidence["ngram"], evidence["threshold"], evidence["items"]) == (8, 1.0, 200)
    (job,) = [j for j in record["jobs"] if j["role"] == "agent"]
    outputs = f"outputs:{job['job_id']}"
    assert {m["places"][0] for m in evidence["matches"]} == {f"{outputs}/data/train.jsonl"}
    assert all(m["found_ngrams"] == m["item_ngrams"] for m in evidence["matches"])
    sources = {s["where"]: s for s in evidence["sources"]}
    assert sources[outputs]["bytes_read"] > 0 and not sources[outputs]["cut"]


async def test_a_run_that_trained_on_the_train_set_is_not_flagged_and_keeps_its_reward(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, scenario()) as h:
        ship_task(tmp_path / "tasks")
        final, _status, record = await play(h, TASK, CLEAN)

    counts = {
        "checked": True,
        "flagged": False,
        "policy": "zero_reward",
        "matched_items": 0,
        "unread_datasets": 0,
    }
    assert final.metadata["episode_end"]["contamination"] == counts
    assert final.reward == 0.8 and record["end"]["reward"] == 0.8
    evidence = record["contamination"]["evidence"]
    assert evidence["matches"] == []
    (job,) = [j for j in record["jobs"] if j["role"] == "agent"]
    (read,) = [s for s in evidence["sources"] if s["where"] == f"outputs:{job['job_id']}"]
    # 5,000 train problems were scanned (a train problem shares every phrase but its person,
    # numbers and thing with test problems: the threshold of 1.0 keeps them apart).
    assert read["bytes_read"] > 300_000 and not read["cut"]


async def test_a_tasks_evaluation_datasets_are_mounted_in_its_evaluations_only(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """`[[evaluation_datasets]]` (the GSM8K member's openai/gsm8k): every dev and grader job
    of the task mounts them at their pinned commits; agent jobs mount only what they ask for."""
    revision = "7" * 40
    table = f'\n[[evaluation_datasets]]\nrepo_id = "org/bench"\nrevision = "{revision}"\n'
    async with running_worker(time_skipping_env, tmp_path, scenario()) as h:
        folder = tmp_path / "tasks" / "t_bench"
        folder.mkdir(parents=True)
        spec = (tmp_path / "tasks" / "t_test" / "task.toml").read_text()
        (folder / "task.toml").write_text(spec.replace('"t_test"', '"t_bench"') + table)
        (folder / "evaluator.py").write_text("print('the fake backend never runs this')\n")
        ep = await h.episode("t_bench")
        job_id = await ep.submit_job(script=CLEAN)
        assert (await ep.wait_job(job_id, step=timedelta(seconds=31))).data["state"] == "succeeded"
        dev = await ep.call_over(timedelta(minutes=5), "dev_evaluate", job_id=job_id)
        assert dev.data["score"] == 0.8, dev.data
        final = await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        assert final.done and final.reward == 0.8
        await ep.handle.result()

    mounted = {
        r.role.value: [(d.repo_id, d.revision) for d in r.datasets] for r in h.backend.requests()
    }
    assert mounted == {
        "agent": [],
        "dev": [("org/bench", revision)],
        "grader": [("org/bench", revision)],
    }
