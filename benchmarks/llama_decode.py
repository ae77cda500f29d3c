"""Sampling from the ``--arch llama`` model: decoding's fast path (``FastForward``) against
``GPT.forward``, alternated in one process (paired timings).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/llama_decode.py [--rounds 8] \
        [--tokens 63] [--threads 1] [--arch llama]

The model is ``attnlab train --arch llama``'s at baby's sizes (4 layers, 4 heads, width 128,
block 64, 2 K/V heads, SwiGLU 352 wide, RMSNorm, rotate-half rotary), random weights (speed
does not depend on them), a character vocabulary of 65. Each round samples ``--tokens`` new
tokens after a one-token prompt (temperature 0.8, top-k 200, batch 1, KV cache) once through
``FastForward`` and once through ``GPT.forward`` (FastForward told it does not apply), in an
order that alternates; the CPU time (``time.process_time``) of each is taken, and the ratio
round by round. Both give the same tokens (checked). ``--arch gpt`` times the baby GPT.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from attnlab import decoding
from attnlab.generation import SamplingConfig, generate_ids
from attnlab.models.gpt import GPT
from attnlab.tasks.lm import LMOptions


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--tokens", type=int, default=63, help="new tokens (63: within the block)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--arch", default="llama", choices=["llama", "gpt"])
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(LMOptions(data="-", arch=args.arch).model_config(65)).eval()
    prompt = torch.zeros(1, 1, dtype=torch.long)
    cfg = SamplingConfig(max_new_tokens=args.tokens, temperature=0.8, top_k=200, seed=1)
    applies = decoding.FastForward.applies
    assert applies(model), "FastForward steps aside for this model"

    def sample(fast: bool) -> tuple[float, torch.Tensor]:
        decoding.FastForward.applies = staticmethod(applies if fast else lambda m: False)
        try:
            t = time.process_time()
            out = generate_ids(model, prompt, cfg)
            return time.process_time() - t, out
        finally:
            decoding.FastForward.applies = staticmethod(applies)

    sample(True), sample(False)  # warm-up
    times = {True: [], False: []}
    for r in range(args.rounds):
        outs = {}
        for fast in (True, False) if r % 2 else (False, True):
            dt, outs[fast] = sample(fast)
            times[fast].append(dt)
        assert torch.equal(outs[True], outs[False]), "the two paths sampled different tokens"
    ms = {k: statistics.median(v) / args.tokens * 1000 for k, v in times.items()}
    ratios = [b / a for a, b in zip(times[True], times[False])]
    print(f"--arch {args.arch}, {args.tokens} new tokens, batch 1, {args.rounds} rounds, "
          f"threads {torch.get_num_threads()}, torch {torch.__version__}")  # fmt: skip
    print(f"  FastForward  {ms[True]:.3f} CPU ms/token")
    print(f"  GPT.forward  {ms[False]:.3f} CPU ms/token")
    print(f"  forward / FastForward: median {statistics.median(ratios):.2f}x "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
