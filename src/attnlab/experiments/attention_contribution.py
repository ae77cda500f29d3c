"""``attention-vs-contribution``: the notes' own question. Their LSTM with attention turns
"let's go" into "vamos" by taking 40% of the encoding of "let's" and 60% of "go": the attention
weights say how much of each source word the output step uses. Does what a step attends to
match what the step's output depends on, when the source tokens are knocked out one at a time?

On the phrase-book and dates encoder-decoders, for an LSTM with (dot) attention and a
Transformer, per held-out source and per decoder step t, with y_t the model's own greedy
output at t (the decoder reads <bos> + that output, as every intervention does):
  - attention a_t(s): the step's weight on source token s, in the head groups the model
    declares as reading the source (``source_attention()``: an LSTM's one context, a
    Transformer's cross-attention), mean over their heads and layers (the last layer alone is
    in a table);
  - blank-out c_t(s): how much log p(y_t) drops when source token s is replaced, at the
    model's input-attribution site, by its declared "no token" point (``gradient_baseline``:
    zeros for the LSTM, the position without its token for the Transformer);
  - patching c_t(s): how much log p(y_t) drops when only the encoder's output at s (the
    declared ``memory_site``, the vectors the attention weighs) is patched in from that blanked
    run: the token's contribution through the attention path alone;
  - per step: Spearman's rho and Kendall's tau of a_t against c_t over the source tokens, and
    whether the most-attended token is the one whose removal costs the most (chance: 1 / S).
Contributions are rounded to 1e-5 nats (below that they are float32 noise, and rank as ties);
sources of fewer than 3 tokens (<eos> counted) rank too little and are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from attnlab.experiments.recipe import Context, Experiment, ExperimentError, register
from attnlab.experiments.report import Claim, Report, Table, value_range
from attnlab.experiments.stats import kendall, mean_defined, spearman

CITATION = ("the notes' attention example (an LSTM encoder-decoder with attention translating "
            "\"let's go\" to \"vamos\"); Bahdanau et al. (2015) and Luong et al. (2015) for the "
            "model; Jain & Wallace (2019) for the question")  # fmt: skip
NOTES_CLAIM = ("the notes: a decoder step's attention weights decide how much of each source "
               "word its output uses (40% \"let's\", 60% \"go\" -> \"vamos\")")  # fmt: skip
NOTES_SHORT = "the notes: attention weights decide how much of each source word is used"
NOTES_SOURCE, NOTES_OUTPUT = "let's go", "vamos"
IMPORTANCES = ("blank-out", "patching")
ROUNDING = 1e-5  # nats: contributions closer than this are ties (float32 noise)
MIN_SOURCE = 3  # tokens, <eos> counted: fewer rank nothing worth a correlation
PHRASES = "examples/phrases_en_es.tsv"
DATES = "dates:n_train=5000,n_val=200,n_test=200"


@dataclass(frozen=True)
class Model:
    task: str  # phrases | dates
    arch: str  # the --arch it is trained with
    label: str
    short: str  # the label in a table's column
    options: dict
    quick_options: dict | None  # None: left out of --quick


def _phrases(arch: str, width: int) -> dict:
    return dict(task="seq2seq", data=PHRASES, tokenizer="word", arch=arch, batch_size=32,
                lr=3e-3, max_iters=300, eval_interval=300, d_model=width)  # fmt: skip


def _dates(arch: str, width: int, **more) -> dict:
    return dict(task="seq2seq", data=DATES, arch=arch, batch_size=64, max_iters=600,
                eval_interval=600, d_model=width, **more)  # fmt: skip


def _quick(options: dict, width: int, **more) -> dict:
    return {**options, "max_iters": 120, "eval_interval": 120, "d_model": width, **more}


MODELS = (
    Model("phrases", "lstm-attention", "LSTM with attention", "LSTM+attn",
          _phrases("lstm-attention", 128), _quick(_phrases("lstm-attention", 128), 64)),
    Model("phrases", "transformer", "Transformer (cross-attention)", "Transformer",
          _phrases("transformer", 64), _quick(_phrases("transformer", 64), 32, n_layer=1)),
    Model("dates", "lstm-attention", "LSTM with attention", "LSTM+attn",
          _dates("lstm-attention", 128, lr=3e-3), None),
    Model("dates", "transformer", "Transformer (cross-attention)", "Transformer",
          _dates("transformer", 64, lr=2e-3, dropout=0.0), None),
)  # fmt: skip
KINDS = tuple(dict.fromkeys((m.arch, m.label) for m in MODELS))  # (arch, label), in order


# -- the measures ------------------------------------------------------------------------------


@torch.no_grad()
def source_attention(subject, p) -> np.ndarray:
    """Each source-reading head group's weights, mean over its heads: (G, T, S) for the
    decoder steps T and source tokens S of the prepared input ``p``."""
    from attnlab.interventions.edits import edited

    names = [g.path + ".weights" for g in subject.model.source_attention()]
    if not names:
        raise ValueError(f"a {subject.kind} model declares no attention over a source")
    with edited(subject.model, {}, names) as (cache, _):
        subject.logits(p)
    return np.stack([cache[n][0].double().mean(0).cpu().numpy() for n in names])


def _log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets[t]) at every decoder step t: (B, T, V) -> (B, T)."""
    lp = torch.log_softmax(logits.double(), -1)
    t = targets.to(lp.device)
    return lp[:, torch.arange(t.numel(), device=lp.device), t]


@torch.no_grad()
def contributions(subject, p) -> dict[str, np.ndarray]:
    """{"blank-out": (T, S), "patching": (T, S)}: the drop in log p(y_t) at decoder step t
    when source token s is blanked at the input, or when only its encoder output is patched in
    from that blanked run (module doc). One batched pass each: row s knocks out token s."""
    from attnlab.interventions.edits import edited

    model = subject.model
    site, memory, first = model.gradient_site, model.memory_site, model.gradient_first_token
    S = p.args[0].size(1)
    rows = torch.arange(S)

    def blank(x, name):  # (S, S', C): row s has source token s at the "no token" point
        y = x.clone()
        y[rows, rows + first] = model.gradient_baseline(x[:1])[0, rows + first].to(y.dtype)
        return y

    clean = _log_probs(subject.logits(p), p.targets)[0]  # (T,)
    with edited(model, {site: blank}, [memory]) as (cache, _):
        blanked = _log_probs(subject.logits(p, batch=S), p.targets)  # (S, T)
    from_blank = cache[memory][rows, rows]  # (S, C): memory at s, in the run that blanked s

    def patch(x, name):  # (S, S, C): row s has the blanked run's memory at s, nothing else
        y = x.clone()
        y[rows, rows] = from_blank.to(y.dtype)
        return y

    with edited(model, {memory: patch}):
        patched = _log_probs(subject.logits(p, batch=S), p.targets)  # (S, T)
    return {
        "blank-out": _rounded(clean[None] - blanked),
        "patching": _rounded(clean[None] - patched),
    }


def _rounded(drop: torch.Tensor) -> np.ndarray:
    """(S, T) drops as (T, S), to ROUNDING nats: smaller differences are float noise (a token
    the step does not attend to moves log p by ~1e-7), so they rank as ties, not at random."""
    return np.round(drop.T.cpu().numpy() / ROUNDING) * ROUNDING + 0.0  # no -0.0


def step_agreement(attention: np.ndarray, contribution: np.ndarray) -> dict[str, list]:
    """Per decoder step (rows of the (T, S) arrays): Spearman's rho and Kendall's tau of the
    attention against the contribution, whether their argmaxes agree, and the chance of that
    (1 / S)."""
    T, S = attention.shape
    return {
        "spearman": [spearman(attention[t], contribution[t]) for t in range(T)],
        "kendall": [kendall(attention[t], contribution[t]) for t in range(T)],
        "top_agrees": [bool(np.argmax(attention[t]) == np.argmax(contribution[t]))
                       for t in range(T)],
        "chance": [1.0 / S] * T,
    }  # fmt: skip


def example(subject, text: str) -> dict | None:
    """Every step's agreement for one source (None if it is shorter than MIN_SOURCE tokens),
    for the attention over every source-reading layer and over the last one."""
    p = subject.prepare(text)
    if len(p.input_tokens) < MIN_SOURCE:
        return None
    maps = source_attention(subject, p)  # (G, T, S)
    found = contributions(subject, p)
    return {f"{which}/{imp}": step_agreement(att, found[imp])
            for which, att in (("all", maps.mean(0)), ("last", maps[-1]))
            for imp in IMPORTANCES}  # fmt: skip


def summary(rows: list[dict]) -> dict:
    """Steps pooled over the examples: mean rho and tau (defined ones), the share of steps whose
    top tokens agree, its chance level; and every step's rho and tau, for the figures."""
    out = {}
    for key in rows[0]:
        steps = {k: [v for r in rows for v in r[key][k]] for k in rows[0][key]}
        out[key] = {
            "spearman": mean_defined(steps["spearman"])[0],
            "kendall": mean_defined(steps["kendall"])[0],
            "top_agrees": float(np.mean(steps["top_agrees"])),
            "chance": float(np.mean(steps["chance"])),
            "steps": len(steps["spearman"]),
            "spearman_all": steps["spearman"],
            "kendall_all": steps["kendall"],
        }
    return out


@torch.no_grad()
def notes_example(subject) -> dict:
    """The notes' example: the first decoder step on "let's go", its output, the attention on
    each source token and what blanking and patching each token costs that output."""
    p = subject.prepare(NOTES_SOURCE)
    attention = source_attention(subject, p).mean(0)[0]  # (S,)
    found = contributions(subject, p)
    out = {"tokens": list(p.input_tokens), "output": subject.decode(int(p.targets[0])),
           "attention": attention.tolist()}  # fmt: skip
    for imp in IMPORTANCES:
        out[imp] = found[imp][0].tolist()
        out[f"top_agrees_{imp}"] = bool(np.argmax(attention) == np.argmax(found[imp][0]))
    return out


# -- the recipe --------------------------------------------------------------------------------


def sources(run, n: int) -> list[str]:
    """The run's own held-out sources (its validation, then test split), the first ``n``."""
    from attnlab.data.tasks import rebuild

    data = rebuild(run.config["data"])
    return [s for s, _ in [*data.val, *data.test]][:n]


def measure(ctx: Context, model: Model, seed: int, n: int) -> tuple[dict, str]:
    options = model.quick_options if ctx.quick else model.options
    name = f"{model.task}-{model.arch}-seed{seed}"
    run = ctx.train(name, {**options, "seed": seed})
    subject = run.subject
    texts = sources(run, n)
    ctx.log(f"experiment: attention against contribution on {name}, {len(texts)} sources")
    rows = [r for r in (example(subject, t) for t in texts) if r is not None]
    if not rows:
        raise ExperimentError(f"{name}: no held-out source has {MIN_SOURCE} tokens to rank")
    res = summary(rows)
    res["sources"] = len(rows)
    res["layers"] = len(subject.model.source_attention())
    res["steps"] = res["all/blank-out"]["steps"]
    res["exact_match"] = (run.config.get("metrics") or {}).get("val_exact", math.nan)
    if model.task == "phrases":
        res["notes"] = notes_example(subject)
    return res, str(run.path.relative_to(ctx.out))


def recipe(ctx: Context) -> Report:
    models = [m for m in MODELS if not ctx.quick or m.quick_options is not None]
    n = 12 if ctx.quick else 60
    results: dict[tuple[str, str], dict[int, dict]] = {}
    runs = []
    for m in models:
        results[m.task, m.arch] = {}
        for seed in ctx.seeds:
            res, path = measure(ctx, m, seed, n)
            results[m.task, m.arch][seed] = res
            runs.append((f"{m.label}, {m.task}, seed {seed}", path))
    tasks = list(dict.fromkeys(m.task for m in models))
    claims = []
    for m in models:
        r = results[m.task, m.arch]
        tag = f"{m.task}, {m.label}"
        for imp in IMPORTANCES:
            claims.append(Claim(
                f"{m.task}.{m.arch}.spearman_{imp}",
                f"the mean Spearman rho per step of attention with {imp} ({tag})",
                f"{NOTES_SHORT}: the more a step attends to a token, the more its output needs it",
                {s: r[s][f"all/{imp}"]["spearman"] for s in r}, ">=", 0.5, "signed"))  # fmt: skip
        for imp, verb in (("blank-out", "blanking"), ("patching", "patching")):
            claims.append(Claim(
                f"{m.task}.{m.arch}.top_{imp}",
                f"the share of steps whose most-attended source token is the one {verb} costs "
                f"most ({tag})",
                f"{NOTES_SHORT}: the most-attended token is the one the output needs most",
                {s: r[s][f"all/{imp}"]["top_agrees"] for s in r}, ">=", 0.5, "%"))  # fmt: skip
    for arch, label in KINDS:
        r = results.get(("phrases", arch))
        if r is None:
            continue
        claims.append(Claim(
            f"notes.{arch}", f"the share of seeds in which the {label}'s most-attended token at "
            f"the first step of “{NOTES_SOURCE}” is the one blanking costs that output most",
            NOTES_CLAIM, {s: float(r[s]["notes"]["top_agrees_blank-out"]) for s in r}, ">=",
            1.0, "%"))  # fmt: skip
    report = Report(
        "attention-vs-contribution",
        "The notes' question: does a decoder step's attention say what its output uses?",
        CITATION,
        "Each encoder-decoder is trained with attnlab train, once per seed. On held-out "
        "sources, every decoder step's attention over the source tokens (mean over the heads "
        "and layers that read the source) is ranked against what each source token "
        "contributes to that step's output: the drop in the output's log-probability when the "
        "token is blanked at the input, and when only its encoder output (what the attention "
        "weighs) is patched in from that blanked run. Per step: Spearman's rho, Kendall's tau, "
        "and whether the top tokens agree.",
        claims=claims,
        tables=_tables(models, results, tasks),
        runs=runs,
        notes=[f"up to {n} held-out sources per run (its validation, then test split); sources "
               f"under {MIN_SOURCE} tokens (<eos> counted) are left out; <eos> is a source "
               "token like the others",
               "blank-out puts the model's declared no-token point at its input-attribution "
               "site: zeros for the LSTM's embedding, the position alone for the Transformer; "
               "patching copies only the blanked token's encoder output, so it measures the "
               "path through attention"]
        + (["--quick trains smaller models for fewer steps and leaves out dates"]
           if ctx.quick else []),
        data={f"{t}/{a}": {str(s): v for s, v in r.items()} for (t, a), r in results.items()},
    )  # fmt: skip
    report.pictures.append(("Spearman's rho per decoder step of attention with blank-out and "
                            "patching, every held-out source and seed, per task and model kind",
                            _distributions(models, results)))  # fmt: skip
    if "phrases" in tasks:
        report.pictures.append((f"The notes' example, {NOTES_SOURCE!r}, first decoder step "
                                f"(seed {ctx.seeds[0]}): attention beside what blanking and "
                                "patching each token costs the output (each scaled to its "
                                "largest)", _notes_figure(results, ctx.seeds[0])))  # fmt: skip
    return report


def _tables(models, results, tasks) -> list[Table]:
    corr, top = [], []
    for m in models:
        r = results[m.task, m.arch]
        seeds = list(r)
        one_layer = all(r[s]["layers"] == 1 for s in seeds)  # "last" is "all" again
        for which in ("all",) if one_layer else ("all", "last"):
            for imp in IMPORTANCES:
                k = f"{which}/{imp}"
                row = [m.task, m.short, which, imp]
                got = {key: value_range([r[s][k][key] for s in seeds], unit, True)
                       for key, unit in (("spearman", "signed"), ("kendall", "signed"),
                                         ("top_agrees", "%"), ("chance", "%"))}  # fmt: skip
                corr.append([*row, got["spearman"], got["kendall"]])
                top.append([*row, got["top_agrees"], got["chance"]])
    fitted = []
    for m in models:
        found = list(results[m.task, m.arch].values())
        fitted.append([m.task, m.short] + [value_range([r[k] for r in found], unit, True)
                                           for k, unit in (("exact_match", "%"),
                                                           ("sources", "count"),
                                                           ("steps", "count"))])  # fmt: skip
    caption = ("attention: the mean over every layer that reads the source, or the last one "
               "alone; range over seeds")  # fmt: skip
    tables = [Table("The models and what they were measured on (range over seeds)",
                    ["task", "model", "exact match", "sources", "decoder steps"], fitted,
                    "exact match: greedy output equal to the target on the run's validation "
                    "split, at the end of training"),
              Table("Rank correlation of attention with contribution, mean over decoder steps",
                    ["task", "model", "attention", "against", "rho", "tau"], corr, caption),
              Table("Share of steps whose most-attended token costs most when knocked out",
                    ["task", "model", "attention", "against", "agrees", "chance (1/S)"], top,
                    caption)]  # fmt: skip
    if "phrases" in tasks:
        rows = []
        for m in models:
            if m.task != "phrases":
                continue
            for s, res in results[m.task, m.arch].items():
                e = res["notes"]
                at = int(np.argmax(e["attention"]))
                tops = [e["tokens"][int(np.argmax(e[k]))] for k in IMPORTANCES]
                rows.append([m.short, s, e["output"], f"{e['tokens'][at]} {e['attention'][at]:.0%}",
                             *tops])  # fmt: skip
        tables.append(Table(f"The notes' example: {NOTES_SOURCE!r}, first decoder step",
                            ["model", "seed", "output", "top attended", "top blank-out",
                             "top patching"], rows,
                            f"the notes: 40% \"let's\", 60% \"go\" -> {NOTES_OUTPUT!r}; the word "
                            "tokenizer splits let's into let ' s; every token's share is in "
                            "figures.json"))  # fmt: skip
    return tables


def _distributions(models, results) -> str:
    from attnlab.interventions.figures import new_figure
    from attnlab.render.plots import png_html

    tasks = list(dict.fromkeys(m.task for m in models))
    kinds = [k for k in KINDS if any(m.arch == k[0] for m in models)]
    fig, axes = new_figure(len(tasks), len(kinds), figsize=(4.5 * len(kinds), 3.0 * len(tasks)),
                           squeeze=False)  # fmt: skip
    for row, task in zip(axes, tasks):
        for ax, (arch, label) in zip(row, kinds):
            found = results.get((task, arch), {})
            per = [[v for res in found.values() for v in res[f"all/{imp}"]["spearman_all"]
                    if not math.isnan(v)] for imp in IMPORTANCES]  # fmt: skip
            ax.hist(per, bins=np.linspace(-1, 1, 21), label=IMPORTANCES)
            ax.set_xlabel("Spearman's rho, attention vs contribution")
            ax.set_ylabel("decoder steps")
            ax.set_title(f"{task}: {label}", fontsize=9)
            ax.legend(fontsize=7)
    fig.tight_layout()
    return png_html(fig)


def _notes_figure(results, seed: int) -> str:
    from attnlab.interventions.figures import new_figure
    from attnlab.render.plots import png_html

    kinds = [(a, label) for a, label in KINDS if ("phrases", a) in results]
    fig, axes = new_figure(1, len(kinds), figsize=(4.5 * len(kinds), 3.0), squeeze=False)
    for ax, (arch, label) in zip(axes[0], kinds):
        e = results["phrases", arch][seed]["notes"]
        x = np.arange(len(e["tokens"]))
        for i, (k, colour) in enumerate(zip(("attention", *IMPORTANCES),
                                            ("tab:grey", "tab:blue", "tab:orange"))):  # fmt: skip
            v = np.asarray(e[k], dtype=np.float64)
            top = np.abs(v).max()
            ax.bar(x + (i - 1) * 0.27, v / top if top > 0 else v, 0.27, color=colour, label=k)
        ax.axhline(0, color="black", lw=0.5)
        ax.set_xticks(x, e["tokens"], fontsize=8)
        ax.set_title(f"{label}: -> {e['output']!r}", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return png_html(fig)


EXPERIMENT = register(Experiment(
    "attention-vs-contribution", "Does a decoder step's attention say what its output uses?",
    "the notes' question: encoder-decoder attention per step against blank-out and patching "
    "of each source token", CITATION, recipe,
    order=40,
    about=("the notes' question (does an encoder-decoder step's attention over the source match "
           "what blanking and patching each source token costs its output?)"),
))  # fmt: skip
