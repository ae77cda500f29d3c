"""`make demo`: train the `baby` GPT on the built-in Shakespeare corpus, then sample from it.

About 2-3 minutes on 2 idle CPU cores. The run lands in runs/demo-shakespeare; running the demo
again reuses a finished run, and continues (--resume) one that was interrupted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

RUN = Path("runs") / "demo-shakespeare"
MAX_ITERS = 4000  # nanoGPT's CPU settings (batch 12, block 64) run ~30 ms/iter on 2 idle cores
PROMPT = "ROMEO:\n"


def attention_table(tokens: list[str], weights: torch.Tensor) -> str:
    """A token x token table: row = the query token, column = the key token it attends to."""
    width = max(6, *(len(t) for t in tokens)) + 1
    head = " " * width + "".join(f"{t:>{width}}" for t in tokens)
    rows = [
        f"{q:>{width}}" + "".join(f"{w:>{width}.2f}" for w in row.tolist())
        for q, row in zip(tokens, weights)
    ]
    return "\n".join([head, *rows])


def train() -> None:
    from attnlab.cli import main as cli
    from attnlab.training import read_trainer_state

    state = read_trainer_state(RUN) if (RUN / "trainer_state.json").is_file() else None
    if state is not None and state["step"] >= MAX_ITERS:
        print(f"[demo] {RUN} is already trained ({state['step']} steps); delete it to train again")
        return
    args = [
        "train",
        "--data",
        "shakespeare",
        "--tokenizer",
        "char",
        "--preset",
        "baby",
        "--out",
        str(RUN),
        "--max-iters",
        str(MAX_ITERS),
        "--eval-interval",
        "500",
        "--batch-size",
        "12",
        "--lr",
        "1e-3",
        "--min-lr",
        "1e-4",
        "--warmup-iters",
        "100",
        "--dropout",
        "0",
    ]
    if state is not None:
        args.append("--resume")
    print(
        f"[demo] training the baby GPT on the built-in Shakespeare plays for {MAX_ITERS} steps "
        "(Ctrl-C saves a checkpoint; run `make demo` again to continue)"
    )
    code = cli(args)
    if code:
        sys.exit(code)


def main() -> None:
    from attnlab import load_run
    from attnlab.generation import SamplingConfig, generate

    train()
    model, tokenizer = load_run(RUN)
    print(f"\n[demo] a sample (temperature 0.8, top-k 40), prompt {PROMPT!r}:\n")
    sys.stdout.write(PROMPT)
    stream = lambda piece: (sys.stdout.write(piece), sys.stdout.flush())
    generate(model, tokenizer, PROMPT, SamplingConfig(400, 0.8, top_k=40, seed=0), stream=stream)
    print("\n")
    print(f"[demo] run directory : {RUN}/ (config.json, model.safetensors, tokenizer.json, best/)")
    print(f"[demo] loss curve    : {RUN / 'loss.png'}   metrics: {RUN / 'metrics.jsonl'}")
    print(f"[demo] sample more   : attnlab generate {RUN} --prompt 'JULIET:' --max-new-tokens 300")
    print(f"[demo] evaluate      : attnlab eval {RUN} --data /path/to/text.txt")


if __name__ == "__main__":
    main()
