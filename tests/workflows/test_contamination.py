"""The grader-side contamination check (issue 16, part 6), through the real episode workflow on
the time-skipping server with the fake backend: a task with public test items flags a script
that embeds them and a mounted dataset that holds them, with evidence in the audit record only
and counts on `episode_end`; a clean run is not flagged; the task's policy decides the reward;
a task whose hidden split is generated in the grader skips the check (no activity runs)."""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeDataset, FakeJobScript, FakeScenario
from activities.contamination.scan import words
from posttrain_common.contracts.jobs import JobRole
from posttrain_server.commands.episodes import validate_record
from tasks.registry import TASKS_DIR
from tests.workflows.harness import TEST_TASK, Answer, Harness, running_worker
from workflows.ids import episode_workflow_id

ITEMS = [
    {
        "id": "q-river",
        "text": "Which river flows through the ancient city that was founded, according to "
        "legend, by twin brothers who were raised by a wolf?",
    },
    {
        "id": "q-metal",
        "text": "Name the only metal that is liquid at room temperature and was once used in "
        "thermometers, barometers and some old dental fillings.",
    },
    {
        "id": "q-planet",
        "text": "Which planet of the solar system has the shortest day, spinning once on its "
        "axis in a little under ten hours despite its enormous size?",
    },
]
LEAKY_REVISION = "1" * 40
CLEAN_REVISION = "2" * 40
SCENARIO = FakeScenario(
    jobs=[
        FakeJobScript(role=JobRole.agent, queue_s=1, run_s=10),
        FakeJobScript(queue_s=1, run_s=30, score=0.8),
    ],
    datasets={
        # The second and third items, re-cased and re-punctuated inside JSON: still found.
        "test-org/leaky": FakeDataset(
            revision=LEAKY_REVISION,
            files={
                "README.md": "A dataset of trivia.\n",
                "data/train.jsonl": "\n".join(
                    json.dumps({"prompt": item["text"].upper(), "answer": "..."})
                    for item in ITEMS[1:]
                ),
            },
        ),
        "test-org/clean": FakeDataset(
            revision=CLEAN_REVISION,
            files={"data/train.jsonl": '{"prompt": "What is 2 + 2?", "answer": "4"}\n'},
        ),
    },
)
EMBEDDING_SCRIPT = f"QUESTIONS = [{ITEMS[0]['text']!r}]\nprint('training on', QUESTIONS)\n"
CLEAN_SCRIPT = "print('training on generated data')\n"


def write_contamination_task(tasks_dir: Path, task_id: str, table: str) -> None:
    folder = tasks_dir / task_id
    folder.mkdir(parents=True, exist_ok=True)
    spec = TEST_TASK.format(
        task_id=task_id,
        budget_usd=1.0,
        max_steps=100,
        time_limit_s=7200,
        max_timeout_minutes=60,
        max_dev_evaluations=2,
    )
    (folder / "task.toml").write_text(spec + "\n[contamination]\n" + table)
    (folder / "evaluator.py").write_text("print('the fake backend never runs this')\n")
    (folder / "test_items.jsonl").write_text("\n".join(json.dumps(item) for item in ITEMS) + "\n")


async def play(
    h: Harness, task_id: str, script: str, datasets: list[str] | None = None
) -> tuple[Answer, dict[str, Any], dict[str, Any]]:
    """One episode: a job, then `submit`; its last answer, its status (the `status` query, as
    JSON) and its audit record."""
    ep = await h.episode(task_id)
    job_id = await ep.submit_job(script=script, datasets=datasets or [])
    assert (await ep.wait_job(job_id, step=timedelta(seconds=31))).data["state"] == "succeeded"
    final = await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
    assert final.done, final.data
    await ep.handle.result()
    status = (await ep.status()).model_dump(mode="json")
    record = json.loads((h.settings.state_dir / "audit" / f"{ep.episode_id}.json").read_text())
    validate_record(record)
    return final, status, record


def assert_no_item_text(*seen: object) -> None:
    """Nothing an agent sees quotes an item: neither its text nor a run of its words."""
    text = " ".join(words(json.dumps(seen)))
    for item in ITEMS:
        item_words = words(item["text"])
        for i in range(0, len(item_words) - 5):
            assert " ".join(item_words[i : i + 6]) not in text, item["id"]


async def test_a_script_that_embeds_test_items_is_flagged_with_evidence_in_the_audit_record_only(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, SCENARIO) as h:
        write_contamination_task(
            tmp_path / "tasks", "t_public", 'test_items = "test_items.jsonl"\npolicy = "report"\n'
        )
        final, status, record = await play(h, "t_public", EMBEDDING_SCRIPT)

    counts = {
        "checked": True,
        "flagged": True,
        "policy": "report",
        "matched_items": 1,
        "unread_datasets": 0,
    }
    assert final.metadata["episode_end"] == {"reason": "submitted", "reward": 0.8,
                                             "contamination": counts}  # fmt: skip
    assert final.reward == 0.8  # report: the reward stands
    assert final.data["score"] == 0.8 and final.data["contamination"] == counts
    assert_no_item_text(final.data, final.metadata, status)

    evidence = record["contamination"]["evidence"]
    assert record["contamination"]["summary"] == {**counts, "skipped": None}
    assert evidence["items"] == 3 and evidence["ngram"] == 13 and evidence["threshold"] == 0.5
    (match,) = evidence["matches"]
    digest = hashlib.sha256(EMBEDDING_SCRIPT.encode()).hexdigest()
    assert match["item_id"] == "q-river" and match["places"] == [f"script:{digest}"]
    assert match["found_ngrams"] == match["item_ngrams"] > 1
    assert match["snippet"] in " ".join(words(ITEMS[0]["text"]))
    # Then what the agent job left under /data/outputs/ (nothing, on the fake backend).
    outputs = f"outputs:{final.data['job_id']}"
    assert [s["where"] for s in evidence["sources"]] == [f"script:{digest}", outputs]


async def test_a_mounted_dataset_that_holds_test_items_is_flagged_and_zero_reward_is_applied(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, SCENARIO) as h:
        write_contamination_task(
            tmp_path / "tasks",
            "t_strict",
            'test_items = "test_items.jsonl"\npolicy = "zero_reward"\n',
        )
        final, status, record = await play(
            h, "t_strict", CLEAN_SCRIPT, ["test-org/clean", "test-org/leaky"]
        )

    counts = {
        "checked": True,
        "flagged": True,
        "policy": "zero_reward",
        "matched_items": 2,
        "unread_datasets": 0,
    }
    assert final.metadata["episode_end"] == {"reason": "submitted", "reward": 0.0,
                                             "contamination": counts}  # fmt: skip
    assert final.reward == 0.0 and final.data["score"] == 0.0
    assert status["end"]["reward"] == 0.0
    assert_no_item_text(final.data, final.metadata, status)

    assert record["end"]["reward"] == 0.0
    evidence = record["contamination"]["evidence"]
    leaky = f"dataset:test-org/leaky@{LEAKY_REVISION}"
    assert {m["item_id"]: m["places"] for m in evidence["matches"]} == {
        "q-metal": [f"{leaky}/data/train.jsonl"],
        "q-planet": [f"{leaky}/data/train.jsonl"],
    }
    sources = {s["where"]: s for s in evidence["sources"]}
    assert set(sources) == {
        f"script:{hashlib.sha256(CLEAN_SCRIPT.encode()).hexdigest()}",
        f"dataset:test-org/clean@{CLEAN_REVISION}",
        leaky,
        f"outputs:{final.data['job_id']}",
    }
    assert sources[leaky]["bytes_read"] > 0 and not sources[leaky]["cut"]


async def test_a_clean_run_is_not_flagged_and_keeps_its_reward_under_zero_reward(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, SCENARIO) as h:
        write_contamination_task(
            tmp_path / "tasks",
            "t_strict",
            'test_items = "test_items.jsonl"\npolicy = "zero_reward"\n',
        )
        final, _status, record = await play(h, "t_strict", CLEAN_SCRIPT, ["test-org/clean"])

    counts = {
        "checked": True,
        "flagged": False,
        "policy": "zero_reward",
        "matched_items": 0,
        "unread_datasets": 0,
    }
    assert final.metadata["episode_end"]["contamination"] == counts
    assert final.reward == 0.8 and final.data["score"] == 0.8
    assert record["contamination"]["evidence"]["matches"] == []
    # The script, the dataset, and the job's (empty) outputs.
    assert len(record["contamination"]["evidence"]["sources"]) == 3


async def test_a_task_whose_hidden_split_is_generated_skips_the_check(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, SCENARIO) as h:
        write_contamination_task(tmp_path / "tasks", "t_generated", 'hidden_split = "generated"\n')
        final, _status, record = await play(h, "t_generated", EMBEDDING_SCRIPT, ["test-org/leaky"])
        episode_id = record["episode_id"]
        history = await h.client.get_workflow_handle(
            episode_workflow_id(episode_id)
        ).fetch_history()

    skipped = {
        "checked": False,
        "flagged": False,
        "policy": "none",
        "matched_items": 0,
        "skipped": "hidden_split_generated",
    }
    assert final.metadata["episode_end"]["contamination"] == skipped
    assert final.reward == 0.8
    assert record["contamination"] == {
        "summary": {**skipped, "unread_datasets": None},
        "evidence": None,
    }
    activities = {
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    assert "write_audit" in activities and "check_contamination" not in activities


async def test_a_task_without_its_test_items_does_not_start_and_says_what_to_run(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """No reward is unchecked by accident: reset refuses the task (`not_ready`), naming the
    command that writes its items and the setting that would accept unchecked rewards."""
    async with running_worker(time_skipping_env, tmp_path, SCENARIO) as h:
        write_contamination_task(
            tmp_path / "tasks", "t_broken", 'test_items = "gone.jsonl"\npolicy = "zero_reward"\n'
        )
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await h.episode("t_broken")
    cause = refused.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "not_ready"
    assert "gone.jsonl" in cause.message
    assert "`posttrain-env tasks fetch t_broken`" in cause.message
    assert "POSTTRAIN_ACCEPT_UNCHECKED_REWARDS=true" in cause.message


async def test_with_unchecked_rewards_accepted_the_episode_runs_and_every_report_says_unchecked(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(
        time_skipping_env, tmp_path, SCENARIO, accept_unchecked_rewards=True
    ) as h:
        write_contamination_task(
            tmp_path / "tasks", "t_broken", 'test_items = "gone.jsonl"\npolicy = "zero_reward"\n'
        )
        final, _status, record = await play(h, "t_broken", EMBEDDING_SCRIPT)

    end = final.metadata["episode_end"]
    assert end["contamination"] == {
        "checked": False,
        "flagged": False,
        "policy": "none",
        "matched_items": 0,
        "skipped": "unchecked",
    }
    assert final.reward == 0.8  # it stands: nothing was looked for
    assert record["contamination"]["summary"]["skipped"] == "unchecked"
    assert "gone.jsonl" in record["contamination"]["evidence"]["error"]


async def test_a_malformed_test_items_file_reports_a_failed_check_and_keeps_the_reward(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, SCENARIO) as h:
        write_contamination_task(
            tmp_path / "tasks", "t_broken", 'test_items = "bad.jsonl"\npolicy = "zero_reward"\n'
        )
        (tmp_path / "tasks" / "t_broken" / "bad.jsonl").write_text("not json\n")
        final, _status, record = await play(h, "t_broken", EMBEDDING_SCRIPT)

    end = final.metadata["episode_end"]
    assert end["contamination"]["checked"] is False
    assert end["contamination"]["skipped"] == "check_failed" and final.reward == 0.8
    assert "bad.jsonl" in record["contamination"]["evidence"]["error"]


async def test_a_dataset_the_check_cannot_read_is_counted_for_the_agent_never_named(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """A dataset gone by the time of the check (here: its commit no longer served) is not
    scanned: the agent's counts say one dataset was not read, without saying which; the audit
    record names it and why."""
    scenario = SCENARIO.model_copy(deep=True)
    async with running_worker(time_skipping_env, tmp_path, scenario) as h:
        write_contamination_task(
            tmp_path / "tasks", "t_public", 'test_items = "test_items.jsonl"\npolicy = "report"\n'
        )
        ep = await h.episode("t_public")
        job_id = await ep.submit_job(script=CLEAN_SCRIPT, datasets=["test-org/leaky"])
        assert (await ep.wait_job(job_id, step=timedelta(seconds=31))).data["state"] == "succeeded"
        scenario.datasets["test-org/leaky"].revision = "3" * 40  # force-pushed away
        final = await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        await ep.handle.result()
        record = json.loads((h.settings.state_dir / "audit" / f"{ep.episode_id}.json").read_text())

    counts = final.metadata["episode_end"]["contamination"]
    assert counts == {
        "checked": True,
        "flagged": False,
        "policy": "report",
        "matched_items": 0,
        "unread_datasets": 1,
    }
    assert "leaky" not in json.dumps([final.data, final.metadata])
    sources = record["contamination"]["evidence"]["sources"]
    (unread,) = [s for s in sources if s["error"]]
    assert unread["where"] == f"dataset:test-org/leaky@{LEAKY_REVISION}"


async def test_a_real_member_starts_only_once_its_test_items_are_fetched(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """math_word_problems as a fresh deployment has it (no gsm8k_test.jsonl): reset answers
    `not_ready` naming `posttrain-env tasks fetch math_word_problems`; with the file written
    (what the fetch leaves: tests/hf/test_tasks_fetch.py), the same reset starts the episode."""
    async with running_worker(time_skipping_env, tmp_path, SCENARIO) as h:
        for task_id in ("math_word_problems", "math_word_problems_tiny"):
            shutil.copytree(
                TASKS_DIR / task_id,
                tmp_path / "tasks" / task_id,
                ignore=shutil.ignore_patterns("gsm8k_test.jsonl", "__pycache__"),
            )
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await h.episode("math_word_problems")
        cause = refused.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == "not_ready"
        assert "`posttrain-env tasks fetch math_word_problems`" in cause.message
        items = tmp_path / "tasks" / "math_word_problems" / "gsm8k_test.jsonl"
        items.write_text('{"id": "gsm8k-test-0000", "text": "A problem.", "answer": "1"}\n')
        ep = await h.episode("math_word_problems")
        assert ep.reset.setup.task.id == "math_word_problems"
