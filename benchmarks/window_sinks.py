"""The window policies past the block, quality and speed: slide, shift, ring and sinks (the
StreamingLLM window, ``--window sinks``) on a trained rotary GPT.

    PYTHONPATH=src python benchmarks/window_sinks.py RUN [--rounds 3] [--tokens 500]

RUN: a run with rotary positions, e.g. one of ``attnlab experiment attention-sinks``'s
(``reports/attention-sinks/runs/char-softmax-seed1``). Two tables:

quality  perplexity of the held-out tokens past the block, in 8 sequences of 4 blocks, each
         token predicted through the window (``attnlab.inspect.sinks.window_nll``; full: the
         same weights with a rotary table as long as the sequence), and within the block
speed    sampling ``--tokens`` new tokens after a one-token prompt (batch 1, temperature 0.8,
         1 thread): milliseconds per token, wall clock and CPU time, each the median of
         ``--rounds`` whole processes per window taking turns (a process: load the run, one
         warm-up call, then 3 timed calls; its figure is the median call). CPU time is the
         steadier figure on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WINDOWS = ("slide", "shift", "ring", "sinks:4")


def worker(run: str, window: str, tokens: int) -> dict:
    import torch

    from attnlab.generation import SamplingConfig, generate_ids
    from attnlab.run import load_run

    torch.set_num_threads(1)
    model = load_run(run).model.eval()
    prompt = torch.zeros(1, 1, dtype=torch.long)
    cfg = SamplingConfig(tokens, temperature=0.8, seed=0)
    generate_ids(model, prompt, cfg, window=window)  # warm-up
    walls, cpus = [], []
    for _ in range(3):
        w, c = time.perf_counter(), time.process_time()
        generate_ids(model, prompt, cfg, window=window)
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return {"wall_ms": 1000 * statistics.median(walls) / tokens,
            "cpu_ms": 1000 * statistics.median(cpus) / tokens}  # fmt: skip


def quality(run: str) -> dict:
    import torch

    from attnlab.experiments.attention_sinks import held_out
    from attnlab.inspect.sinks import full_nll, window_nll
    from attnlab.run import load_run

    torch.set_num_threads(1)
    r = load_run(run)
    block = r.model.config.block_size
    ids = held_out(r, 8, 4 * block)
    out = {}
    for w in ("full", *WINDOWS):
        nll = full_nll(r.model, ids) if w == "full" else window_nll(r.model, ids, w)
        out[w] = {"past": math.exp(float(nll[:, block - 1 :].mean())),
                  "within": math.exp(float(nll[:, : block - 1].mean()))}  # fmt: skip
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a run with rotary positions")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=500)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.run, args.worker, args.tokens)))
        return 0
    q = quality(args.run)
    print(f"quality: perplexity on held-out text ({args.run})")
    print(f"{'window':<10} {'within the block':>16} {'past the block':>15}")
    for w, v in q.items():
        print(f"{w:<10} {v['within']:>16.3f} {v['past']:>15.3f}")
    times: dict[str, list[dict]] = {w: [] for w in WINDOWS}
    for _ in range(args.rounds):
        for w in WINDOWS:  # the windows take turns within each round
            out = subprocess.run([sys.executable, __file__, args.run, "--worker", w, "--tokens",
                                  str(args.tokens)], capture_output=True, text=True, check=True,
                                 env={"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1",
                                      "PATH": "/usr/bin:/bin"})  # fmt: skip
            times[w].append(json.loads(out.stdout))
    print(f"\nspeed: {args.tokens} new tokens, batch 1, 1 thread, median of {args.rounds} "
          "processes")  # fmt: skip
    print(f"{'window':<10} {'wall ms/token':>14} {'CPU ms/token':>13}")
    for w, rows in times.items():
        wall = statistics.median(r["wall_ms"] for r in rows)
        cpu = statistics.median(r["cpu_ms"] for r in rows)
        print(f"{w:<10} {wall:>14.3f} {cpu:>13.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
