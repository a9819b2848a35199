"""Run the Inspect task (`posttrain_env/posttrain`) with a scripted `mockllm/model` that plays
the specification's flow, in a process of its own, as a user's `inspect eval` would:

    python -m tests.gateway.inspect_driver <server> <task_id> <log_dir> <script_file> [<tool>]

The model submits `script_file` as a training job, waits for it, asks for a dev evaluation and
submits it; given a `<tool>`, it fails (raises) right after that tool's result, as a model
provider's outage fails a sample. Every output carries its `usage` (mockllm would otherwise
count tokens with tiktoken, which downloads its encoding: no network here). Prints a JSON
summary of the log.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from inspect_ai import eval as inspect_eval
from inspect_ai.model import (
    ChatMessage,
    ChatMessageTool,
    GenerateConfig,
    ModelOutput,
    ModelUsage,
    get_model,
)
from inspect_ai.tool import ToolChoice, ToolInfo

USAGE = ModelUsage(input_tokens=10, output_tokens=10, total_tokens=20)


def first_json(text: str) -> dict[str, Any]:
    """The tool's data: the first JSON object of a tool result's text."""
    value, _ = json.JSONDecoder().raw_decode(text[text.index("{") :])
    return value


class ScriptedAgent:
    """jobs_submit -> jobs_wait until the job ends -> dev_evaluate -> submit -> a final word."""

    def __init__(self, script: str, fail_after: str | None = None) -> None:
        self.script = script
        self.fail_after = fail_after

    def __call__(
        self,
        input: list[ChatMessage],
        tools: list[ToolInfo],
        tool_choice: ToolChoice,
        config: GenerateConfig,
    ) -> ModelOutput:
        results = [m for m in input if isinstance(m, ChatMessageTool)]
        if not results:
            return self.call(
                "jobs_submit",
                script=self.script,
                flavor="cpu-basic",
                timeout_minutes=5,
            )
        last = results[-1]
        if last.function == self.fail_after:
            raise RuntimeError(f"the scripted model fails after {last.function}")
        data = first_json(last.text)
        job_id = first_json(next(m.text for m in results if m.function == "jobs_submit")).get(
            "job_id"
        )
        if last.function in ("jobs_submit", "jobs_wait") and data.get("state") in (
            "queued",
            "running",
        ):
            return self.call("jobs_wait", job_id=job_id, timeout_s=60)
        if last.function == "jobs_wait":
            return self.call("dev_evaluate", job_id=job_id)
        if last.function == "dev_evaluate":
            return self.call("submit", job_id=job_id)
        return ModelOutput.from_content(
            "mockllm/model", "Submitted.", stop_reason="stop"
        ).model_copy(update={"usage": USAGE})

    @staticmethod
    def call(tool: str, **arguments: Any) -> ModelOutput:
        output = ModelOutput.for_tool_call("mockllm/model", tool, arguments)
        output.usage = USAGE
        return output


def main() -> None:
    server, task_id, log_dir, script_file = sys.argv[1:5]
    fail_after = sys.argv[5] if len(sys.argv) > 5 else None
    agent = ScriptedAgent(Path(script_file).read_text(), fail_after)
    model = get_model("mockllm/model", custom_outputs=agent)
    [log] = inspect_eval(
        "posttrain_env/posttrain",
        task_args={"task_id": task_id, "server": server},
        model=model,
        log_dir=log_dir,
        display="none",
    )
    samples = [
        {
            "id": sample.id,
            "scores": {
                name: {
                    "value": score.value,
                    "reason": score.reason,
                    "explanation": score.explanation,
                    "metadata": score.metadata,
                }
                for name, score in (sample.scores or {}).items()
            },
            "metadata": sample.metadata,
            "error": sample.error.message if sample.error else None,
            "tools": [m.function for m in sample.messages if isinstance(m, ChatMessageTool)],
        }
        for sample in log.samples or []
    ]
    print(json.dumps({"status": log.status, "location": log.location, "samples": samples}))


if __name__ == "__main__":
    main()
