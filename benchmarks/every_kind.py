"""Every kind of run, trained briefly, then what `attnlab predict` and `attnlab eval` print for it
(the table in docs/tasks.md).

    OMP_NUM_THREADS=1 python benchmarks/every_kind.py --runs runs/kinds [--only gpt-char,vit] \
        [--seed 2]

Trains each recipe below into RUNS/<name> (a run already there is reused), imports
all-MiniLM-L6-v2 and exports then re-imports the masked LM (an "imported BERT"), then runs one
`predict` and one `eval` (the run's held-out split; an imported run is scored on the text given
beside it) per run, and prints a markdown table with the training time, the answer and the
figures. The machine's load average is printed too: a shared machine inflates the times.
``--seed S`` trains with ``attnlab train --seed S`` into RUNS/<name>-seedS (the default seed,
1337, into RUNS/<name>), so the same table over several seeds gives each figure's range.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHRASES = str(ROOT / "examples" / "phrases_en_es.tsv")
LANGUAGES = str(ROOT / "examples" / "language_en_es.tsv")
WORDS = ["--tokenizer", "word", "--batch-size", "32", "--lr", "3e-3", "--max-iters", "600"]
# name -> (the arguments of `attnlab train`, what to predict)
RECIPES = {
    "gpt-char": (["--data", "shakespeare", "--max-iters", "600"], "ROMEO:"),
    "gpt-bpe": (
        [
            "--data",
            "shakespeare",
            "--tokenizer",
            "bpe",
            "--vocab-size",
            "512",
            "--max-iters",
            "600",
        ],
        "ROMEO:",
    ),  # fmt: skip
    "mlm": (
        ["--task", "mlm", "--data", "shakespeare", "--max-iters", "600"],
        "To be, or not to be: that is the [MASK]uestion",
    ),  # fmt: skip
    "classify": (["--task", "classify", "--data", LANGUAGES], "where is the station?"),
    "phrases-transformer": (
        ["--task", "seq2seq", "--data", PHRASES, "--arch", "transformer", *WORDS],
        "let's go",
    ),  # fmt: skip
    "phrases-lstm-attention": (
        ["--task", "seq2seq", "--data", PHRASES, "--arch", "lstm-attention", *WORDS],
        "let's go",
    ),  # fmt: skip
    "phrases-lstm": (
        ["--task", "seq2seq", "--data", PHRASES, "--arch", "lstm", *WORDS],
        "let's go",
    ),  # fmt: skip
    "digits": (["--task", "classify", "--data", "digits", "--arch", "vit"], "test:0"),
}
IMPORTED = {"bert": "To be, or not to be: that is the [MASK]uestion",
            "minilm": "The bank of the river"}  # fmt: skip
FIGURES = {  # the eval figures shown, by task
    "lm": ["loss", "perplexity", "bits_per_char"],
    "mlm": ["masked_accuracy", "loss"],
    "classify": ["accuracy", "macro_f1", "examples"],
    "seq2seq": ["exact_match", "token_accuracy", "bleu", "chrf", "pairs"],
    "vision": ["accuracy", "macro_f1", "examples"],
}


def attnlab(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "attnlab", *args], env=env, text=True,
                       capture_output=True)  # fmt: skip
    return r, time.perf_counter() - t0


def answer(pred: dict) -> str:
    if "next" in pred:
        return ", ".join(f"{x['token']!r} {x['p']:.2f}" for x in pred["next"][:3])
    if "masks" in pred:
        return ", ".join(f"{x['token']!r} {x['p']:.2f}" for x in pred["masks"][0][:3])
    if "classes" in pred:
        return ", ".join(f"{x['label']} {x['p']:.2f}" for x in pred["classes"][:3])
    return repr(pred["output"])


def show(key: str, value: float) -> str:
    if key in ("accuracy", "macro_f1", "masked_accuracy", "exact_match", "token_accuracy"):
        return f"{key} {value:.1%}"
    if key in ("examples", "pairs"):
        return f"{int(value)} {key}"
    return f"{key} {value:.1f}" if key in ("bleu", "chrf") else f"{key} {value:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", required=True, help="where the runs are trained (and reused)")
    p.add_argument("--only", default="", help="comma-separated names (default: all)")
    p.add_argument("--seed", type=int, default=1337, help="attnlab train's --seed")
    args = p.parse_args()
    base = Path(args.runs)
    seed = [] if args.seed == 1337 else ["--seed", str(args.seed)]
    suffix = f"-seed{args.seed}" if seed else ""
    names = [*RECIPES, *IMPORTED]
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    rows = []
    for name in names:
        run, wall = base / (name + suffix), 0.0
        if not run.is_dir():
            if name in RECIPES:
                r, wall = attnlab("train", *RECIPES[name][0], *seed, "--out", str(run), "--quiet")
            elif name == "minilm":
                r, _ = attnlab("import-hf", "minilm", "--out", str(run))
            else:  # the masked LM, out to Hugging Face's format and back in
                mlm = base / ("mlm" + suffix)
                attnlab("export-hf", str(mlm), str(base / ("mlm-hf" + suffix)))
                r, _ = attnlab("import-hf", str(base / ("mlm-hf" + suffix)), "--out", str(run))
            if r.returncode != 0:
                sys.exit(f"{name}: {r.stderr.strip()}")
        probe = RECIPES[name][1] if name in RECIPES else IMPORTED[name]
        r, _ = attnlab("predict", str(run), probe, "--json")
        ev_args = ["--data", str(ROOT / "README.md")] if name == "bert" else []
        e, t_eval = attnlab("eval", str(run), "--json", *ev_args)
        load = os.getloadavg()[0]
        cmd = " ".join(RECIPES[name][0]) if name in RECIPES else f"import-hf ({name})"
        if r.returncode != 0:  # an encoder with no head: its one-line refusal
            line = r.stderr.strip().removeprefix("attnlab: error: ")
            rows.append((name, "encoder", cmd, probe, "refused: " + line, "refused", wall, load))
        else:
            pred = json.loads(r.stdout)
            ev = json.loads(e.stdout) if e.returncode == 0 else {"task": "?"}
            figs = ", ".join(show(k, ev[k]) for k in FIGURES.get(ev["task"], []) if k in ev)
            rows.append((name, pred["about"]["kind"], cmd, probe, answer(pred["predictions"][0]),
                         f"{figs} ({t_eval:.0f} s)", wall, load))  # fmt: skip
        print(" | ".join(map(str, rows[-1])), flush=True)
    print(
        "\n| run | kind | train | predict | answer | eval | train time |\n|---|---|---|---|---|---|---|"
    )
    for name, kind, cmd, probe, ans, figs, wall, load in rows:
        print(f"| {name} | {kind} | `{cmd}` | `{probe}` | {ans} | {figs} | "
              f"{wall:.0f} s (load {load:.1f}) |")  # fmt: skip


if __name__ == "__main__":
    main()
