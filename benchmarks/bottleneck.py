"""The bottleneck experiment: exact match against input length for three encoder-decoders.

An LSTM encoder-decoder without attention must squeeze the whole input into its final state;
with attention (or in a Transformer) every decoder step can look back at every input position.
This trains all three on the same task with the same budget (same steps, batch and learning
rate; parameter counts matched within 20% by sizing the LSTMs' hidden width to the
Transformer), then measures exact match on fresh inputs of each length from 5 to 80.

    OMP_NUM_THREADS=1 python benchmarks/bottleneck.py --tasks reverse,copy --steps 1000 \
        --png docs/bottleneck.png

Prints parameter counts, training times and a markdown table; writes a PNG. The defaults use
about 11 CPU-minutes on one thread (13.5 min wall measured on a shared 2-core machine); shrink
--steps, --eval-per-length or --tasks to go faster.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time

import matplotlib
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from attnlab.generation import greedy, pad_ids  # noqa: E402
from attnlab.tasks.seq2seq import ARCHS, Seq2Seq, Seq2SeqOptions  # noqa: E402
from attnlab.training import TrainConfig, Trainer  # noqa: E402

LENGTHS = (5, 10, 20, 30, 40, 50, 60, 70, 80)


def sized(task: Seq2Seq, arch: str, **sizes):
    """``task``'s model for ``arch`` with these sizes (the task keeps the options)."""
    task.options = dataclasses.replace(task.options, arch=arch, **sizes)
    return task.build_model()


def matched_model(task: Seq2Seq, arch: str, target_params: int, args):
    """The Transformer as given; an LSTM with the hidden width whose size is nearest it."""
    if arch == "transformer":
        return sized(task, arch, n_layer=args.layers, d_model=args.d_model)
    best = None
    for hidden in range(16, 1025, 8):
        m = sized(task, arch, n_layer=None, d_model=hidden, score=args.score)
        gap = abs(m.num_params() - target_params)
        if best is not None and gap > best[0]:
            break  # sizes only grow from here
        best = (gap, hidden)
    return sized(task, arch, n_layer=None, d_model=best[1], score=args.score)


@torch.no_grad()
def exact_by_length(model, tok, task: str, n: int, seed: int) -> dict[int, float]:
    rng = random.Random(seed)
    fn = {"reverse": lambda s: s[::-1], "copy": lambda s: s}[task]
    out = {}
    for L in LENGTHS:
        sources = [
            "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(L)) for _ in range(n)
        ]
        src = pad_ids([tok.encode_source(s) for s in sources])
        preds = greedy(model.eval(), src, max_len=L + 2)
        out[L] = sum(tok.decode_target(p) == fn(s) for p, s in zip(preds, sources)) / n
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tasks", default="reverse,copy", help="comma-separated: reverse, copy")
    p.add_argument("--archs", default=",".join(ARCHS))
    p.add_argument(
        "--steps", type=int, default=1000, help="training steps, the same for every model"
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--d-model", type=int, default=64, help="Transformer width (sets the budget)")
    p.add_argument("--layers", type=int, default=2, help="Transformer layers per stack")
    p.add_argument("--score", default="general", help="LSTM attention score")
    p.add_argument("--min-len", type=int, default=5)
    p.add_argument("--max-len", type=int, default=80)
    p.add_argument("--eval-per-length", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--png", default="docs/bottleneck.png")
    args = p.parse_args()
    torch.manual_seed(args.seed)
    tasks, archs = args.tasks.split(","), args.archs.split(",")
    results: dict[tuple[str, str], dict[int, float]] = {}
    for task in tasks:
        spec = (
            f"{task}:min_len={args.min_len},max_len={args.max_len},n_train=20000,n_val=50,n_test=1"
        )
        s2s = Seq2Seq(Seq2SeqOptions(data=spec, dropout=0.0), seed=args.seed)
        s2s.prepare(None)
        tok = s2s.tokenizer
        tf_params = sized(
            s2s, "transformer", n_layer=args.layers, d_model=args.d_model
        ).num_params()
        for arch in archs:
            torch.manual_seed(args.seed)
            model = matched_model(s2s, arch, tf_params, args)
            c = TrainConfig(
                max_iters=args.steps, batch_size=args.batch_size, lr=args.lr, min_lr=args.lr / 10,
                weight_decay=0.01, eval_interval=args.steps, seed=args.seed, device="cpu",
            )  # fmt: skip
            t0 = time.time()
            Trainer(model, s2s, c, quiet=True).fit()
            secs = time.time() - t0
            results[(task, arch)] = exact_by_length(
                model, tok, task, args.eval_per_length, args.seed + 1
            )
            n = model.num_params()
            print(f"{task:8s} {arch:15s} {n:>9,} params ({n / tf_params:.0%} of the Transformer)"
                  f"  trained in {secs:.0f}s", flush=True)  # fmt: skip
    print()
    cols = [(t, a) for t in tasks for a in archs]
    print("| input length | " + " | ".join(f"{t} {a}" for t, a in cols) + " |")
    print("|---:|" + "---:|" * len(cols))
    for L in LENGTHS:
        print(f"| {L} | " + " | ".join(f"{results[c][L]:.0%}" for c in cols) + " |")
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for arch in archs:
            ax.plot(LENGTHS, [results[(task, arch)][L] for L in LENGTHS], marker="o", label=arch)
        ax.set_title(
            f"{task}: {args.steps} steps, ~{tf_params / 1e3:.0f}k parameters each", fontsize=9
        )
        ax.set_xlabel("input length (trained on 5-80)")
        ax.set_ylabel("exact match")
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.png, dpi=100)
    print(f"\nwrote {args.png}")


if __name__ == "__main__":
    main()
