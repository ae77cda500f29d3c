"""Every verb's `--json` on every kind of run: a before/after record for a refactor (issue 21).

    OMP_NUM_THREADS=1 python benchmarks/verb_json.py --out verb_json.json [--work DIR]
    OMP_NUM_THREADS=1 python benchmarks/verb_json.py --compare benchmarks/verb_json_baseline.json \
        [--out new.json] [--ignore-mean-ablation] [--allow mean-definition,crash-fixed]
    python benchmarks/verb_json.py --compare BASELINE --record new.json [...]  # no recomputing

Makes a small run of every kind attnlab has, through the CLI, at one thread with fixed seeds: a
char GPT on a generated text, the attention-only induction GPT (with snapshots), a masked LM
(BPE: `--tokenizer wordpiece` orders its ##-pieces differently in every process, so two runs
would differ), a text classifier (examples/language_en_es.tsv), the Transformer,
LSTM-attention and plain LSTM encoder-decoders on dates, a ViT on digits, and imported runs:
all-MiniLM-L6-v2 (`import-hf minilm`, skipped when it is not installed) and a tiny random
GPT-2 and a WordPiece BERT built here from a transformers config (seeded), saved and brought in
with `import-hf`. Every command runs in the work directory, on relative paths. Then it calls
every verb that prints JSON on every run (predict, eval, generate, trace, attention, similarity,
influence, check, ablate, patch, lens, attribute, heads, classify, translate, embed, timeline):
a verb that does not apply to a kind is recorded as its exit code and stderr line, which is
behaviour too. The result is one JSON file, {run: {command: output}}.

Each command is `attnlab.cli.main(argv)` in a child forked from one process that has imported
attnlab (the same code as `python -m attnlab`, without paying torch's import 250 times);
`--fresh` starts `python -m attnlab` for each command instead (slower, the same JSON). Outputs are
normalised: the work directory becomes <WORK> and the repository <REPO>, and timing fields
(seconds, tokens/s, dates) are dropped. A command that crashes (an exit code other than 0, 1 or
2, or a traceback) is recorded with its last stderr line and listed at the end.

`--compare BASELINE` recomputes and prints each difference (run, command, path in the JSON, old
value, new value), exiting 1 if there is any. `--ignore-mean-ablation` skips the outputs whose
definition issue 21 changes on purpose: mean ablation of heads in several layers (`ablate`,
`eval --ablate`) and `heads --importance --mode mean` (its pruning curve ablates heads in
several layers). `--allow mean-definition,crash-fixed` lets through the other intended
changes, each narrowly (ALLOWANCES): mean ablation's new `mean_from` field and its note's ", in
its clean run", a baseline crash that now gives a result, `attnlab check`'s new last row
(graph-check: "residual graph == forward", issue 27, appended and passed or skipped), and
(dot-similarity) the dot products similarity's JSON holds beside its cosines (issue 29).
`--record FILE` compares a saved record (an earlier `--out`) instead of recomputing. `--tol`
compares floats with a relative tolerance (default 0: exact).

After issue 21 (one-thread runs, 547 commands on 11 runs): with --ignore-mean-ablation and
--allow mean-definition,crash-fixed, no differences; 32 allowed (20 `mean_from`, 10 notes, the
attention-only GPT's two DLA commands that crashed before).

The baseline, benchmarks/verb_json_baseline.json, is re-recorded with `--out` when a verb's JSON
changes on purpose (the commit says what changed); it holds one command's output per line, so
its diff reads by command. Last recorded on issue 27's branch (main 0ca852d, 547 commands on 11
runs, minilm included): against the issue-21 record 11,490 differences, all from later issues'
intended changes (see the commit that re-recorded it).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANGUAGES = ROOT / "examples" / "language_en_es.tsv"
SMALL = ["--n-layer", "2", "--n-head", "2", "--d-model", "32", "--block-size", "64"]
COMMON = ["--threads", "1", "--seed", "1", "--quiet", "--json"]

# ---------------------------------------------------------------------------------------------
# the runs
# ---------------------------------------------------------------------------------------------

NAMES = ["Mary", "John", "Anna", "Mark", "Paul", "Rose"]
THINGS = ["book", "drink", "cake", "ball", "coin", "rose"]
PLACES = ["store", "river", "park", "house", "bank", "hill"]


def corpus() -> str:
    """A small generated English text (seeded): a char GPT's and a masked LM's corpus."""
    rng = random.Random(0)
    lines = []
    for _ in range(400):
        a, b = rng.sample(NAMES, 2)
        lines.append(f"When {a} and {b} went to the {rng.choice(PLACES)}, {b} gave a "
                     f"{rng.choice(THINGS)} to {a}.")  # fmt: skip
    return "\n".join(lines) + "\n"


BERT_WORDS = ["the", "bank", "of", "river", "day", "good", "water", "a", "is"]


def hf_gpt2(d: Path) -> None:
    """A tiny random GPT2LMHeadModel with a byte-level BPE (vocab.json + merges.txt)."""
    import torch
    import transformers
    from tokenizers.pre_tokenizers import ByteLevel

    byte_chars = sorted(ByteLevel.alphabet())  # the 256 characters GPT-2 writes bytes as
    merges = [("t", "h"), ("h", "e"), ("th", "e"), ("Ġ", "t"), ("Ġt", "he"), ("Ġ", "b"),
              ("a", "n"), ("Ġb", "an"), ("Ġban", "k"), ("Ġ", "o"), ("Ġo", "f")]  # fmt: skip
    vocab = {c: i for i, c in enumerate(byte_chars)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=len(vocab), n_positions=64, n_embd=32, n_layer=2,
                                  n_head=2, bos_token_id=len(vocab) - 1,
                                  eos_token_id=len(vocab) - 1)  # fmt: skip
    transformers.GPT2LMHeadModel(cfg).save_pretrained(d)
    (d / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (d / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
                                  encoding="utf-8")  # fmt: skip


def hf_bert(d: Path) -> None:
    """A tiny random BertForMaskedLM with a WordPiece vocab.txt."""
    import torch
    import transformers

    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *BERT_WORDS, *letters,
             *("##" + c for c in letters)]  # fmt: skip
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=64)  # fmt: skip
    transformers.BertForMaskedLM(cfg).save_pretrained(d)
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")


def runs() -> dict[str, dict]:
    """name -> how it is made ("train": train's arguments, or "hf": a builder / "minilm") and
    what the verbs are given: text, a --reference, one head, heads in two layers, the patch
    pair with its target and foil, the attribution target, a file for eval / lens."""
    text_file = "corpus.txt"  # paths relative to the work directory, where every command runs
    s2s = ["--task", "seq2seq", "--data", "dates", "--max-iters", "15", "--batch-size", "16",
           "--d-model", "32"]  # fmt: skip
    dates = dict(text="march 3, 1999", ref="april 9, 2004", patch=("march 3, 1999",
                 "march 4, 1999", "9", "8"), target="9")  # fmt: skip
    gpt_text = dict(text="When Mary and John went to the store, John gave a book to",
                    ref="When Anna and Paul went to the river, Paul gave a cake to",
                    patch=("When Mary and John went to the store, John gave a book to ",
                           "When Mary and John went to the store, Mary gave a book to ", "M",
                           "J"), target="M", one="0.1", several="0.1,1.0",
                    data=text_file, lm=True)  # fmt: skip
    # fmt: off
    return {
        "gpt-char": dict(train=["--data", text_file, *SMALL, "--max-iters", "30"], **gpt_text),
        "induction": dict(
            train=["--task", "induction", "--data", "repeat:vocab=16,min_period=4,max_period=8",
                   "--max-iters", "20", "--snapshot-every", "10", "--d-model", "32",
                   "--block-size", "24", "--batch-size", "8"],
            text="3a7f0c3a7f0c3a7", ref="9e1d4b9e1d4b9e1",
            patch=("3a7f0c3a7f0c3a7", "3a7f0c3a7f0c3a8", "f", "0"), target="f",
            one="1.0", several="0.1,1.0", data=None),
        "mlm": dict(
            train=["--task", "mlm", "--data", text_file, "--tokenizer", "bpe",
                   "--vocab-size", "120", *SMALL, "--max-iters", "30"],
            text="when mary and john went to the store, john gave a [MASK] to mary.",
            ref="when anna and paul went to the river, paul gave a [MASK] to anna.",
            patch=("when mary and john went to the store, john gave a [MASK] to mary.",
                   "when mary and john went to the river, john gave a [MASK] to mary.",
                   "book", "cake"), target="book", one="0.1", several="0.1,1.0",
            data=text_file),
        "classify": dict(
            train=["--task", "classify", "--data", str(LANGUAGES), *SMALL, "--max-iters", "20"],
            text="where is the station?", ref="donde esta la estacion?",
            patch=("where is the station?", "dónde is the station?", "en", "es"),
            target="en", one="0.1", several="0.1,1.0", data=None),
        "transformer": dict(train=[*s2s, "--arch", "transformer", "--n-layer", "2",
                                   "--n-head", "2"], one="decoder.0.1",
                            site="encoder.blocks.0.mlp.hidden",
                            several="encoder.0.1,decoder.1.0,cross.1.1", **dates),
        "lstm-attention": dict(train=[*s2s, "--arch", "lstm-attention"], one="context",
                               several="context", site="decoder.hidden", **dates),
        "lstm": dict(train=[*s2s, "--arch", "lstm"], one="context", several="context",
                     site="decoder.hidden", **dates),
        "vit": dict(
            train=["--task", "classify", "--data", "digits", "--arch", "vit", "--max-iters", "15",
                   "--batch-size", "32", "--d-model", "32", "--n-head", "2"],
            text="test:0", ref="test:1", patch=("test:0", "test:1", "0", "1"), target="0",
            one="0.1", several="0.1,1.0", data=None),
        "gpt2": dict(hf=hf_gpt2, text="the bank of the river", ref="the day of the water",
                     patch=("the bank of the river", "the bank of the rivet", "the", "a"),
                     target="the", one="0.1", several="0.1,1.0", data=text_file,
                     lm=True),
        "bert": dict(hf=hf_bert, text="the [MASK] of the river", ref="the [MASK] of the water",
                     patch=("the bank of the [MASK]", "the day of the [MASK]", "river", "water"),
                     target="river", one="0.1", several="0.1,1.0",
                     data="river.txt"),
        "minilm": dict(hf="minilm", text="The bank of the river", ref="The day of the water",
                       patch=("the bank of the river", "the day of the river", "river",
                              "water"), target="river", one="0.1", several="0.1,5.2",
                       data=None),
    }
    # fmt: on


# ---------------------------------------------------------------------------------------------
# the commands
# ---------------------------------------------------------------------------------------------


def heads_args(spec: str) -> list[str]:
    return ["--context"] if spec == "context" else ["--head", spec]


def commands(r: dict) -> list[list[str]]:
    """Every --json command for one run; RUN stands for the run directory."""
    t, ref, (clean, corrupt, target, foil) = r["text"], r["ref"], r["patch"]
    data = ["--data", r["data"]] if r.get("data") else []
    adata = data if r.get("lm") else []  # eval --ablate --data: a GPT only
    J, mean = ["--json"], ["--mode", "mean"]
    pair = ["--clean", clean, "--corrupt", corrupt, "--target", target]  # patch's inputs
    cmds = [
        ["predict", "RUN", t, "--top-k", "3", *J],
        ["predict", "RUN", t, ref, "--top-k", "2", "--beam", "2", *J],
        ["eval", "RUN", "--limit", "8", *J],
        ["eval", "RUN", "--limit", "8", "--max-tokens", "512", *data, *J],
        ["eval", "RUN", "--max-tokens", "512", *adata, "--ablate", r["one"], *J],
        ["eval", "RUN", "--max-tokens", "512", *adata, "--ablate", r["several"], *mean, *J],
        ["generate", "RUN", t, "--max-new-tokens", "8", "--seed", "1", *J],
        ["generate", "RUN", t, "--max-new-tokens", "6", "--beam", "2", "--num-samples", "2", *J],
        ["trace", "RUN", t, "--top", "3", *J],
        ["trace", "RUN", t, "--layer", "1", "--head", "1", "--top", "3", *J],
        ["attention", "RUN", t, *J],
        ["attention", "RUN", t, "--layer", "1", "--head", "1", *J],
        ["attention", "RUN", t, "--mean", *J],
        ["attention", "RUN", t, "--map", "cross", *J],
        ["similarity", "RUN", t, *J],
        ["influence", "RUN", t, *J],
        ["check", "RUN", "--length", "8", "--seed", "0", *J],
    ]
    h1, hn = heads_args(r["one"]), heads_args(r["several"])
    for heads in (h1, hn):
        for mode in ("zero", "mean"):
            for reference in ([], ["--reference", ref]):
                cmds.append(["ablate", "RUN", t, *heads, "--mode", mode, *reference, "--top", "3",
                             *J])  # fmt: skip
    cmds += [
        ["ablate", "RUN", t, *h1, "--mode", "resample", "--reference", ref, "--top", "3", *J],
        [
            "ablate",
            "RUN",
            t,
            "--site",
            r.get("site", "blocks.0.mlp.hidden"),
            "--neurons",
            "0,1",
            *J,
        ],
        ["patch", "RUN", *pair, "--foil", foil, *J],
        ["patch", "RUN", *pair, "--by", "head", *J],
        ["patch", "RUN", *pair, "--by", "head", "--reverse", *J],
        ["lens", "RUN", t, *J],
    ]
    for method in ("dla", "rollout", "flow", "ig", "grad"):
        extra = [] if method in ("rollout", "flow") else ["--target", target]
        steps = ["--steps", "8"] if method == "ig" else []
        cmds.append(["attribute", "RUN", t, "--method", method, *extra, *steps, *J])
    cmds += [
        ["attribute", "RUN", t, "--method", "dla", "--target", target, "--foil", foil, *J],
        ["attribute", "RUN", t, "--method", "rollout", "--stack", "encoder", *J],
        ["heads", "RUN", "--sequences", "4", "--seed", "0", *J],
        ["heads", "RUN", "--sequences", "4", "--seed", "0", "--all", *J],
        ["heads", "RUN", t, "--importance", "--quiet", *J],
        ["heads", "RUN", t, "--importance", *mean, "--quiet", *J],
        ["classify", "RUN", t, "--top", "3", *J],
        ["translate", "RUN", t, *J],
        ["translate", "RUN", t, "--beam", "2", *J],
        ["embed", "RUN", t],
        ["embed", "RUN", t, ref, "--pool", "cls", "--normalize"],
        ["timeline", "RUN", *J],
        ["timeline", "RUN", "--probe", "sample", *J],
    ]
    if r.get("data"):  # the tuned lens: fitted (its own output), then read
        cmds += [["lens", "RUN", "--train-tuned", *data, "--max-tokens", "2000", "--quiet",
                  *J], ["lens", "RUN", t, "--tuned", *J]]  # fmt: skip
    return [[*c, "--threads", "1"] if c[0] not in ("embed",) else c for c in cmds]


def is_mean_multilayer(key: str) -> bool:
    """A command whose output issue 21 changes on purpose: mean ablation over several layers."""
    a = shlex.split(key)
    if "--mode" not in a or a[a.index("--mode") + 1] != "mean":
        return False
    if a[0] == "heads":
        return True  # the pruning curve ablates heads in several layers
    for flag in ("--head", "--ablate"):
        if flag in a:
            layers = {h.rsplit(".", 1)[0] for h in a[a.index(flag) + 1].split(",")}
            return len(layers) > 1
    return False


# ---------------------------------------------------------------------------------------------
# running and normalising
# ---------------------------------------------------------------------------------------------

TIMING = re.compile(r"(^|_)(seconds?|secs?|s|ms|time|times|elapsed|wall|duration|date|"
                    r"tokens_per_s|tok_per_s|per_s|throughput|cpu_s|load)$")  # fmt: skip


class Runner:
    def __init__(self, work: Path, fresh: bool):
        self.work, self.fresh = work, fresh
        self.env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1",
                    "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0",
                    "ATTNLAB_CACHE": str(work / "cache")}  # fmt: skip
        if not fresh:
            os.environ.update({k: v for k, v in self.env.items() if k != "PYTHONPATH"})
            sys.path.insert(0, str(ROOT / "src"))
            import matplotlib.pyplot  # noqa: F401  (every import paid once, before any fork)

            import attnlab.inspect  # noqa: F401
            import attnlab.interventions  # noqa: F401
            from attnlab.cli import build_parser

            build_parser()  # imports every area's verbs, and torch
            if importlib.util.find_spec("sklearn"):  # the ViT's digits
                importlib.import_module("sklearn.datasets")

    def call(self, fn, *args) -> tuple[int, str, str]:
        """fn(*args) in a forked child: (exit code, stdout, stderr)."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the child: its stdout and stderr go to the two files
                code = 1
                try:
                    os.dup2(out.fileno(), 1)
                    os.dup2(err.fileno(), 2)
                    os.chdir(self.work)
                    code = fn(*args) or 0
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                except BaseException:
                    traceback.print_exc()
                finally:
                    try:
                        sys.stdout.flush()
                        sys.stderr.flush()
                    finally:
                        os._exit(code)
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            out.seek(0)
            err.seek(0)
            return (
                code,
                out.read().decode("utf-8", "replace"),
                err.read().decode("utf-8", "replace"),
            )

    def attnlab(self, args: list[str]) -> tuple[int, str, str]:
        if self.fresh:
            r = subprocess.run([sys.executable, "-m", "attnlab", *args], env=self.env,
                               cwd=self.work, capture_output=True, text=True)  # fmt: skip
            return r.returncode, r.stdout, r.stderr
        from attnlab.cli import main

        return self.call(main, args)


LONG = 32  # a list of more numbers than this is kept as its summary


def numbers(x) -> list | None:
    """The numbers of a (nested) list of numbers, flattened; None if it holds anything else."""
    if isinstance(x, list):
        out = []
        for v in x:
            sub = numbers(v)
            if sub is None:
                return None
            out += sub
        return out
    if x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)):
        return [x]
    return None


def shape(x) -> list[int]:
    return [len(x), *shape(x[0])] if isinstance(x, list) and x else ([0] if x == [] else [])


def summary(flat: list, x: list) -> dict:
    """A long list of numbers as its shape, first values and three sums (the last weighted by
    position, so that a permutation shows too)."""
    vals = [v for v in flat if v is not None]
    return {"summary of": shape(x), "first": flat[:4], "sum": math.fsum(vals),
            "abs_sum": math.fsum(abs(v) for v in vals),
            "weighted_sum": math.fsum(v * (i % 97 + 1) for i, v in enumerate(vals)),
            "nulls": len(flat) - len(vals)}  # fmt: skip


def normalise(x, work: str):
    if isinstance(x, dict):
        return {k: normalise(v, work) for k, v in x.items() if not TIMING.search(k)}
    if isinstance(x, list):
        flat = numbers(x)
        if flat is not None and len(flat) > LONG and all(math.isfinite(v) for v in flat if v):
            return summary(flat, x)
        return [normalise(v, work) for v in x]
    if isinstance(x, str):
        return x.replace(work, "<WORK>").replace(str(ROOT), "<REPO>")
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)  # NaN and inf as text: JSON has neither
    return x


def record(args: list[str], code: int, out: str, err: str, work: str) -> tuple[object, str | None]:
    """What one command gave, and its crash line if it crashed."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    last = lines[-1].replace(work, "<WORK>").replace(str(ROOT), "<REPO>") if lines else ""
    crashed = (code not in (0, 2) and not (code == 1 and args[0] == "check")) or any(
        s in err for s in ("Traceback (most recent call last)", "internal error")
    )
    try:
        parsed = normalise(json.loads(out), work) if out.strip() else None
    except json.JSONDecodeError:
        parsed = normalise(out.strip(), work)
    if code == 0 and not crashed:
        return parsed, None
    rec = {"exit": code, "stderr": last}
    if parsed is not None:
        rec["stdout"] = parsed
    return rec, (last if crashed else None)


def make_runs(runner: Runner, only: set[str]) -> tuple[dict, dict, list]:
    work = runner.work
    (work / "corpus.txt").write_text(corpus(), encoding="utf-8")
    (work / "river.txt").write_text("\n".join(" ".join(BERT_WORDS[i:] + BERT_WORDS[:i])
                                              for i in range(9)) * 4, encoding="utf-8")  # fmt: skip
    specs = {n: s for n, s in runs().items() if not only or n in only}
    made, results, crashes = {}, {}, []
    for name, spec in specs.items():
        run = f"runs/{name}"  # relative: no message holds the work directory's path
        t0 = time.perf_counter()
        key = None
        if "train" in spec:
            args = ["train", *spec["train"], "--out", run, *COMMON]
            key = shlex.join(["train", *spec["train"], "--out", "RUN", *COMMON])
            key = key.replace(str(ROOT), "<REPO>")  # the data file's path, as outputs are
            res = runner.attnlab(args)
        elif spec["hf"] == "minilm":
            res = runner.attnlab(["import-hf", "minilm", "--out", run])
        else:
            hf = work / "hf" / name
            code, _, err = runner.call(spec["hf"], hf)  # not a verb: always in a forked child
            res = (
                runner.attnlab(["import-hf", f"hf/{name}", "--out", run])
                if code == 0
                else (code, "", err)
            )
        code, out, err = res
        results[name] = {}
        if key:
            rec, crash = record(args, code, out, err, str(work))
            results[name][key.replace(str(work), "<WORK>")] = rec
        if code != 0:
            line = err.strip().splitlines()[-1] if err.strip() else f"exit {code}"
            print(f"{name}: not made ({line})", file=sys.stderr)
            if name != "minilm":
                crashes.append((name, "make", line))
            continue
        made[name] = (run, spec)
        print(f"{name}: made in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return made, results, crashes


def collect(work: Path, fresh: bool, only: set[str]) -> tuple[dict, list]:
    work.mkdir(parents=True, exist_ok=True)
    work = work.resolve()
    runner = Runner(work, fresh)
    made, results, crashes = make_runs(runner, only)
    for name, (run, spec) in made.items():
        t0 = time.perf_counter()
        for cmd in commands(spec):
            key = shlex.join(c.replace(str(work), "<WORK>") for c in cmd)
            t1 = time.perf_counter()
            code, out, err = runner.attnlab([run if c == "RUN" else c for c in cmd])
            rec, crash = record(cmd, code, out, err, str(work))
            results[name][key] = rec
            if crash is not None:
                crashes.append((name, key, crash))
            if time.perf_counter() - t1 > 5:
                print(f"  {time.perf_counter() - t1:.1f} s: {key}", file=sys.stderr)
        print(f"{name}: {len(results[name])} commands in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)  # fmt: skip
    return results, crashes


# ---------------------------------------------------------------------------------------------
# comparing
# ---------------------------------------------------------------------------------------------


def differences(old, new, path: str, tol: float):
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new)):
            sub = f"{path}.{k}" if path else k
            if k not in old:
                yield sub, "(absent)", new[k]
            elif k not in new:
                yield sub, old[k], "(absent)"
            else:
                yield from differences(old[k], new[k], sub, tol)
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            yield from differences(a, b, f"{path}[{i}]", tol)
    elif (isinstance(old, (int, float)) and isinstance(new, (int, float))
          and not isinstance(old, bool) and not isinstance(new, bool)):  # fmt: skip
        if old != new and not (tol and math.isclose(old, new, rel_tol=tol, abs_tol=tol)):
            yield path, old, new
    elif old != new:
        yield path, old, new


def short(v) -> str:
    s = json.dumps(v)
    return s if len(s) <= 100 else s[:97] + "..."


def is_mean(key: str) -> bool:
    """A command that takes a mean ablation (`--mode mean`)."""
    a = shlex.split(key)
    return "--mode" in a and a[a.index("--mode") + 1] == "mean"


def crashed(output) -> bool:
    """A recorded output that is an internal error (a crash), not a refusal or a result."""
    return isinstance(output, dict) and "attnlab: internal error:" in str(output.get("stderr", ""))


# Allowances for differences issue 21 makes on purpose, each named and as narrow as the change:
#   mean-definition  mean ablation says where its means come from: the new `mean_from` field,
#                    and the note's "mean over the text's own positions" gains ", in its clean
#                    run" (every mean comes from the clean run: issue 21 item 7)
#   crash-fixed      a command whose baseline is an internal error now gives a result (the
#                    attention-only GPT's DLA: KeyError 'blocks.0.mlp_out' before)
ALLOWANCES = ("mean-definition", "crash-fixed", "graph-check", "dot-similarity")
GRAPH_CHECK = "residual graph == forward"  # issue 27's check row: the declared graph adds up
CLEAN_RUN_NOTE = ("mean over the text's own positions;",
                  "mean over the text's own positions, in its clean run;")  # fmt: skip


def allowed(key: str, path: str, a, b, allow: set[str]) -> bool:
    if "dot-similarity" in allow and shlex.split(key)[0] == "similarity" and a == "(absent)":
        # issue 29: similarity's JSON holds the raw dot products beside the cosines
        return re.fullmatch(r"layers\[\d+\]\.(mean_)?dot_(before|after)", path) is not None
    if "graph-check" in allow and key.split()[0] == "check" and path == "checks":
        # the one new row, appended, and not failed; every other row as it was
        return (isinstance(a, list) and isinstance(b, list) and b[:-1] == a
                and b[-1].get("name") == GRAPH_CHECK and b[-1].get("passed") is not False)  # fmt: skip
    if "mean-definition" in allow and is_mean(key):
        if path == "mean_from" and a == "(absent)":
            return True
        if re.fullmatch(r"notes\[\d+\]", path) and isinstance(a, str):
            return a.replace(*CLEAN_RUN_NOTE) == b
    return False


def repo_keys(commands: dict) -> dict:
    """``commands`` with a repository path in a command (the classifier's data file) written
    <REPO>, as in the outputs: a record made in another checkout compares equal."""
    return {re.sub(r"\S*/(?=examples/)", "<REPO>/", k): v for k, v in commands.items()}


def compare(old: dict, new: dict, ignore_mean: bool, tol: float, only: set[str],
            allow: set[str] = frozenset()) -> int:  # fmt: skip
    n = allowed_n = 0
    for run in sorted((set(old) | set(new)) & (only or set(old) | set(new))):
        o, w = repo_keys(old.get(run, {})), repo_keys(new.get(run, {}))
        for key in sorted(set(o) | set(w)):
            if ignore_mean and is_mean_multilayer(key):
                continue
            if key not in o or key not in w:
                print(f"[{run}] {key}: only in the {'new' if key in w else 'baseline'} record")
                n += 1
                continue
            fixed = crashed(o[key]) and "exit" not in w[key]  # a result now, not a refusal
            if "crash-fixed" in allow and fixed:
                print(f"[{run}] {key}: allowed (crash-fixed): {short(o[key]['stderr'])}")
                allowed_n += 1
                continue
            for path, a, b in differences(o[key], w[key], "", tol):
                if allowed(key, path, a, b, allow):
                    allowed_n += 1
                    continue
                print(f"[{run}] {key}\n    {path or '(whole)'}: {short(a)} -> {short(b)}")
                n += 1
    if allowed_n:
        print(f"{allowed_n} allowed difference(s) ({', '.join(sorted(allow))})", file=sys.stderr)
    print(f"{n} difference(s)" if n else "no differences", file=sys.stderr)
    return 1 if n else 0


def record_text(results: dict) -> str:
    """The record as JSON text with one command's output on each line (compact, keys sorted):
    a re-recorded baseline diffs by command, and the 547 outputs stay well under 2 MiB (1.4 MB;
    indented, they had grown past it)."""
    lines = ["{"]
    runs = sorted(results)
    for i, run in enumerate(runs):
        lines.append(f" {json.dumps(run)}: {{")
        keys = sorted(results[run])
        for j, key in enumerate(keys):
            out = json.dumps(results[run][key], sort_keys=True, separators=(",", ":"))
            lines.append(f"  {json.dumps(key)}: {out}" + ("," if j < len(keys) - 1 else ""))
        lines.append(" }" + ("," if i < len(runs) - 1 else ""))
    return "\n".join([*lines, "}"]) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", help="write the record here (JSON)")
    p.add_argument("--work", help="where the runs are made (default: a temporary directory)")
    p.add_argument("--compare", metavar="BASELINE", help="recompute and diff against BASELINE")
    p.add_argument(
        "--ignore-mean-ablation",
        action="store_true",
        help="--compare: skip mean ablation of heads in several layers",
    )
    p.add_argument(
        "--allow",
        default="",
        help="--compare: comma-separated allowances for intended changes: "
        + ", ".join(ALLOWANCES)
        + " (see ALLOWANCES in the source)",
    )
    p.add_argument(
        "--record",
        metavar="FILE",
        help="--compare: diff BASELINE against this record (a previous --out) instead of "
        "recomputing",
    )
    p.add_argument(
        "--tol",
        type=float,
        default=0.0,
        help="--compare: relative (and absolute) tolerance on numbers (default 0)",
    )
    p.add_argument("--only", default="", help="comma-separated run names (default: all)")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="start `python -m attnlab` for every command instead of forking",
    )
    args = p.parse_args()
    if os.environ.get("PYTHONHASHSEED") != "0":  # the same set order in every child
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  {**os.environ, "PYTHONHASHSEED": "0"})  # fmt: skip
    if not args.out and not args.compare:
        p.error("give --out FILE, --compare BASELINE, or both")
    only = {n for n in args.only.split(",") if n}
    allow = {a for a in args.allow.split(",") if a}
    if allow - set(ALLOWANCES):
        p.error(f"--allow: unknown {', '.join(sorted(allow - set(ALLOWANCES)))}; "
                f"known: {', '.join(ALLOWANCES)}")  # fmt: skip
    if args.record:
        if not args.compare:
            p.error("--record needs --compare BASELINE")
        old = json.loads(Path(args.compare).read_text(encoding="utf-8"))
        new = json.loads(Path(args.record).read_text(encoding="utf-8"))
        sys.exit(compare(old, new, args.ignore_mean_ablation, args.tol, only, allow))
    t0 = time.perf_counter()
    if args.work:
        results, crashes = collect(Path(args.work), args.fresh, only)
    else:
        with tempfile.TemporaryDirectory(prefix="verb_json_") as d:
            results, crashes = collect(Path(d), args.fresh, only)
    n = sum(len(v) for v in results.values())
    print(f"{n} commands on {len(results)} runs in {time.perf_counter() - t0:.0f} s",
          file=sys.stderr)  # fmt: skip
    for name, key, line in crashes:
        print(f"CRASH [{name}] {key}\n    {line}", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(record_text(results), encoding="utf-8")
    if args.compare:
        old = json.loads(Path(args.compare).read_text(encoding="utf-8"))
        sys.exit(compare(old, results, args.ignore_mean_ablation, args.tol, only, allow))


if __name__ == "__main__":
    main()
