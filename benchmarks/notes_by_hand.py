"""The notes, by hand: the figures docs/interpretability.md states, with the commands that give
them.

    PYTHONPATH=src python benchmarks/notes_by_hand.py toy [--pairs 3] [--out DIR]
    PYTHONPATH=src python benchmarks/notes_by_hand.py split [--seeds 1337,1,2] [--out DIR]
        [--png docs/notes_lets_go.png]

``toy``: the word-level toy, ``attnlab train --data sentences --tokenizer word --preset toy``,
as whole processes timed from outside (wall clock, and the CPU seconds the process used),
taking turns with the same preset on the same sentences read as characters (the baseline:
what a word costs against a character). Each run's val loss (nats a token) and bits per
character, and the load average before and after it: on a machine shared with other jobs, read
the CPU seconds, not the wall clock.

``split``: the notes' "let's go" -> "vamos". Per seed, five phrase-book encoder-decoders, each
with ``attnlab train`` (examples/phrases_en_es.tsv, word tokenizer, batch 32, lr 3e-3, 300
steps): the LSTM with dot attention as it was (1.00 on <eos>), with each change alone (the
scaled-dot score; attention kept off <eos>), with both (the recipe), and the Transformer
(width 64). Then ``attnlab align
... "let's go" --words --json``: each model's output and its first decoder step's weights on
let's, go and <eos> (let's: its tokens let ' s added up). ``--png`` draws the recipe's LSTM
beside the Transformer for the first seed (``attnlab align ... --png``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHRASES = ROOT / "examples" / "phrases_en_es.tsv"
COMMON = ["--task", "seq2seq", "--data", str(PHRASES), "--tokenizer", "word", "--batch-size",
          "32", "--lr", "3e-3", "--max-iters", "300", "--eval-interval", "300", "--quiet"]  # fmt: skip
MODELS = {  # label -> (the run's name, its options)
    "LSTM, dot": ("lstm-dot", ["--arch", "lstm-attention", "--d-model", "128"]),
    "LSTM, scaled-dot": ("lstm-scaled", ["--arch", "lstm-attention", "--d-model", "128",
                                         "--score", "scaled-dot"]),
    "LSTM, dot, off <eos>": ("lstm-off-eos", ["--arch", "lstm-attention", "--d-model", "128",
                                              "--no-attend-eos"]),
    "LSTM, scaled-dot, off <eos>": ("lstm", ["--arch", "lstm-attention", "--d-model", "128",
                                             "--score", "scaled-dot", "--no-attend-eos"]),
    "Transformer": ("transformer", ["--arch", "transformer", "--d-model", "64"]),
}  # fmt: skip
RECIPE = "LSTM, scaled-dot, off <eos>"
SOURCE = "let's go"


def attnlab(*args: str, check: bool = True) -> tuple[subprocess.CompletedProcess, float, float]:
    """``python -m attnlab ARGS`` as a whole process: (result, wall seconds, CPU seconds)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "attnlab", *args], env=env, capture_output=True,
                       text=True)  # fmt: skip
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if check and r.returncode != 0:
        raise SystemExit(f"attnlab {' '.join(args)}: exit {r.returncode}\n{r.stderr}")
    return r, wall, cpu


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def span(xs: list[float], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def toy(args) -> None:
    sides = {"word": "word", "char (baseline)": "char"}
    rows: dict[str, list[tuple[float, float, float, float]]] = {s: [] for s in sides}
    print("| round | side | wall s | CPU s | val loss | bits/char | load before -> after |")
    print("|---|---|---|---|---|---|---|")
    for n in range(args.pairs):
        order = list(sides) if n % 2 == 0 else list(reversed(sides))  # take turns
        for side in order:
            out = Path(args.out) / f"toy-{sides[side]}-{n}"
            start = load()
            _, wall, cpu = attnlab("train", "--data", "sentences", "--tokenizer", sides[side],
                                   "--preset", "toy", "--out", str(out), "--quiet", "--json")  # fmt: skip
            metrics = json.loads((out / "config.json").read_text())["metrics"]
            rows[side].append((wall, cpu, metrics["val_loss"], metrics["val_bpc"]))
            print(f"| {n} | {side} | {wall:.1f} | {cpu:.1f} | {metrics['val_loss']:.3f} | "
                  f"{metrics['val_bpc']:.3f} | {start} -> {load()} |", flush=True)  # fmt: skip
    print()
    print("| side | wall s | CPU s | val loss (nats a token) | bits/char |")
    print("|---|---|---|---|---|")
    for side, got in rows.items():
        walls, cpus, losses, bpc = zip(*got)
        print(f"| {side} | {span(list(walls))} | {span(list(cpus))} | "
              f"{span(list(losses), '{:.3f}')} | {span(list(bpc), '{:.3f}')} |")  # fmt: skip


def split(args) -> None:
    from attnlab.data.tasks import load_tsv

    seeds = [int(s) for s in args.seeds.split(",")]
    print("| seed | let's go in train | model | output | let's | go | <eos> |")
    print("|---|---|---|---|---|---|---|")
    first = {}
    for seed in seeds:
        held = SOURCE not in {s for s, _ in load_tsv(PHRASES, seed, 0.1, 0.1).train}
        for name, (slug, more) in MODELS.items():
            out = Path(args.out) / f"{slug}-seed{seed}"
            attnlab("train", *COMMON, *more, "--seed", str(seed), "--out", str(out))
            if seed == seeds[0]:
                first[name] = out
            r, _, _ = attnlab("align", str(out), SOURCE, "--words", "--json")
            (m,) = json.loads(r.stdout)["models"]
            w = dict(zip(m["source"], m["steps"][0]["weights"]))
            lets = w.get("let's", 0.0)
            print(f"| {seed} | {'no (held out)' if held else 'yes'} | {name} | {m['output']} | "
                  f"{lets:.2f} | {w.get('go', 0):.2f} | "
                  f"{w.get('<eos>', 0):.2f} |", flush=True)  # fmt: skip
    if args.png:
        pair = [str(first[RECIPE]), str(first["Transformer"])]
        attnlab("align", *pair, SOURCE, "--words", "--png", args.png)
        print(f"\nwrote {args.png}: attnlab align {' '.join(pair)} \"{SOURCE}\" --words --png "
              f"{args.png} (seed {seeds[0]})")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("toy", help="the word-level toy's training time")
    t.add_argument("--pairs", type=int, default=3)
    s = sub.add_parser("split", help="the LSTM's split attention on \"let's go\", per seed")
    s.add_argument("--seeds", default="1337,1,2")
    s.add_argument("--png", default=None)
    for q in (t, s):
        q.add_argument("--out", default=None, help="where the runs go (default: a temporary dir)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="notes-bench-") as tmp:
        args.out = args.out or tmp
        (toy if args.what == "toy" else split)(args)


if __name__ == "__main__":
    main()
