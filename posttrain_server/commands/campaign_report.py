"""`posttrain-env campaign report <id> [--compare <other id>]`: from the campaign folders only
(no Temporal), so a report can be written anywhere the folders are, at any time."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

REPORT_DIR = "report"


def add_report_command(commands: Any) -> None:
    report = commands.add_parser(
        "report", help="tables, intervals and plots of a campaign, from its records"
    )
    report.add_argument("id")
    report.add_argument("--compare", metavar="OTHER_ID", help="which cells moved since OTHER_ID")
    report.add_argument("--out", type=Path, help="where to write (default: <folder>/report)")
    report.add_argument("--seed", type=int, help="the bootstrap's seed (default 0)")
    report.add_argument("--resamples", type=int, help="bootstrap resamples (default 10000)")


def report_command(args: argparse.Namespace, campaign_root: Path, out: TextIO) -> int:
    from posttrain_common.campaigns.records import read_records
    from posttrain_server.campaigns.report import (
        DEFAULT_RESAMPLES,
        DEFAULT_SEED,
        build_report,
        compare,
    )
    from posttrain_server.campaigns.report_files import (
        COMPARISON_MD,
        SUMMARY_MD,
        comparison_text,
        table_markdown,
        write_report,
    )

    seed = DEFAULT_SEED if args.seed is None else args.seed
    resamples = DEFAULT_RESAMPLES if args.resamples is None else args.resamples
    reports = {}
    for campaign_id in filter(None, (args.id, args.compare)):
        folder = campaign_root / campaign_id
        records = read_records(folder)
        if not records:
            print(
                f"posttrain-env campaign: no records in {folder} (is POSTTRAIN_CAMPAIGNS_DIR set?)",
                file=sys.stderr,
            )
            return 1
        reports[campaign_id] = build_report(campaign_id, records, seed, resamples)
    report = reports[args.id]
    target = args.out or campaign_root / args.id / REPORT_DIR
    write_report(report, target)
    print(table_markdown(report), file=out)
    if args.compare:
        text = comparison_text(compare(report, reports[args.compare]))
        (target / COMPARISON_MD).write_text(text + "\n", encoding="utf-8")
        print(text, file=out)
    print(f"report written to {target / SUMMARY_MD}", file=out)
    return 0
