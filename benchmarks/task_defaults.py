"""Each task trained with its defaults: `attnlab train --task T --data D [--arch A]` and no tuning
flag, then its figure, as the table of defaults in docs/training.md states it.

    OMP_NUM_THREADS=1 python benchmarks/task_defaults.py \\
        --text /work/shared/data/tinyshakespeare/input.txt [--only lm,digits] [--keep runs/defaults] \\
        [--seeds 1337,1,2]

Runs one after another (about 15-25 CPU-minutes in all on one thread) and prints a markdown
table: the command, the figure (held-out, as `attnlab eval` or the run's config.json states it)
and the wall time. The machine's load average is printed beside each, since a shared machine
inflates the times. With `--seeds`, each task is trained once per seed (`--seed S`; 1337 is the
default seed) and the table gives each seed's figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANGUAGES = ROOT / "examples" / "language_en_es.tsv"


def runs(text: str) -> dict[str, list[str]]:
    """name -> the arguments of `attnlab train` (no tuning flags)."""
    return {
        "lm": ["--data", text],
        "mlm": ["--task", "mlm", "--data", text],
        "classify": ["--task", "classify", "--data", str(LANGUAGES)],
        "dates-transformer": ["--task", "seq2seq", "--data", "dates", "--arch", "transformer"],
        "dates-lstm-attention": [
            "--task",
            "seq2seq",
            "--data",
            "dates",
            "--arch",
            "lstm-attention",
        ],
        "digits": ["--task", "classify", "--data", "digits", "--arch", "vit"],
        "induction": ["--task", "induction"],
    }


def attnlab(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "attnlab", *args], env=env, text=True,
                          capture_output=True)  # fmt: skip


def figure(name: str, run: Path) -> str:
    cfg = json.loads((run / "config.json").read_text())
    m = cfg.get("metrics", {})
    if name == "lm":
        return f"val loss {m['val_loss']:.3f} ({m['val_bpc']:.3f} bits/char)"
    if name == "mlm":
        return f"masked accuracy {m['val_masked_accuracy']:.1%} (val loss {m['val_loss']:.3f})"
    if name == "classify":
        return f"held-out accuracy {m['val_accuracy']:.1%} ({m['val_correct']}/{m['val_examples']})"
    if name == "induction":
        return (f"repeated-half loss {m['loss_repeated_half']:.3f} nats, first half "
                f"{m['loss_first_half']:.3f} (ln 64 = 4.159)")  # fmt: skip
    if name == "digits":
        return f"test accuracy {cfg['test_accuracy']:.1%} ({cfg['test_correct']}/{cfg['n_test']})"
    r = attnlab("eval", str(run), "--json")  # the test split, never trained on
    res = json.loads(r.stdout)
    return f"test exact match {res['exact_match']:.1%} ({res['pairs']} dates)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--text", required=True, help="tiny shakespeare's input.txt")
    p.add_argument("--only", default="", help="comma-separated names (default: all)")
    p.add_argument("--keep", default=None, help="keep the runs under this directory")
    p.add_argument("--seeds", default="1337", help="comma-separated seeds (default: 1337)")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    todo = runs(args.text)
    if args.only:
        todo = {k: v for k, v in todo.items() if k in args.only.split(",")}
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="attnlab-defaults-"))
    rows = []
    for name, train in todo.items():
        for seed in seeds:
            out = base / (name if seed == 1337 else f"{name}-seed{seed}")
            extra = [] if seed == 1337 else ["--seed", str(seed)]
            t0 = time.perf_counter()
            r = attnlab("train", *train, *extra, "--out", str(out), "--quiet")
            wall = time.perf_counter() - t0
            if r.returncode != 0:
                sys.exit(f"{name}: attnlab train failed:\n{r.stderr}")
            load = os.getloadavg()[0]
            fig = figure(name, out)
            rows.append((name, seed, "attnlab train " + " ".join(train), fig, wall, load))
            print(f"{name} seed {seed}: {fig}, {wall:.0f} s (load average {load:.1f})", flush=True)
    print("\n| task | seed | command | figure | wall time |\n|---|---|---|---|---|")
    for name, seed, cmd, fig, wall, load in rows:
        print(f"| {name} | {seed} | `{cmd}` | {fig} | {wall:.0f} s (load {load:.1f}) |")


if __name__ == "__main__":
    main()
