"""Training and generation speed on nanoGPT's CPU configuration, printed as a table.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/train_speed.py \
        --data /work/shared/data/tinyshakespeare/input.txt [--max-iters 2000] [--compile]

Set-up (nanoGPT's README "I only have a macbook" run): char tokenizer, baby preset (4 layers,
4 heads, width 128, block 64), batch 12, lr 1e-3, warmup 100, cosine to 1e-4 at 2000 steps,
beta2 0.99, dropout 0, weight decay 0.1, evaluation on 20 fixed batches every 250 steps.

Reports: validation loss at the last step; training tokens/s and ms/iter (median over steps,
leaving out the first 10 and the steps that include an evaluation); peak resident memory;
generation tokens/s at batch 1 for 500 new tokens with and without the KV cache (past
block_size both recompute the whole window every step, see attnlab.generation), and for 63 new
tokens after a one-token prompt (one block: where the cache helps). Generation figures are the
median of 5 runs, the set-ups taking turns. The machine's load average is printed at the start and the end: on a shared
machine compare runs only against runs interleaved with them (benchmarks/step_vs_nanogpt.py).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def train_figures(run: Path, eval_interval: int, tokens_per_step: int) -> dict:
    from attnlab.rundir import read_metrics

    rows = read_metrics(run / "metrics.jsonl")
    steps = [
        r
        for r in rows
        if "val_loss" not in r and r["step"] > 10 and (r["step"] - 1) % eval_interval
    ]
    ms = statistics.median(r["ms_per_iter"] for r in steps)
    evals = [r for r in rows if r.get("val_loss") is not None]
    return {
        "ms_per_iter": ms,
        "tokens_per_s": tokens_per_step / ms * 1000,
        "val_loss": evals[-1]["val_loss"],
        "val_step": evals[-1]["step"],
        "val_bpc": evals[-1].get("val_bpc"),
    }


def generation_figures(run: Path, new_tokens: int, repeats: int = 3) -> dict:
    """tokens/s (median of ``repeats``) per (new tokens, cache); the four set-ups take turns
    within each repeat, so a change in machine load hits them alike."""
    from attnlab import load_run
    from attnlab.generation import SamplingConfig, generate_ids

    model, tok = load_run(run)
    prompt = torch.tensor([tok.encode("\n")])
    setups = [
        (n, cache) for n in (new_tokens, model.config.block_size - 1) for cache in (True, False)
    ]
    times: dict = {s: [] for s in setups}
    generate_ids(model, prompt, SamplingConfig(8, seed=0))  # warm-up
    for r in range(repeats):
        for n, cache in setups if r % 2 == 0 else setups[::-1]:
            cfg = SamplingConfig(n, temperature=1.0, seed=0)
            t = time.perf_counter()
            generate_ids(model, prompt, cfg, use_cache=cache)
            times[(n, cache)].append(time.perf_counter() - t)
    return {(n, cache): n / statistics.median(ts) for (n, cache), ts in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", default="/work/shared/data/tinyshakespeare/input.txt")
    p.add_argument("--max-iters", type=int, default=2000)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--out", default=None, help="run directory (default: a temporary one)")
    p.add_argument("--gen-tokens", type=int, default=500)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load0 = os.getloadavg()[0]

    from attnlab.cli import main as cli

    out = Path(args.out or tempfile.mkdtemp(prefix="attnlab-bench-")) / "run"
    train = [
        "train",
        "--data",
        args.data,
        "--tokenizer",
        "char",
        "--preset",
        "baby",
        "--out",
        str(out),
        "--batch-size",
        "12",
        "--block-size",
        "64",
        "--lr",
        "1e-3",
        "--min-lr",
        "1e-4",
        "--warmup-iters",
        "100",
        "--lr-decay-iters",
        "2000",
        "--max-iters",
        str(args.max_iters),
        "--beta2",
        "0.99",
        "--dropout",
        "0",
        "--weight-decay",
        "0.1",
        "--eval-interval",
        "250",
        "--eval-iters",
        "20",
        "--log-interval",
        "1",
        "--dtype",
        args.dtype,
        "--device",
        "cpu",
        "--quiet",
    ] + (["--compile"] if args.compile else [])
    t0 = time.perf_counter()
    if cli(train):
        sys.exit(1)
    wall = time.perf_counter() - t0
    peak_train = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    f = train_figures(out, 250, 12 * 64)
    g = generation_figures(out, args.gen_tokens, repeats=5)
    block = 63
    print(
        f"\nattnlab train_speed  (torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"compile {args.compile}, dtype {args.dtype}, "
        f"load {load0:.2f} -> {os.getloadavg()[0]:.2f})"
    )
    rows = [
        (
            f"val loss @ step {f['val_step']}",
            f"{f['val_loss']:.4f}  ({f['val_bpc']:.3f} bits/char)",
        ),
        ("train ms/iter (median)", f"{f['ms_per_iter']:.2f}"),
        ("train tokens/s", f"{f['tokens_per_s']:,.0f}"),
        ("train wall (incl. set-up, evals)", f"{wall:.1f} s"),
        ("peak RSS (train)", f"{peak_train:.0f} MB"),
        (f"generate {args.gen_tokens} tok, KV cache", f"{g[(args.gen_tokens, True)]:,.0f} tok/s"),
        (f"generate {args.gen_tokens} tok, no cache", f"{g[(args.gen_tokens, False)]:,.0f} tok/s"),
        (f"generate {block} tok (one block), KV cache", f"{g[(block, True)]:,.0f} tok/s"),
        (f"generate {block} tok (one block), no cache", f"{g[(block, False)]:,.0f} tok/s"),
    ]
    for name, value in rows:
        print(f"  {name:<38} {value}")
    print(
        f"attnlab tokens_per_s={f['tokens_per_s']:.0f} ms_per_iter={f['ms_per_iter']:.2f} "
        f"val_loss@{f['val_step']}={f['val_loss']:.4f} peak_rss_mb={peak_train:.0f}"
    )


if __name__ == "__main__":
    main()
