"""What snapshots add to training time at the default interval (issue: less than 5%).

    OMP_NUM_THREADS=1 python benchmarks/snapshot_overhead.py [--task induction] [--rounds 3]
        [-- more attnlab train flags, e.g. --data shakespeare --preset baby --max-iters 400]

Two measurements, on one thread:
1. Paired whole runs, interleaved (with snapshots, without, without, with, ...), each a fresh
   process: the ratio of their CPU times (user + system), and of their wall times. On a shared
   machine the wall ratio is noisy; CPU time is what the snapshots cost.
2. Inside the run with snapshots: the CPU time of one snapshot (the median of 20, taken on the
   trained model exactly as training takes them) against the run's own CPU time per step
   (whole-run CPU / steps), so that overhead = snapshot / (interval x step).
Snapshots at the default interval: --task induction takes one every max_iters // 40 steps;
other tasks take none unless --snapshot-every is given, so for them pass it (the interval this
script reports against is the one the run used).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def run(out: Path, task: str, snapshots: bool, extra: list[str]) -> tuple[float, float]:
    flags = [] if snapshots else ["--snapshot-every", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "attnlab", "train", "--task", task, "--out",
                        str(out), "--quiet", *extra, *flags], env=env, text=True,
                       capture_output=True)  # fmt: skip
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        sys.exit(f"train failed: {r.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def snapshot_cpu(run_dir: Path, repeats: int = 20) -> tuple[float, int, int]:
    """Median CPU seconds of one snapshot of the trained model; the run's interval and steps."""
    from attnlab.run import load_run
    from attnlab.rundir import RunDir, read_run_config
    from attnlab.tasks import open_task
    from attnlab.training.snapshots import PATTERN_TOKENS, Snapshots

    cfg = read_run_config(run_dir)["train_config"]
    model, _ = load_run(run_dir)
    task = open_task(run_dir, with_data=True)
    sample = task.sample_inputs(4, PATTERN_TOKENS)
    inputs, ids = sample if sample is not None else (None, True)
    with tempfile.TemporaryDirectory() as d:
        snaps = Snapshots(cfg["snapshot_every"], inputs, ids, seed=cfg["seed"])

        class Fake:  # what the callback reads of a Trainer
            writes, run, step, raw_model = True, RunDir(d), 0, model

        snaps.on_open(Fake, resumed=False)
        times = []
        for i in range(repeats):
            t0 = time.process_time()
            snaps.take(model, (i + 1) * snaps.every, cfg["max_iters"])
            times.append(time.process_time() - t0)
    return statistics.median(times), cfg["snapshot_every"], cfg["max_iters"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="induction")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("extra", nargs="*", help="more `attnlab train` flags (after --)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="snapshot-overhead-"))
    pairs = []
    for i in range(args.rounds):
        order = (True, False) if i % 2 == 0 else (False, True)
        got = {}
        for snap in order:
            got[snap] = run(root / f"r{i}-{'on' if snap else 'off'}", args.task, snap, args.extra)
        pairs.append(got)
        (w1, c1), (w0, c0) = got[True], got[False]
        print(f"round {i + 1}: with snapshots {c1:.1f} CPU s ({w1:.0f} s wall), without "
              f"{c0:.1f} CPU s ({w0:.0f} s wall): CPU ratio {c1 / c0:.3f}, wall ratio "
              f"{w1 / w0:.3f}; load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    cpu = statistics.median(p[True][1] / p[False][1] for p in pairs)
    wall = statistics.median(p[True][0] / p[False][0] for p in pairs)
    one, every, steps = snapshot_cpu(root / "r0-on")
    per_step = statistics.median(p[False][1] for p in pairs) / steps
    print("\n| measure | value |\n|---|---|")
    print(f"| whole runs, CPU time with / without snapshots (median of {args.rounds} pairs) | "
          f"{cpu:.3f} ({100 * (cpu - 1):+.1f}%) |")  # fmt: skip
    print(f"| whole runs, wall time with / without (shared machine: noisy) | {wall:.3f} |")
    print(f"| one snapshot, CPU (median of 20) | {1000 * one:.1f} ms |")
    print(f"| one step, CPU (whole run without snapshots / {steps} steps, start-up included) | "
          f"{1000 * per_step:.1f} ms |")  # fmt: skip
    print(f"| snapshot every {every} steps: snapshot / (interval x step) | "
          f"{100 * one / (every * per_step):.2f}% |")  # fmt: skip


if __name__ == "__main__":
    main()
