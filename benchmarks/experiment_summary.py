"""Markdown tables of experiment reports, as docs/experiments.md shows them.

    attnlab experiment pruning --out reports/pruning        # each experiment, its defaults
    python benchmarks/experiment_summary.py reports/pruning reports/rollout-and-flow ...

For each OUT directory it reads OUT/figures.json (what ``attnlab experiment`` wrote) and
prints each published finding with the sentences the report computed from its numbers (the
range over the seeds and the verdict), the report's tables, and how long the run took. Nothing is recomputed or rounded
differently: the cells are the report's own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(cell(h) or " " for h in header) + " |",
           "|" + "---|" * len(header)]  # fmt: skip
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


def summary(out: Path) -> list[str]:
    d = json.loads((out / "figures.json").read_text(encoding="utf-8"))
    s = d["settings"]
    lines = [f"### {d['title']}", "",
             f"`attnlab experiment {d['experiment']} --out reports/{d['experiment']}`: seeds {s['seeds']}, "
             f"{s['threads']} thread(s), {s['seconds'] / 60:.1f} min.", ""]  # fmt: skip
    by_finding: dict[str, list[str]] = {}
    for c in d["claims"]:
        by_finding.setdefault(c["published"], []).append(c["sentence"])
    for published, sentences in by_finding.items():
        lines += [f"**Published:** {published}", ""] + [f"- {s}" for s in sentences] + [""]
    for t in d["tables"]:
        lines += [f"**{t['title']}**", ""] + table(t["header"], t["rows"]) + [""]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("reports", nargs="+", type=Path, help="OUT directories of attnlab experiment")
    args = p.parse_args(argv)
    for out in args.reports:
        if not (out / "figures.json").is_file():
            print(f"experiment_summary: {out}/figures.json not found (run attnlab experiment "
                  f"NAME --out {out} first)", file=sys.stderr)  # fmt: skip
            return 2
    for out in args.reports:
        print("\n".join(summary(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
