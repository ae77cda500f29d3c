"""One training step, attnlab against nanoGPT, alternated in one process (paired timings).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/step_vs_nanogpt.py /path/to/nanoGPT \
        [--rounds 20] [--steps 5] [--threads 1]

nanoGPT's ``model.py`` is imported from the given checkout (nothing is copied). Both models are
nanoGPT's CPU configuration (4 layers, 4 heads, width 128, block 64, batch 12, vocab 65,
dropout 0); each side uses its own optimizer set-up (nanoGPT's ``configure_optimizers``; our
``make_optimizer``: fused AdamW) and clips gradients at 1.0, as the two training scripts do.
A step is: batch, forward, loss, backward, clip, optimizer step, zero_grad, ``loss.item()``.

Each round times ``--steps`` steps of one side, then of the other (the order alternates), so
both sides see the same machine load; the ratio is taken round by round and its median
printed. Wall time (``time.perf_counter``) and CPU time (``time.process_time``) are both
reported: on a shared machine the CPU time is the steadier of the two.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("nanogpt", help="a nanoGPT checkout (its model.py is imported)")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--steps", type=int, default=5, help="steps per side per round")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--bias", type=int, default=1, help="nanoGPT bias (ours always has biases)")
    p.add_argument("--pos", default="learned", help="attnlab's positions (rotary: --preset fast)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sys.path.insert(0, args.nanogpt)
    import model as nano  # nanoGPT's model.py

    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.tasks.lm import next_token_loss
    from attnlab.training import TrainConfig, make_optimizer

    torch.manual_seed(0)
    B, T, V = 12, 64, 65
    data = torch.randint(0, V, (200_000,))

    def batch():
        ix = torch.randint(len(data) - T - 1, (B,))
        x = torch.stack([data[i : i + T] for i in ix])  # (B, T)
        y = torch.stack([data[i + 1 : i + 1 + T] for i in ix])
        return x, y

    cfg = nano.GPTConfig(
        block_size=T,
        vocab_size=V,
        n_layer=4,
        n_head=4,
        n_embd=128,
        dropout=0.0,
        bias=bool(args.bias),
    )
    theirs = nano.GPT(cfg)
    their_opt = theirs.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    ours = GPT(
        GPTConfig(vocab_size=V, block_size=T, n_layer=4, n_head=4, d_model=128, pos=args.pos)
    )
    tc = TrainConfig(lr=1e-3, beta2=0.99, weight_decay=0.1)
    our_opt = make_optimizer(ours, tc)
    our_params = list(ours.parameters())

    def their_step():
        x, y = batch()
        _, loss = theirs(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
        their_opt.step()
        their_opt.zero_grad(set_to_none=True)
        return loss.item()

    def our_step():
        x, y = batch()
        loss = next_token_loss(ours, (x, y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(our_params, 1.0, foreach=True)
        our_opt.step()
        our_opt.zero_grad(set_to_none=True)
        return loss.item()

    def timed(step):
        w, c = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            step()
        n = args.steps
        return (time.perf_counter() - w) / n * 1000, (time.process_time() - c) / n * 1000

    for _ in range(3):  # warm-up: allocator, optimizer state
        timed(their_step), timed(our_step)
    load0 = os.getloadavg()[0]
    res = {"nanoGPT": [], "attnlab": []}
    for r in range(args.rounds):
        order = (("nanoGPT", their_step), ("attnlab", our_step))
        for name, step in order if r % 2 == 0 else order[::-1]:
            res[name].append(timed(step))
    load1 = os.getloadavg()[0]

    def med(name, i):
        return statistics.median(t[i] for t in res[name])

    print(
        f"\none training step, {args.rounds} rounds x {args.steps} steps, torch "
        f"{torch.__version__}, threads {torch.get_num_threads()}, load {load0:.2f} -> {load1:.2f}"
    )
    print(f"  {'':<10} {'wall ms/step':>13} {'CPU ms/step':>12}")
    for name in res:
        print(f"  {name:<10} {med(name, 0):>13.2f} {med(name, 1):>12.2f}")
    for i, what in ((0, "wall"), (1, "CPU")):
        ratios = [a[i] / b[i] for a, b in zip(res["nanoGPT"], res["attnlab"])]
        print(
            f"  speed-up (nanoGPT time / attnlab time), {what}: median {statistics.median(ratios):.3f}"
            f"  (min {min(ratios):.3f}, max {max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
