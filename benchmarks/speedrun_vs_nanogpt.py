"""The speedrun against nanoGPT's CPU run: whole processes, taking turns, on tiny Shakespeare.

    PYTHONPATH=src python benchmarks/speedrun_vs_nanogpt.py /path/to/nanoGPT --data input.txt \\
        [--pairs 3] [--threads default 1] [--sides nanoGPT speedrun long same] [--log runs.jsonl]
    PYTHONPATH=src python benchmarks/speedrun_vs_nanogpt.py --table runs.jsonl
    PYTHONPATH=src python benchmarks/speedrun_vs_nanogpt.py /path/to/nanoGPT --data input.txt \\
        --curves docs/speedrun_curves.png [--threads 1]

Sides, each one whole process from start to exit, timed from outside (wall clock, and the CPU
seconds of the process and its children):
- nanoGPT: its README's CPU command (``train.py config/train_shakespeare_char.py
  --device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64
  --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
  --dropout=0.0``) on a private copy of the checkout (its ``prepare.py`` run there once,
  untimed); 9 evaluations of 20 train and 20 val batches of 12 x 64, its val loss the last's;
- speedrun: ``attnlab train --data FILE --preset speedrun`` (its recipe; evaluated at step 0
  and at its end, on the same 20 batches of 12 x 64 of the same val split: the last 10%);
- long: the speedrun preset given more steps (``--max-iters``, ``LONG_STEPS``): what it reaches
  in about nanoGPT's time;
- same: ``attnlab train --data FILE``, nanoGPT's configuration and recipe (the baby preset,
  attnlab's defaults);
- fast, llama: ``--preset fast`` and ``--arch llama`` (for the picture).
Round n trains attnlab's sides with seed ``SEEDS[n % 3]`` (nanoGPT's own seed is fixed in its
train.py), so the rounds' range is also the seeds' range. A round runs each side once, in an order that rotates from round to round, so every side meets
the same drift of a shared machine; ``--pairs`` rounds per thread setting, ``default`` (every
side its own threads: OMP_NUM_THREADS unset) or a count given to every side (equal threads).
The table gives each side's median and range, and its time over nanoGPT's in the same round.
The load average before and after each run is printed beside it.

``--curves PNG`` runs each side once more with evaluations along the way (attnlab's every
tenth of its run; nanoGPT's own every 250 steps) and draws val loss against the seconds its
training steps took (from each log: nanoGPT's per-iteration times, attnlab's ms_per_iter;
evaluations and start-up left out), each curve ending at its run's whole-process time.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_vs_nanogpt import NANOGPT_CPU, NEEDED, prepare_nanogpt  # noqa: E402

TARGET, GOAL = 1.886, 1.60  # nanoGPT's val loss at its step 2000; the long run's aim
LONG_STEPS = 1200
SEEDS = (1337, 1, 2)  # attnlab's seed in round n: SEEDS[n % 3] (nanoGPT's is fixed at 1337)
SIDES = {  # side -> the arguments of `attnlab train` after --data (nanoGPT: its own command)
    "nanoGPT": None,
    "speedrun": ["--preset", "speedrun"],
    "long": ["--preset", "speedrun", "--max-iters", str(LONG_STEPS)],
    "same": [],
    "fast": ["--preset", "fast"],
    "llama": ["--arch", "llama"],
}
COLOURS = {"nanoGPT": "black", "same": "grey", "fast": "tab:blue", "llama": "tab:green",
           "speedrun": "tab:red", "long": "tab:orange"}  # fmt: skip


def fail(msg: str) -> None:
    print(f"speedrun_vs_nanogpt: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def env_for(threads: str | None) -> dict:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if threads not in (None, "default"):
        env["OMP_NUM_THREADS"] = threads
    src = Path(__file__).resolve().parents[1] / "src"
    env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    return env


def timed(cmd: list[str], cwd: Path | None, env: dict, log: Path) -> tuple[float, float, str]:
    """Run ``cmd`` to its end -> (wall seconds, CPU seconds of it and its children, output)."""
    before, wall = os.times(), time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    wall, after = time.perf_counter() - wall, os.times()
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    if done.returncode:
        fail(f"{cmd[:6]} exited {done.returncode}; its output is in {log}")
    return wall, cpu, log.read_text()


def nanogpt_curve(text: str) -> list[tuple[float, float]]:
    """(seconds of training steps before it, val loss) at each of nanoGPT's evaluations: the
    iteration times its log prints (log_interval 1), the evaluation's own iteration left out."""
    evals = {
        int(s): float(v)
        for s, v in re.findall(r"step (\d+): train loss [\d.]+, val loss ([\d.]+)", text)
    }
    iters = [
        (int(i), float(ms))
        for i, ms in re.findall(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", text)
    ]
    out, spent = [], 0.0
    for i, ms in iters:
        if i in evals:
            out.append((spent, evals[i]))
        if i not in evals:  # an evaluation's iteration time holds the evaluation
            spent += ms / 1000
    last = max(evals)
    if last not in dict(iters):
        out.append((spent, evals[last]))
    return out


def attnlab_curve(run: Path) -> list[tuple[float, float]]:
    """(seconds of training steps before it, val loss) at each evaluation of an attnlab run:
    the sum of its log lines' ms_per_iter over the steps they cover (evaluations left out)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    out, spent, last_step = [], 0.0, 0
    for r in rows:
        if "val_loss" in r:
            out.append((spent, r["val_loss"]))
        else:
            spent += r["ms_per_iter"] / 1000 * (r["step"] - last_step)
            last_step = r["step"]
    return out


def run_side(side: str, threads: str, args, work: Path, nano: Path, n: int, more=()) -> dict:
    log = work / f"{side}-{threads}-{n}.log"
    env = env_for(threads)
    out = work / f"{side}-out-{n}"
    if side == "nanoGPT":
        cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", *NANOGPT_CPU,
               f"--out_dir={out}", *more]  # fmt: skip
        wall, cpu, text = timed(cmd, nano, env, log)
        evals = re.findall(r"step (\d+): train loss [\d.]+, val loss ([\d.]+)", text)
        step, val = int(evals[-1][0]), float(evals[-1][1])
        curve = nanogpt_curve(text)
    else:
        cmd = [sys.executable, "-m", "attnlab", "train", "--data", str(args.data), *SIDES[side],
               "--out", str(out), "--quiet", "--json", "--seed", str(SEEDS[n % len(SEEDS)]),
               *more]  # fmt: skip
        wall, cpu, text = timed(cmd, None, env, log)
        result = json.loads(text.strip().splitlines()[-1])
        step, val = result["step"], result["val_loss"]
        curve = attnlab_curve(out)
    shutil.rmtree(out, ignore_errors=True)
    return dict(side=side, threads=threads, round=n, wall_s=wall, cpu_s=cpu, val_loss=val,
                step=step, curve=curve)  # fmt: skip


def _span(xs: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def summary(results: list[dict], threads: str) -> list[str]:
    rows = [r for r in results if r["threads"] == threads]
    sides = list(dict.fromkeys(r["side"] for r in rows))
    nano = {r["round"]: r for r in rows if r["side"] == "nanoGPT"}
    loads = [x for r in rows for x in (r.get("load_start", 0), r.get("load_end", 0))]
    lines = [f"threads {threads}: {len(nano)} rounds, load {min(loads):.1f}-{max(loads):.1f}",
             f"  {'side':<9} {'steps':>5} {'val loss, median (range)':<25} "
             f"{'wall s, median (range)':<23} {'x nanoGPT wall':<19} {'x nanoGPT CPU':<13}"]  # fmt: skip
    for side in sides:
        rs = [r for r in rows if r["side"] == side]
        ratio = cpu = ""
        if side != "nanoGPT" and nano:
            w = [r["wall_s"] / nano[r["round"]]["wall_s"] for r in rs if r["round"] in nano]
            c = [r["cpu_s"] / nano[r["round"]]["cpu_s"] for r in rs if r["round"] in nano]
            ratio, cpu = _span(w, "{:.3f}"), _span(c, "{:.2f}")
        lines.append(f"  {side:<9} {rs[0]['step']:>5} {_span([r['val_loss'] for r in rs], '{:.4f}'):<25} "
                     f"{_span([r['wall_s'] for r in rs], '{:.1f}'):<23} {ratio:<19} {cpu:<13}".rstrip())  # fmt: skip
    return lines


def draw(results: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    for r in results:
        xs, ys = zip(*r["curve"]) if r["curve"] else ((), ())
        label = {"same": "attnlab, nanoGPT's config", "fast": "--preset fast", "llama":
                 "--arch llama", "speedrun": "--preset speedrun", "long":
                 f"--preset speedrun --max-iters {LONG_STEPS}"}.get(r["side"], r["side"])  # fmt: skip
        ax.plot(xs, ys, marker="o", ms=3, color=COLOURS[r["side"]],
                label=f"{label}: {r['val_loss']:.3f} in {r['wall_s']:.0f} s")  # fmt: skip
        ax.plot([xs[-1], r["wall_s"]], [ys[-1], ys[-1]], ls=":", color=COLOURS[r["side"]])
    for y, what in ((TARGET, "nanoGPT's 1.886"), (GOAL, "1.60")):
        ax.axhline(y, color="0.6", lw=0.8, ls="--")
        ax.text(0, y, what, va="bottom", fontsize=8, color="0.4")
    ax.set_ylim(1.45, 2.6)
    ax.set_xlabel("seconds of training steps (dotted: on to the whole process's end)")
    ax.set_ylabel("val loss (nats/char, 20 batches of 12 x 64)")
    threads = results[0]["threads"]
    ax.set_title(f"tiny Shakespeare, char-level, 2-core CPU, threads: {threads}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("nanogpt", type=Path, nargs="?", help="a nanoGPT checkout (copied, then run)")
    p.add_argument("--data", type=Path, help="tiny Shakespeare's input.txt")
    p.add_argument("--pairs", type=int, default=3, help="rounds per thread setting")
    p.add_argument("--threads", nargs="+", default=["default", "1"],
                   help="default (each side's own) or a count for every side")  # fmt: skip
    p.add_argument("--sides", nargs="+", default=["nanoGPT", "speedrun", "long", "same"],
                   choices=list(SIDES))  # fmt: skip
    p.add_argument("--log", type=Path, help="append each run as a JSON line to this file")
    p.add_argument("--table", type=Path, metavar="LOG", help="print the table of a --log file")
    p.add_argument("--curves", type=Path, metavar="PNG",
                   help="one run of each of nanoGPT, fast, llama, speedrun and long with "
                   "evaluations along the way, drawn as val loss against time")  # fmt: skip
    args = p.parse_args()
    if args.table:
        results = [json.loads(x) for x in args.table.read_text().splitlines() if x.strip()]
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
    if args.pairs < 1 or any(t != "default" and not t.isdigit() for t in args.threads):
        fail("--pairs is at least 1; --threads takes default or a number")
    args.data = args.data.resolve()
    import torch

    with tempfile.TemporaryDirectory(prefix="speedrun_vs_nanogpt.") as tmp:
        work = Path(tmp)
        nano = prepare_nanogpt(args.nanogpt, args.data, work)
        print(f"# torch {torch.__version__}, default threads {torch.get_num_threads()}, "
              f"{os.cpu_count()} CPUs, python {sys.version.split()[0]}", flush=True)  # fmt: skip
        if args.curves:
            results = []
            for side in ("nanoGPT", "fast", "llama", "speedrun", "long"):
                steps = {"speedrun": 300, "long": LONG_STEPS, "fast": 1100}.get(side)
                more = [] if steps is None else ["--eval-interval", str(steps // 10)]
                r = run_side(side, args.threads[0], args, work, nano, 0, more)
                print(f"# {side:<8} wall {r['wall_s']:6.1f} s  val {r['val_loss']:.4f}  "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
                results.append(r)
            draw(results, args.curves)
            print(f"wrote {args.curves}")
            return
        results, n = [], 0
        for threads in args.threads:
            for _ in range(args.pairs):
                k = n % len(args.sides)
                for side in args.sides[k:] + args.sides[:k]:  # each side goes first in turn
                    load0 = os.getloadavg()[0]
                    r = run_side(side, threads, args, work, nano, n)
                    r.update(load_start=load0, load_end=os.getloadavg()[0])
                    results.append(r)
                    print(f"# round {n} threads {threads} {side:<8} wall {r['wall_s']:6.1f} s  "
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
