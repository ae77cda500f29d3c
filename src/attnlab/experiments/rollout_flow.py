"""``rollout-and-flow``: Abnar & Zuidema (2020), "Quantifying Attention Flow in Transformers".

Their finding (Table 1): as an explanation of which input tokens an output depends on, raw
attention agrees with blank-out and input-gradient importance in the first layer but poorly in
later ones; attention rollout and attention flow, which follow attention through the layers
and the residual connections, agree better in the later layers.

Here, for a Transformer encoder classifier (output: the class read at [CLS]) and a GPT
(output: the next token predicted at the last position), per held-out example:
  - raw attention at layer l: the output position's attention to each input token, averaged
    over the heads of layer l;
  - rollout and flow at layer l: ``attnlab.interventions.rollout`` / ``flow`` over layers
    0..l (A' = 0.5 A + 0.5 I), read at the output position;
  - blank-out importance of token j: |p(y | x) - p(y | x with token j replaced)|, y the
    model's own prediction on x; the replacement is [MASK] where the vocabulary has it, else
    the unknown token (the report says which);
  - input-gradient importance: |input x gradient| of y's logit at each token
    (``attnlab.interventions.input_attribution``, method grad);
  - Spearman's rho of each attention measure against each importance, per example; then the
    mean over examples (examples where either side is constant have no ranking: left out).
Special tokens ([CLS], [SEP]) take no part in the correlations.
"""

from __future__ import annotations

import numpy as np
import torch

from attnlab.experiments.pruning import MODELS
from attnlab.experiments.recipe import Context, Experiment, register
from attnlab.experiments.report import Claim, Report, Table, value_range
from attnlab.experiments.stats import mean_defined, spearman

CITATION = ("Abnar & Zuidema (2020), Quantifying Attention Flow in Transformers, ACL 2020, "
            "Table 1")  # fmt: skip
MEASURES = ("raw", "rollout", "flow")
IMPORTANCES = ("blank-out", "gradient")
SPECIAL = {"[CLS]", "[SEP]", "[PAD]", "[MASK]", "<pad>", "<bos>", "<eos>"}
# the first the vocabulary has; a space for a character vocabulary with none of them
BLANKS = ("[MASK]", "[UNK]", "<unk>", "[PAD]", "<pad>", " ")


def blank_token(tokenizer) -> tuple[str, int]:
    """(name, id) of the token blank-out puts in a token's place: the first of BLANKS the
    tokenizer's vocabulary holds (a character GPT's vocabulary has only its corpus's
    characters: there it is a space)."""
    vocab = getattr(tokenizer, "special_tokens", None) or {}
    for name in BLANKS:
        if name in vocab:
            return name, int(vocab[name])
    stoi = getattr(tokenizer, "stoi", None) or {}
    for name in BLANKS:
        if name in stoi:
            return ("a space" if name == " " else name), int(stoi[name])
    raise ValueError("the tokenizer has no mask, unknown or padding token to blank out with")


@torch.no_grad()
def blank_out(subject, p, position: int, blank_id: int) -> tuple[np.ndarray, int]:
    """|p(y | x) - p(y | x with token j blanked)| for each input token j (T,), y the model's
    prediction at output ``position``; and y."""
    x = p.args[0]  # (1, T) token ids
    probs = torch.softmax(subject.forward(x)[0, position].double(), -1)
    y = int(probs.argmax())
    T = x.size(1)
    variants = x.repeat(T, 1)  # (T, T): row j has token j blanked
    variants[torch.arange(T), torch.arange(T)] = blank_id
    changed = torch.softmax(subject.forward(variants)[:, position].double(), -1)[:, y]  # (T,)
    return (probs[y] - changed).abs().numpy(), y


@torch.no_grad()
def attention_maps(subject, p) -> np.ndarray:
    """Head-averaged self-attention of each layer (L, T, T), recorded on one forward pass."""
    from attnlab.interventions.edits import edited

    names = [g.path + ".weights" for g in subject.head_groups()]
    with edited(subject.model, {}, names) as (cache, _):
        subject.logits(p)
    return np.stack([cache[n][0].double().mean(0).numpy() for n in names])


def per_layer_measures(attn: np.ndarray, position: int) -> dict[str, list[np.ndarray]]:
    """raw, rollout and flow at each layer l (over layers 0..l), read at ``position``."""
    from attnlab.interventions import flow, rollout

    out: dict[str, list[np.ndarray]] = {m: [] for m in MEASURES}
    for layer in range(attn.shape[0]):
        out["raw"].append(attn[layer, position])
        out["rollout"].append(rollout(attn[: layer + 1])[position])
        out["flow"].append(flow(attn[: layer + 1], position))
    return out


def correlations(measures: dict[str, list[np.ndarray]], importance: dict[str, np.ndarray],
                 keep: np.ndarray) -> dict:  # fmt: skip
    """Spearman's rho of every (measure, layer) against every importance, on the tokens
    ``keep`` (a boolean mask): {importance: {measure: [rho per layer]}}."""
    return {imp: {m: [spearman(v[keep], importance[imp][keep]) for v in layers]
                  for m, layers in measures.items()}
            for imp in importance}  # fmt: skip


def example(subject, text: str, blank_id: int) -> dict:
    """Every correlation for one input text."""
    from attnlab.interventions import input_attribution

    p = subject.prepare(text)
    position = p.position
    blank, y = blank_out(subject, p, position, blank_id)
    grad = input_attribution(subject, text, subject.decode(y), method="grad", position=position)
    attn = attention_maps(subject, p)
    keep = np.array([t not in SPECIAL for t in p.input_tokens])
    importance = {"blank-out": blank, "gradient": np.abs(grad.values)}
    return correlations(per_layer_measures(attn, position), importance, keep)


def averaged(rows: list[dict]) -> dict:
    """The per-example correlations averaged: {importance: {measure: [mean rho per layer]}}."""
    first = rows[0]
    return {imp: {m: [mean_defined([r[imp][m][layer] for r in rows])[0]
                      for layer in range(len(first[imp][m]))]
                  for m in first[imp]}
            for imp in first}  # fmt: skip


def texts_for(model_name: str, n: int, seed: int) -> list[str]:
    """Held-out inputs: lines of the classifier's TSV file; windows of 32 characters from the
    last tenth of the Shakespeare corpus for the GPT (the end of the text is its held-out
    split)."""
    rng = np.random.default_rng(seed)
    if model_name == "encoder":
        from attnlab.experiments.recipe import example_file

        lines = example_file("language_en_es.tsv").read_text(encoding="utf-8").splitlines()
        texts = [ln.split("\t", 1)[1] for ln in lines if "\t" in ln]
        texts = [t for t in texts if len(t.split()) >= 2]
        pick = rng.choice(len(texts), size=min(n, len(texts)), replace=False)
        return [texts[i] for i in pick]
    from attnlab import data

    chars = []
    for chunk in data.open_corpus("shakespeare").chunks():
        chars.append(chunk)
    text = "".join(chars)
    tail = text[int(0.9 * len(text)) :]
    starts = rng.integers(0, len(tail) - 40, size=n)
    return [tail[s : s + 32] for s in starts]


def measure(ctx: Context, model, seed: int, n_texts: int) -> tuple[dict, str, str]:
    from attnlab.interventions.subjects import Subject

    options = model.quick_options if ctx.quick else model.options
    name = f"{model.name}-seed{seed}"
    run = ctx.train(name, {**options, "seed": seed})
    subject = Subject(run.model, run.tokenizer, run.config.get("labels"))
    blank_name, blank_id = blank_token(run.tokenizer)
    ctx.log(f"experiment: correlations on {name}, {n_texts} examples")
    rows = [example(subject, t, blank_id) for t in texts_for(model.name, n_texts, seed)]
    return averaged(rows), str(run.path.relative_to(ctx.out)), blank_name


def recipe(ctx: Context) -> Report:
    models = [m for m in MODELS if m.name in ("encoder", "gpt")]
    n_texts = 12 if ctx.quick else 60
    results: dict[str, dict[int, dict]] = {}
    runs, blanks = [], {}
    for m in models:
        results[m.name] = {}
        for seed in ctx.seeds:
            res, path, blank = measure(ctx, m, seed, n_texts)
            results[m.name][seed] = res
            blanks[m.name] = blank
            runs.append((f"{m.label}, seed {seed}", path))
    claims, tables = [], []
    for m in models:
        r = results[m.name]
        for imp in IMPORTANCES:
            last = {s: {k: r[s][imp][k][-1] for k in MEASURES} for s in r}
            claims.append(
                Claim(
                    f"{m.name}.{imp}.raw_first_minus_last",
                    f"the {m.name} model's raw attention rho with {imp} importance, first layer "
                    "minus last",
                    "raw attention correlates with importance in the first layer and poorly in "
                    "later layers (Abnar & Zuidema 2020, Table 1)",
                    {s: r[s][imp]["raw"][0] - r[s][imp]["raw"][-1] for s in r},
                    ">",
                    0.0,
                    "signed",
                )
            )
            for k in ("rollout", "flow"):
                claims.append(Claim(
                    f"{m.name}.{imp}.{k}_minus_raw",
                    f"the {m.name} model's last-layer rho with {imp} importance, {k} minus "
                    "raw attention",
                    f"{k} correlates better than raw attention in the later layers (Abnar & "
                    "Zuidema 2020, Table 1)",
                    {s: last[s][k] - last[s]["raw"] for s in r}, ">", 0.0, "signed"))  # fmt: skip
            L = len(r[ctx.seeds[0]][imp]["raw"])
            rows = [[k] + [value_range([r[s][imp][k][layer] for s in r], "signed", True)
                           for layer in range(L)] for k in MEASURES]  # fmt: skip
            tables.append(Table(
                f"{m.name}: Spearman's rho with {imp} importance (mean over examples)",
                ["", *[f"L{layer + 1}" for layer in range(L)]], rows,
                "laid out as Abnar & Zuidema's Table 1: rows raw attention, rollout, flow; "
                "columns the layer they are read at; range over seeds"))  # fmt: skip
    report = Report(
        "rollout-and-flow", "Quantifying attention flow: raw attention, rollout and flow",
        CITATION,
        "Each model is trained with attnlab train, once per seed. On held-out inputs, raw "
        "attention (per layer, mean over heads), rollout and flow are read at the output "
        "position and ranked against blank-out and input-gradient importance with Spearman's "
        "rho, per example, then averaged over the examples.",
        claims=claims, tables=tables, runs=runs,
        notes=[f"blank-out replaces a token by {blanks[m.name]} in the {m.name} model"
               for m in models]
        + [f"{n_texts} held-out examples per model and seed; special tokens left out"],
        data={m: {str(s): f for s, f in r.items()} for m, r in results.items()},
    )  # fmt: skip
    report.pictures.append(("Mean Spearman's rho per layer (seed mean): raw attention, "
                            "rollout and flow against blank-out and gradient importance",
                            _figure(models, results)))  # fmt: skip
    return report


def _figure(models, results) -> str:
    from attnlab.interventions.figures import new_figure
    from attnlab.render.plots import png_html

    fig, axes = new_figure(len(models), 2, figsize=(9, 3.2 * len(models)), squeeze=False)
    for row, m in zip(axes, models):
        r = results[m.name]
        for ax, imp in zip(row, IMPORTANCES):
            for k, colour in zip(MEASURES, ("tab:grey", "tab:blue", "tab:orange")):
                per_seed = np.array([r[s][imp][k] for s in r], dtype=np.float64)  # (S, L)
                x = np.arange(1, per_seed.shape[1] + 1)
                ax.plot(x, np.nanmean(per_seed, 0), marker="o", color=colour, label=k)
                ax.fill_between(x, np.nanmin(per_seed, 0), np.nanmax(per_seed, 0), color=colour,
                                alpha=0.15)  # fmt: skip
            ax.axhline(0, color="black", lw=0.5)
            ax.set_xticks(x)
            ax.set_xlabel("layer")
            ax.set_ylabel("Spearman's rho")
            ax.set_title(f"{m.name}: against {imp}", fontsize=9)
            ax.legend(fontsize=7)
    fig.tight_layout()
    return png_html(fig)


EXPERIMENT = register(Experiment(
    "rollout-and-flow", "Quantifying attention flow",
    "raw attention, rollout and flow against blank-out and input-gradient importance",
    CITATION, recipe,
    order=20,
    about="Abnar & Zuidema 2020 (raw attention, rollout and flow against blank-out and gradients)",
))  # fmt: skip
