"""Sampling speed past the block: attnlab's window policies against nanoGPT's sample.py.

    PYTHONPATH=src python benchmarks/sample_speed.py [--nanogpt /path/to/nanoGPT] \
        [--pairs 5] [--threads 1 2 default]

The set-up of the issue that asked for it: the baby model (4 layers, 4 heads, width 128, block
64, a character vocabulary of 65), random weights (speed does not depend on them), batch 1,
a one-token prompt ("\\n"), 500 new tokens, temperature 0.8, top-k 200: nanoGPT's sample.py
defaults. Rows:
    attnlab slide    learned positions, the default policy: nanoGPT's semantics, exact
    attnlab shift    learned positions: re-prefill half a block every half block
    attnlab ring     rotary positions: a ring-buffer KV cache, one token per step
    attnlab shift/rot  shift on the rotary model, to compare with ring on the same model
    attnlab block    63 new tokens: within one block, the KV cache alone (no ratio: nanoGPT
                     runs 500)
    nanoGPT          its model.py's GPT.generate, what sample.py calls (with --nanogpt)
Every figure comes from its own process (a "whole-process run"): import, build, one warm-up
call, then ``--calls`` timed calls of ``GPT.generate`` / ``generate_ids``; its figure is the
median call. The set-ups take turns within each of ``--pairs`` rounds, so a change in machine
load hits them alike; a ratio is the median over rounds of (row / nanoGPT in that round).
Each call is timed twice: wall clock, and the process's CPU seconds (``time.process_time``),
which a machine shared with other jobs inflates less (at 1 thread they are the same on an idle
machine).
``default`` threads: neither side sets a count (attnlab chooses as `attnlab generate` does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = dict(vocab_size=65, n_layer=4, n_head=4, block_size=64)
WIDTH = 128
SETUPS = {  # name: (window, positions, new tokens)
    "attnlab slide": ("slide", "learned", 500),
    "attnlab shift": ("shift", "learned", 500),
    "attnlab ring": ("ring", "rotary", 500),
    "attnlab shift/rot": ("shift", "rotary", 500),
    "attnlab block": ("slide", "learned", 63),
}


def attnlab_worker(window: str, pos: str, new_tokens: int, calls: int, threads: str) -> list:
    import torch

    from attnlab.generation import SamplingConfig, generate_ids
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.runtime import set_threads

    if threads == "default":
        set_threads()  # what `attnlab generate` does without --threads
    torch.manual_seed(1337)
    model = GPT(GPTConfig(**CONFIG, d_model=WIDTH, pos=pos, dropout=0.0)).eval()
    prompt = torch.zeros(1, 1, dtype=torch.long)  # "\n" is id 0 of tiny shakespeare's vocabulary
    cfg = SamplingConfig(new_tokens, temperature=0.8, top_k=200)
    generate_ids(model, prompt, SamplingConfig(8, temperature=0.8, top_k=200), window=window)
    times = []
    for _ in range(calls):
        t, c = time.perf_counter(), time.process_time()
        out = generate_ids(model, prompt, cfg, window=window)
        times.append((time.perf_counter() - t, time.process_time() - c))
        assert out.shape == (1, new_tokens)
    return times


def nanogpt_worker(path: str, new_tokens: int, calls: int) -> list:
    import torch

    sys.path.insert(0, path)
    from model import GPT, GPTConfig  # nanoGPT's model.py

    torch.manual_seed(1337)
    cfg = GPTConfig(**CONFIG, n_embd=WIDTH, dropout=0.0, bias=True)
    model = GPT(cfg).eval()
    x = torch.zeros(1, 1, dtype=torch.long)
    times = []
    with torch.no_grad():  # as sample.py: model.generate(x, 500, temperature=0.8, top_k=200)
        model.generate(x, 8, temperature=0.8, top_k=200)
        for _ in range(calls):
            t, c = time.perf_counter(), time.process_time()
            y = model.generate(x, new_tokens, temperature=0.8, top_k=200)
            times.append((time.perf_counter() - t, time.process_time() - c))
            assert y.size(1) == 1 + new_tokens
    return times


def run_worker(name: str, threads: str, calls: int, nanogpt: str | None) -> tuple[float, float]:
    """Tokens/s of one set-up, measured in a fresh process: (wall clock, CPU seconds)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("OMP_NUM_THREADS", None)
    if threads != "default":
        env["OMP_NUM_THREADS"] = threads
    cmd = [sys.executable, __file__, "--worker", name, "--calls", str(calls), "--threads", threads]
    if nanogpt:
        cmd += ["--nanogpt", nanogpt]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    wall, cpu = zip(*r["times"])
    return r["new_tokens"] / statistics.median(wall), r["new_tokens"] / statistics.median(cpu)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nanogpt", help="a nanoGPT checkout (its model.py); omit for attnlab only")
    p.add_argument("--pairs", type=int, default=5, help="rounds of interleaved whole-process runs")
    p.add_argument("--calls", type=int, default=3, help="timed calls per process (median)")
    p.add_argument("--threads", nargs="+", default=["1", "2", "default"])
    p.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.worker:
        if args.worker == "nanoGPT":
            times = nanogpt_worker(args.nanogpt, 500, args.calls)
            n = 500
        else:
            window, pos, n = SETUPS[args.worker]
            times = attnlab_worker(window, pos, n, args.calls, args.threads)
        print(json.dumps({"new_tokens": n, "times": times}))
        return

    names = list(args.setups) + (["nanoGPT"] if args.nanogpt else [])
    import torch

    print(f"# torch {torch.__version__}, {os.cpu_count()} CPUs, load average at start {load()}")
    print(f"# {args.pairs} rounds x {len(names)} set-ups x threads {args.threads}, "
          f"{args.calls} timed calls per process")  # fmt: skip
    for threads in args.threads:
        rates: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
        for r in range(args.pairs):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                rates[name].append(run_worker(name, threads, args.calls, args.nanogpt))
            print(f"# threads {threads} round {r + 1}: load {load()}", file=sys.stderr)
        print(f"\nthreads: {threads}")
        head = f"{'set-up':<18}{'tok/s wall':>11}{'min':>7}{'max':>7}{'tok/s CPU':>11}"
        print(head + (f"{'x nanoGPT wall':>16}{'x nanoGPT CPU':>15}" if args.nanogpt else ""))
        for name in names:
            wall, cpu = (list(xs) for xs in zip(*rates[name]))
            line = (f"{name:<18}{statistics.median(wall):>11.0f}{min(wall):>7.0f}"
                    f"{max(wall):>7.0f}{statistics.median(cpu):>11.0f}")  # fmt: skip
            if args.nanogpt and name in SETUPS and SETUPS[name][2] != 500:
                line += f"{'-':>16}{'-':>15}"  # another length: no ratio to nanoGPT's 500
            elif args.nanogpt:
                ref = rates["nanoGPT"]
                for i, width in ((0, 15), (1, 14)):
                    ratio = statistics.median(a[i] / b[i] for a, b in zip(rates[name], ref))
                    line += f"{ratio:>{width}.2f}x"
            print(line, flush=True)
    print(f"\n# load average at the end {load()}")


if __name__ == "__main__":
    main()
