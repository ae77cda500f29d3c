"""Whole training runs, taking turns: nanoGPT's CPU config, ``attnlab train --arch llama`` and
``attnlab train --preset fast``, each with its own recipe, on tiny Shakespeare.

    PYTHONPATH=src python benchmarks/llama_vs_nanogpt.py /path/to/nanoGPT \\
        --data input.txt [--pairs 2] [--threads default 1]

Each side is one whole process, timed from outside (wall clock, and the CPU seconds the
process and its children used), from start to exit:
- nanoGPT: its README's CPU command (``train.py config/train_shakespeare_char.py
  --device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64
  --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
  --dropout=0.0``) on a private copy of the checkout made once (its ``prepare.py`` runs there
  once, untimed); its val loss is its last evaluation's (step 2000, 20 batches);
- llama: ``attnlab train --data FILE --arch llama`` (its recipe: the LM task's
  ``ARCH_TRAINING``), the val loss of its last evaluation (20 batches);
- fast: ``attnlab train --data FILE --preset fast`` (its recipe: 1100 steps, evaluated once).
nanoGPT's 2000 steps are the budget: ``--arch llama`` trains as many. Each attnlab run
tokenizes the text itself (char, ~0.1 s), inside its timing.

A round runs the three once each, in an order that rotates from round to round, so every side
meets the same drift of a shared machine; ``--pairs`` rounds per thread setting. A thread
setting is ``default`` (OMP_NUM_THREADS unset: each side takes torch's default) or a count
given to every side (equal threads). The table gives each side's median and range, and each
attnlab side's time over nanoGPT's in the same round (median and range over rounds). The
load average before and after each run is printed beside it: on a machine shared with other
jobs, read the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NANOGPT_CPU = ["--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1",
               "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4",
               "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000",
               "--dropout=0.0"]  # fmt: skip
SIDES = ("nanoGPT", "llama", "fast")
NEEDED = ("model.py", "train.py", "configurator.py", "config/train_shakespeare_char.py",
          "data/shakespeare_char/prepare.py")  # fmt: skip


def fail(msg: str) -> None:
    print(f"llama_vs_nanogpt: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def prepare_nanogpt(checkout: Path, data: Path, work: Path) -> Path:
    """A private copy of the checkout with ``data`` as its Shakespeare input, prepared once."""
    src = work / "nanogpt"
    shutil.copytree(checkout, src, ignore=shutil.ignore_patterns(".git"))
    shutil.copy(data, src / "data" / "shakespeare_char" / "input.txt")
    stubs = work / "stubs"  # prepare.py imports requests; with input.txt there it never calls it
    stubs.mkdir()
    (stubs / "requests.py").write_text("def get(*a, **k):\n    raise RuntimeError('offline')\n")
    env = _env(None, stubs)
    subprocess.run([sys.executable, "data/shakespeare_char/prepare.py"], cwd=src, env=env,
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    return src


def _env(threads: str | None, stubs: Path | None = None) -> dict:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    if stubs is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(stubs), env.get("PYTHONPATH", "")])
    return env


def timed(cmd: list[str], cwd: Path | None, env: dict, log: Path) -> tuple[float, float, str]:
    """Run ``cmd`` to its end -> (wall seconds, CPU seconds of it and its children, output)."""
    before = os.times()
    wall = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - wall
    after = os.times()
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    text = log.read_text()
    if done.returncode:
        fail(f"{cmd[:4]} exited {done.returncode}; its output is in {log}")
    return wall, cpu, text


def run_side(side: str, threads: str, args, work: Path, nano: Path, n: int) -> dict:
    log = work / f"{side}-{threads}-{n}.log"
    env = _env(None if threads == "default" else threads)
    if side == "nanoGPT":
        out = work / f"nano-out-{n}"
        cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", *NANOGPT_CPU,
               f"--out_dir={out}", *([f"--max_iters={args.iters}"] if args.iters else [])]  # fmt: skip
        wall, cpu, text = timed(cmd, nano, env, log)
        evals = re.findall(r"step (\d+): train loss [\d.]+, val loss ([\d.]+)", text)
        step, val = int(evals[-1][0]), float(evals[-1][1])
        shutil.rmtree(out, ignore_errors=True)
    else:
        out = work / f"{side}-out-{n}"
        recipe = ["--arch", "llama"] if side == "llama" else ["--preset", "fast"]
        cmd = [sys.executable, "-m", "attnlab", "train", "--data", str(args.data), *recipe,
               "--out", str(out), "--quiet", "--json",
               *(["--max-iters", str(args.iters)] if args.iters else [])]  # fmt: skip
        wall, cpu, text = timed(cmd, None, env, log)
        result = json.loads(text.strip().splitlines()[-1])
        step, val = result["step"], result["val_loss"]
        shutil.rmtree(out, ignore_errors=True)
    return dict(side=side, threads=threads, round=n, wall_s=wall, cpu_s=cpu, val_loss=val,
                step=step)  # fmt: skip


def summary(results: list[dict], threads: str) -> list[str]:
    rows = [r for r in results if r["threads"] == threads]
    by = {s: [r for r in rows if r["side"] == s] for s in SIDES}
    lines = [f"threads {threads}: {len(by['nanoGPT'])} rounds",
             f"  {'side':<8} {'steps':>5} {'val loss (each round)':<24} {'wall s median (range)':<24}"
             f" {'x nanoGPT wall':<22} {'x nanoGPT CPU':<14}"]  # fmt: skip
    nano = {r["round"]: r for r in by["nanoGPT"]}
    for side in SIDES:
        rs = by[side]
        if not rs:
            continue
        walls = [r["wall_s"] for r in rs]
        vals = ", ".join(f"{r['val_loss']:.4f}" for r in rs)
        span = f"{statistics.median(walls):.1f} ({min(walls):.1f}-{max(walls):.1f})"
        ratio = cpu_ratio = ""
        if side != "nanoGPT":
            w = [r["wall_s"] / nano[r["round"]]["wall_s"] for r in rs if r["round"] in nano]
            c = [r["cpu_s"] / nano[r["round"]]["cpu_s"] for r in rs if r["round"] in nano]
            if w:
                ratio = f"{statistics.median(w):.2f} ({min(w):.2f}-{max(w):.2f})"
                cpu_ratio = f"{statistics.median(c):.2f}"
        lines.append(f"  {side:<8} {rs[0]['step']:>5} {vals:<24} {span:<24} {ratio:<22} "
                     f"{cpu_ratio:<14}")  # fmt: skip
    return lines


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("nanogpt", type=Path, nargs="?", help="a nanoGPT checkout (copied, then run)")
    p.add_argument("--data", type=Path, help="tiny Shakespeare's input.txt")
    p.add_argument("--pairs", type=int, default=2, help="rounds per thread setting")
    p.add_argument("--threads", nargs="+", default=["default", "1"],
                   help="thread settings: default (each side's own) or a count for every side")  # fmt: skip
    p.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    p.add_argument("--iters", type=int,
                   help="every side trains this many steps (a smoke run; default: each its own)")  # fmt: skip
    p.add_argument("--log", type=Path, help="also append each run as a JSON line to this file")
    p.add_argument("--table", type=Path, metavar="LOG",
                   help="print the table of the runs a --log file holds, and run nothing")  # fmt: skip
    args = p.parse_args()
    if args.table:
        results = [json.loads(line) for line in args.table.read_text().splitlines() if line]
        for threads in dict.fromkeys(r["threads"] for r in results):
            print("\n".join(summary(results, threads)))
        return
    if args.nanogpt is None or args.data is None:
        fail("give a nanoGPT checkout and --data (or --table LOG)")
    for f in NEEDED:
        if not (args.nanogpt / f).is_file():
            fail(f"{args.nanogpt / f} not found (is this a nanoGPT checkout?)")
    if not args.data.is_file():
        fail(f"data file {args.data} not found")
    if (
        args.pairs < 1
        or (args.iters is not None and args.iters < 1)
        or any(t != "default" and not t.isdigit() for t in args.threads)
    ):
        fail("--pairs and --iters are at least 1; --threads takes default or a number")
    args.data = args.data.resolve()
    import torch

    results = []
    with tempfile.TemporaryDirectory(prefix="llama_vs_nanogpt.") as tmp:
        work = Path(tmp)
        nano = prepare_nanogpt(args.nanogpt, args.data, work)
        print(f"# torch {torch.__version__}, default threads {torch.get_num_threads()}, "
              f"{os.cpu_count()} CPUs, python {sys.version.split()[0]}", flush=True)  # fmt: skip
        n = 0
        for threads in args.threads:
            for _ in range(args.pairs):
                k = n % len(args.sides)
                order = args.sides[k:] + args.sides[:k]  # rotates: each side goes first in turn
                for side in order:
                    load0 = os.getloadavg()[0]
                    r = run_side(side, threads, args, work, nano, n)
                    r.update(load_start=load0, load_end=os.getloadavg()[0])
                    results.append(r)
                    print(f"# round {n} threads {threads} {side:<7} wall {r['wall_s']:6.1f} s  "
                          f"CPU {r['cpu_s']:6.1f} s  val {r['val_loss']:.4f} at step "
                          f"{r['step']}  load {load0:.2f} -> {r['load_end']:.2f}", flush=True)  # fmt: skip
                    if args.log:
                        with open(args.log, "a") as f:
                            f.write(json.dumps(r) + "\n")
                n += 1
    print()
    for threads in args.threads:
        print("\n".join(summary(results, threads)))


if __name__ == "__main__":
    main()
