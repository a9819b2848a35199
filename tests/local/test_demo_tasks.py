"""`posttrain-env demo --task ... --script ...` on a task family's tiny member, as a user (and
the acceptance check) runs it: a submission trained on the public test set goes through the
whole stack (dev server, gateway over HTTP, local jobs in bubblewrap, the grader, the
contamination check) and ends flagged, its reward zeroed, in the printed counts, the episode's
end and the audit record (slow: it installs torch in a job and grades a model)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.local.test_math_word_problems import CONTAMINATED

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_a_submission_trained_on_the_hidden_split_is_flagged_through_the_demo(
    tmp_path: Path,
) -> None:
    script = tmp_path / "contaminated.py"
    script.write_text(CONTAMINATED)
    exe = Path(sys.executable).with_name("posttrain-env")
    env = {**os.environ, "POSTTRAIN_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run(
        [str(exe), "demo", "--task", "math_word_problems_tiny", "--script", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1700,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert re.search(r"job job-[0-9a-f]{12}: succeeded", out), out[-3000:]
    assert "done: True, reward: 0.0" in out, out[-3000:]
    printed = re.search(r"contamination check: (\{.*\})", out)
    assert printed is not None, out[-3000:]
    counts = json.loads(printed.group(1))
    assert counts["checked"] is True and counts["flagged"] is True
    assert counts["policy"] == "zero_reward" and counts["matched_items"] > 0
    # The audit record keeps the evidence: which items, found where (the job's outputs).
    (audit,) = (tmp_path / "state" / "demo" / "audit").glob("*.json")
    record = json.loads(audit.read_text())
    evidence = record["contamination"]["evidence"]
    assert record["contamination"]["summary"]["flagged"] is True
    assert evidence["matches"] and any(
        place.startswith("outputs:") for match in evidence["matches"] for place in match["places"]
    ), evidence["matches"][:2]
