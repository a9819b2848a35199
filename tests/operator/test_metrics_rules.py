"""The alert rules (deploy/alerts.yml) name only metrics we export, each has a promtool unit test,
and promtool passes them; our metrics carry bounded labels only."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from posttrain_common import metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "alerts.test.yml"
# Series Prometheus makes itself for every scrape target.
BUILT_IN = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
}
# Every label any of our metrics has: bounded sets, never an id or a secret.
ALLOWED_LABELS = {"tool", "path", "kind", "state", "backend", "activity_type", "holder"}


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def metric_names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: its identifiers, less strings, label
    matchers, grouping labels, range and offset durations, functions and keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', " ", expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    grouping = r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
    text = re.sub(grouping, " ", text)
    text = re.sub(r"\boffset\s+\w+", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call is None and name.lower() not in KEYWORDS:
            names.add(name)
    return names


def test_the_name_extraction_finds_metrics_and_skips_functions_labels_and_keywords() -> None:
    expr = (
        'sum by (kind) (rate(a_total{job="x",kind=~"y|z"}[5m] offset 1h)) / on(kind) '
        "max(b) > 0.5 and absent(c == 1) or time() - d unless e{f='g'}"
    )
    assert metric_names_in(expr) == {"a_total", "b", "c", "d", "e"}


def test_every_alert_names_only_metrics_we_export() -> None:
    exported = metrics.metric_names() | BUILT_IN
    for rule in rules():
        names = metric_names_in(rule["expr"])
        assert names, f"{rule['alert']}: no metric found in {rule['expr']!r}"
        unknown = names - exported
        assert not unknown, f"{rule['alert']} names metrics we do not export: {unknown}"


def test_the_rules_cover_the_alerts_the_operator_needs() -> None:
    used = set().union(*(metric_names_in(rule["expr"]) for rule in rules()))
    assert {
        "posttrain_oldest_unconfirmed_cancellation_age_seconds",
        "posttrain_ended_episode_reservations",
        "posttrain_backend_errors_total",
        "posttrain_worker_info",
        "posttrain_gateway_payload_refusals_total",
    } <= used


def test_every_alert_has_a_unit_test() -> None:
    document = yaml.safe_load(RULE_TESTS.read_text())
    tested = {case["alertname"] for test in document["tests"] for case in test["alert_rule_test"]}
    assert {rule["alert"] for rule in rules()} == tested


def test_our_metrics_carry_only_bounded_labels() -> None:
    declared = [value for value in vars(metrics).values() if hasattr(value, "_labelnames")]
    assert len(declared) >= 15
    for metric in declared:
        assert set(metric._labelnames) <= ALLOWED_LABELS, metric._name
        assert metric._name.startswith(metrics.PREFIX)


@pytest.mark.parametrize(
    "command",
    [["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]],
    ids=["check", "test"],
)
def test_promtool_passes_the_rules(command: list[str]) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; CI does)")
    done = subprocess.run([promtool, *command], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
