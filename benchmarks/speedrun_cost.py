"""Cost as work grows: one training step of nanoGPT, of attnlab on the same model and recipe,
and of the speedrun's recipe on the same shape, at three sizes, taking turns in one process.

    PYTHONPATH=src python benchmarks/speedrun_cost.py /path/to/nanoGPT [--sizes baby,small,gpt2]
        [--threads N] [--rounds R]

Sizes (vocabulary 65, tiny Shakespeare's characters, at every size):
    baby    4 layers, 4 heads, width 128, block 64, batch 12   (nanoGPT's CPU configuration)
    small   6 layers, 6 heads, width 384, block 256, batch 12  (its GPU Shakespeare shape)
    gpt2    12 layers, 12 heads, width 768, block 1024, batch 1 (the gpt2 preset's shape)
Sides: nanoGPT (its ``model.py`` imported from the checkout, its ``configure_optimizers``:
AdamW), ``attnlab`` (attnlab's GPT of the same shape, its fused AdamW) and ``speedrun`` (the
speedrun preset's pieces at that shape, trained by its recipe: Muon for the blocks' matrices,
AdamW for the rest). A step is: a batch, forward, loss, backward, clip at 1.0, the optimizer's
step, zero_grad, the loss read back. Each round times ``--steps`` steps of each side in turn
(the order rotating), so every side meets the same load; per side the median over rounds of
wall and CPU milliseconds per step, tokens per second (wall), and its time over nanoGPT's in
the same round (median and range). Muon's cost does not shrink with the batch: its
Newton-Schulz iterations multiply matrices of the weights' own sizes every step, which is why
the speedrun gains least where the batch is smallest against the matrices.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch

SIZES = {  # name -> (n_layer, n_head, width, block, batch)
    "baby": (4, 4, 128, 64, 12),
    "small": (6, 6, 384, 256, 12),
    "gpt2": (12, 12, 768, 1024, 1),
}
STEPS = {"baby": 5, "small": 1, "gpt2": 1}  # steps per side per round
VOCAB = 65


def sides(nano, size: str, split: bool = False):
    """(name, step function) of each side at ``size``; ``split``: (name, (forward and backward,
    optimizer step)) instead."""
    from attnlab.models.gpt import GPT, PRESETS, GPTConfig
    from attnlab.tasks.lm import PRESET_TRAINING, next_token_loss
    from attnlab.train_config import TrainConfig
    from attnlab.training.optim import make_optimizer, set_lr

    L, H, C, T, B = SIZES[size]
    data = torch.randint(0, VOCAB, (max(200_000, 4 * T),))

    def batch():
        ix = torch.randint(len(data) - T - 1, (B,))
        x = torch.stack([data[i : i + T] for i in ix])  # (B, T)
        return x, torch.stack([data[i + 1 : i + 1 + T] for i in ix])

    torch.manual_seed(0)
    theirs = nano.GPT(nano.GPTConfig(block_size=T, vocab_size=VOCAB, n_layer=L, n_head=H,
                                     n_embd=C, dropout=0.0, bias=True))  # fmt: skip
    their_opt = theirs.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")

    def their_fb():
        x, y = batch()
        _, loss = theirs(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
        return loss

    def their_opt_step():
        their_opt.step()
        their_opt.zero_grad(set_to_none=True)

    def their_step():
        loss = their_fb()
        their_opt_step()
        return loss.item()

    out = [("nanoGPT", (their_fb, their_opt_step) if split else their_step)]
    shape = dict(vocab_size=VOCAB, n_layer=L, n_head=H, d_model=C, block_size=T, dropout=0.0)
    pieces = {k: v for k, v in PRESETS["speedrun"].items()
              if k not in ("n_layer", "n_head", "d_model", "block_size")}  # fmt: skip
    recipe = {k: v for k, v in PRESET_TRAINING["speedrun"].items() if k != "batch_size"}
    for name, model_fields, train_fields in (("attnlab", {}, {}),
                                             ("speedrun", pieces, recipe)):  # fmt: skip
        model = GPT(GPTConfig(**shape, **model_fields))
        tc = TrainConfig(**{**train_fields, "batch_size": B})
        opt = make_optimizer(model, tc)
        params = [p for p in model.parameters() if p.requires_grad]

        def fb(model=model, params=params):
            loss = next_token_loss(model, batch())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
            return loss

        def opt_step(opt=opt, tc=tc):
            set_lr(opt, tc.warmup_iters, tc)
            opt.step()
            opt.zero_grad(set_to_none=True)

        def step(fb=fb, opt_step=opt_step):
            loss = fb()
            opt_step()
            return loss.item()

        out.append((name, (fb, opt_step) if split else step))
    return out, B * T


MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def profile(nano, size: str, steps: int = 10) -> list[str]:
    """Where a step's time goes, per side (torch.profiler's self time of each operator): the
    model's matrix products (aten::mm, addmm, bmm, forward and backward), everything else of
    forward and backward (attention's kernel, activations, norms, embedding, loss, copies),
    and the optimizer's step (every operator run inside it: Muon's Newton-Schulz products)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    runs, _ = sides(nano, size, split=True)
    lines = [f"{size}: where one step goes, ms ({steps} steps, {torch.get_num_threads()} "
             f"threads, load {os.getloadavg()[0]:.1f})",
             f"  {'side':<9} {'step':>8} {'matmuls':>8} {'the rest':>9} {'optimizer':>10}"]  # fmt: skip
    for name, (forward_backward, optimizer_step) in runs:
        for _ in range(3):
            forward_backward()
            optimizer_step()
        with _quiet_stderr(), torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                forward_backward()
                optimizer_step()
        events = prof.events()
        spans = [(e.time_range.start, e.time_range.end) for e in events
                 if e.name.startswith("Optimizer.step")]  # fmt: skip
        mm = rest = opt = 0.0
        for e in events:
            if e.name.startswith(("Optimizer.", "ProfilerStep")):
                continue  # annotations: their operators are counted
            us = e.self_cpu_time_total
            if any(a <= e.time_range.start < b for a, b in spans):
                opt += us
            elif e.name in MATMULS:
                mm += us
            else:
                rest += us
        ms = [x / 1000 / steps for x in (mm + rest + opt, mm, rest, opt)]
        lines.append(f"  {name:<9} {ms[0]:>8.1f} {ms[1]:>8.1f} {ms[2]:>9.1f} {ms[3]:>10.1f}")
    return lines


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's C++ side prints its start and stop to file descriptor 2."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def measure(nano, size: str, rounds: int) -> list[str]:
    runs, tokens = sides(nano, size)
    n = STEPS[size]

    def timed(f):
        w, c = time.perf_counter(), time.process_time()
        for _ in range(n):
            f()
        return (time.perf_counter() - w) / n, (time.process_time() - c) / n

    for _, f in runs:  # warm-up: the allocator, the optimizers' state
        timed(f)
    res = {name: [] for name, _ in runs}
    load0 = os.getloadavg()[0]
    for r in range(rounds):
        k = r % len(runs)
        for name, f in runs[k:] + runs[:k]:
            res[name].append(timed(f))
    load1 = os.getloadavg()[0]
    L, H, C, T, B = SIZES[size]
    lines = [f"{size}: {L} layers, {H} heads, width {C}, block {T}, batch {B}; {rounds} rounds "
             f"x {n} steps, {torch.get_num_threads()} threads, load {load0:.1f} -> {load1:.1f}",
             f"  {'side':<9} {'wall ms/step':>12} {'CPU ms/step':>12} {'tokens/s':>9}  "
             f"x nanoGPT wall (range)"]  # fmt: skip
    for name, ts in res.items():
        wall = statistics.median(t[0] for t in ts)
        cpu = statistics.median(t[1] for t in ts)
        ratio = ""
        if name != "nanoGPT":
            rs = [a[0] / b[0] for a, b in zip(ts, res["nanoGPT"])]
            ratio = f"{statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})"
        lines.append(f"  {name:<9} {1000 * wall:>12.1f} {1000 * cpu:>12.1f} "
                     f"{tokens / wall:>9,.0f}  {ratio}".rstrip())  # fmt: skip
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("nanogpt", help="a nanoGPT checkout (its model.py is imported)")
    p.add_argument("--sizes", default="baby,small,gpt2")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's, one per core)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--profile", action="store_true",
                   help="also say where each side's step goes: matrix products, the rest, the "
                   "optimizer")  # fmt: skip
    args = p.parse_args()
    sizes = args.sizes.split(",")
    if not set(sizes) <= set(SIZES) or args.rounds < 1:
        p.error(f"--sizes from {', '.join(SIZES)}; --rounds at least 1")
    if not os.path.isfile(os.path.join(args.nanogpt, "model.py")):
        p.error(f"{args.nanogpt}: no model.py (is it a nanoGPT checkout?)")
    if args.threads:
        torch.set_num_threads(args.threads)
    sys.path.insert(0, args.nanogpt)
    import model as nano  # nanoGPT's model.py

    print(f"# torch {torch.__version__}, {os.cpu_count()} CPUs", flush=True)
    for size in sizes:
        print("\n".join(measure(nano, size, args.rounds)), flush=True)
        if args.profile:
            print("\n".join(profile(nano, size, steps=max(2, 2 * STEPS[size]))), flush=True)


if __name__ == "__main__":
    main()
