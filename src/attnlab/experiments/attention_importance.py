"""``attention-vs-importance``: Jain & Wallace (2019), "Attention is not Explanation", with
Wiegreffe & Pinter (2019)'s uniform-attention baseline, on a Transformer encoder classifier.

Their setting is a BiLSTM classifier with one additive attention layer; its Transformer analogue
here is the attention the [CLS] position reads with in the last layer (mean over heads where one
distribution is needed). Per held-out example, with y the model's own prediction:
  - Kendall's tau between that attention and |input x gradient| of y's logit per token, and
    between it and leave-one-out importance |p(y | x) - p(y | x without token j)|;
  - permuted attention: the [CLS] row of every last-layer head shuffled over the keys (20
    random permutations); the median total variation distance (TVD) of the output
    distribution from the intact one;
  - adversarial attention: per head, a [CLS] row found by gradient ascent on its Jensen-Shannon
    divergence (JSD, nats, at most ln 2) from the intact row while the output's TVD is held
    under 0.01 by a penalty; the mean JSD reached where the TVD held;
  - the decisive token (a generated task built so one word decides the label): how often it is
    the top token under attention, under gradients and under leave-one-out;
  - Wiegreffe & Pinter's uniform baseline, at test time: the [CLS] row made uniform over the
    keys in every last-layer head, and the held-out accuracy it keeps (they train with it).
The LSTM with additive attention (the papers' own model) and the frozen-attention diagnostic
need a model kind and a training variant attnlab does not have yet; the report says so.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from attnlab.experiments.recipe import Context, Experiment
from attnlab.experiments.report import Claim, Report, Table, value_range
from attnlab.experiments.stats import kendall, mean_defined

CITATION = ("Jain & Wallace (2019), Attention is not Explanation, NAACL 2019; Wiegreffe & "
            "Pinter (2019), Attention is not not Explanation, EMNLP 2019")  # fmt: skip
SPECIAL = {"[CLS]", "[SEP]", "[PAD]", "[MASK]"}
PERMUTATIONS = 20
TVD_HOLD = 0.01  # the adversary must keep the output this close

SENTENCE = ("the film was a story of some time and it had this plot with music in every scene "
            "my friend said that our evening felt long but we stayed until late to see how the "
            "cast would end its run")  # fmt: skip
FILLER = tuple(SENTENCE.split())
CUES = {"pos": ("great", "wonderful", "superb", "delightful", "brilliant", "charming"),
        "neg": ("awful", "dreadful", "boring", "terrible", "dull", "clumsy")}  # fmt: skip


def cue_examples(n: int, seed: int = 0) -> list[tuple[str, str, int]]:
    """(label, text, position of the decisive word) for ``n`` generated sentences: 6 to 12
    filler words and one cue word, whose list (pos or neg) is the label, at a random place."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        label = ("pos", "neg")[i % 2]
        words = list(rng.choice(FILLER, size=int(rng.integers(6, 13))))
        at = int(rng.integers(0, len(words) + 1))
        words.insert(at, str(rng.choice(CUES[label])))
        out.append((label, " ".join(words), at))
    return out


def write_cue_data(path) -> list[tuple[str, str, int]]:
    """The generated task as a label<TAB>text file (the same every time)."""
    from attnlab.files import atomic_write_text

    rows = cue_examples(800)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(f"{lab}\t{text}\n" for lab, text, _ in rows))
    return rows


def tvd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Total variation distance of distributions on the last dim: 0.5 sum |p - q|."""
    return 0.5 * (p - q).abs().sum(-1)


def jsd(p: torch.Tensor, q: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Jensen-Shannon divergence (nats, at most ln 2) on the last dim."""
    m = 0.5 * (p + q)

    def kl(a, b):
        return (a * (torch.log(a + eps) - torch.log(b + eps))).sum(-1)

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


class Readout:
    """A classifier's output distribution at the [CLS] position, with its last attention
    layer's [CLS] row optionally replaced (per head: (H, S))."""

    def __init__(self, subject, p):
        self.subject, self.p = subject, p
        self.position = p.position
        self.site = subject.head_groups()[-1].path + ".weights"

    def probs(self, row: torch.Tensor | None = None) -> torch.Tensor:
        from attnlab.interventions.edits import edited

        if row is None:
            return torch.softmax(self.subject.logits(self.p)[0, self.position].double(), -1)
        pos = self.position

        def put(x, name):
            x = x.clone()
            x[0, :, pos, :] = row.to(x.dtype)
            return x

        with edited(self.subject.model, {self.site: put}):
            logits = self.subject.logits(self.p)
        return torch.softmax(logits[0, pos].double(), -1)

    def row(self) -> torch.Tensor:
        """The intact [CLS] row of every last-layer head (H, S)."""
        from attnlab.interventions.edits import edited

        with torch.no_grad(), edited(self.subject.model, {}, [self.site]) as (cache, _):
            self.subject.logits(self.p)
        return cache[self.site][0, :, self.position].double()


def leave_one_out(subject, p, y: int, keep: np.ndarray) -> np.ndarray:
    """|p(y | x) - p(y | x without token j)| for every token j in ``keep`` (0 elsewhere)."""
    x = p.args[0]  # (1, T)
    T = x.size(1)
    with torch.no_grad():
        base = torch.softmax(subject.forward(x)[0, p.position].double(), -1)[y]
        idx = [j for j in range(T) if keep[j]]
        rows = torch.stack([torch.cat([x[0, :j], x[0, j + 1 :]]) for j in idx])  # (n, T - 1)
        got = torch.softmax(subject.forward(rows)[:, p.position].double(), -1)[:, y]
    out = np.zeros(T)
    out[idx] = (base - got).abs().numpy()
    return out


def adversary(readout: Readout, base: torch.Tensor, intact: torch.Tensor, steps: int = 40):
    """A [CLS] row per head as far (JSD) from ``intact`` (H, S) as gradient ascent finds while
    the output stays within TVD_HOLD of ``base``: (mean JSD over heads, output TVD)."""
    logits = torch.log(intact + 1e-6).clone().requires_grad_()
    opt = torch.optim.Adam([logits], lr=0.2)
    best = (0.0, 0.0)
    for _ in range(steps):
        with torch.enable_grad():
            row = torch.softmax(logits, -1)
            q = readout.probs(row)
            d = tvd(q, base)
            j = jsd(row, intact).mean()
            loss = -j + 100.0 * torch.relu(d - TVD_HOLD * 0.5)
            (logits.grad,) = torch.autograd.grad(loss, [logits])  # the weights get none
        opt.step()
        d, j = float(d.detach()), float(j.detach())
        if d <= TVD_HOLD and j > best[0]:
            best = (j, d)
    return best


def example(subject, text: str, decisive: int | None, rng) -> dict:
    """Every measure for one input text (module doc)."""
    from attnlab.interventions import input_attribution

    p = subject.prepare(text)
    r = Readout(subject, p)
    intact = r.row()  # (H, S)
    with torch.no_grad():
        base = r.probs()
    y = int(base.argmax())
    keep = np.array([t not in SPECIAL for t in p.input_tokens])
    attention = intact.mean(0).numpy()
    grad = np.abs(input_attribution(subject, text, subject.decode(y), method="grad").values)
    loo = leave_one_out(subject, p, y, keep)
    S = intact.size(-1)
    with torch.no_grad():
        perm = [float(tvd(r.probs(intact[:, torch.from_numpy(rng.permutation(S))]), base))
                for _ in range(PERMUTATIONS)]  # fmt: skip
        uniform = r.probs(torch.full_like(intact, 1.0 / S))
    adv_jsd, _ = adversary(r, base, intact)
    out = {
        "tau_grad": kendall(attention[keep], grad[keep]),
        "tau_loo": kendall(attention[keep], loo[keep]),
        "median_tvd_permuted": float(np.median(perm)),
        "max_attention": float(attention[keep].max()),
        "adversarial_jsd": adv_jsd,
        "uniform_same": int(uniform.argmax()) == y,
        "prediction": y,
    }
    if decisive is not None:
        j = [i for i, k in enumerate(keep) if k][decisive]  # the decisive word's token index
        for name, v in (("attention", attention), ("gradient", grad), ("leave_one_out", loo)):
            top = int(np.argmax(np.where(keep, v, -np.inf)))
            out[f"decisive_top_{name}"] = top == j
    return out


def summary(rows: list[dict]) -> dict:
    """Per-example measures averaged (taus: mean of the defined ones; shares: mean)."""
    out = {k: mean_defined([r[k] for r in rows])[0] for k in ("tau_grad", "tau_loo")}
    out["median_tvd_permuted"] = float(np.median([r["median_tvd_permuted"] for r in rows]))
    held = [r["adversarial_jsd"] for r in rows]
    out["adversarial_jsd"] = float(np.mean(held))
    out["uniform_keeps_prediction"] = float(np.mean([r["uniform_same"] for r in rows]))
    for k in ("decisive_top_attention", "decisive_top_gradient", "decisive_top_leave_one_out"):
        if k in rows[0]:
            out[k] = float(np.mean([r[k] for r in rows]))
    out["tau_grad_all"] = [r["tau_grad"] for r in rows]
    out["tau_loo_all"] = [r["tau_loo"] for r in rows]
    return out


TASKS = {
    "cues": dict(task="classify", tokenizer="word", n_layer=2, n_head=4, d_model=64,
                 max_iters=200, eval_interval=200, lr=3e-3),
    "language": dict(task="classify", data="examples/language_en_es.tsv", n_layer=2, n_head=4,
                     d_model=64, max_iters=200, eval_interval=200, lr=3e-3),
}  # fmt: skip


def measure(ctx: Context, task: str, seed: int, n: int) -> tuple[dict, str]:
    from attnlab.interventions.subjects import Subject

    options = dict(TASKS[task])
    if task == "cues":
        path = ctx.out / "data" / "cue_words.tsv"
        rows = write_cue_data(path)
        options["data"] = str(path)
        texts = [(t, at) for _, t, at in rows[-n:]]  # the end of the file
    else:
        from attnlab.experiments.recipe import example_file

        lines = example_file("language_en_es.tsv").read_text(encoding="utf-8").splitlines()
        texts = [(ln.split("\t", 1)[1], None) for ln in lines if "\t" in ln][-n:]
    if ctx.quick:
        options["max_iters"] = options["eval_interval"] = 100
        options["d_model"] = 32
    name = f"{task}-seed{seed}"
    run = ctx.train(name, {**options, "seed": seed})
    subject = Subject(run.model, run.tokenizer, run.config.get("labels"))
    ctx.log(f"experiment: attention against importance on {name}, {len(texts)} examples")
    rng = np.random.default_rng(seed)
    found = [example(subject, t, at, rng) for t, at in texts]
    return summary(found), str(run.path.relative_to(ctx.out))


def recipe(ctx: Context) -> Report:
    tasks = ["cues"] if ctx.quick else ["cues", "language"]
    n = 10 if ctx.quick else 40
    results: dict[str, dict[int, dict]] = {}
    runs = []
    for task in tasks:
        results[task] = {}
        for seed in ctx.seeds:
            res, path = measure(ctx, task, seed, n)
            results[task][seed] = res
            runs.append((f"Transformer encoder classifier ({task}), seed {seed}", path))
    claims = []
    for task in tasks:
        r = results[task]
        claims += [
            Claim(f"{task}.tau_grad", f"the mean Kendall tau of attention with gradient "
                  f"importance ({task})",
                  "attention correlates weakly with gradient importance in BiLSTM classifiers "
                  "(Jain & Wallace 2019, section 4.1)",
                  {s: r[s]["tau_grad"] for s in r}, "<", 0.5, "signed"),
            Claim(f"{task}.tau_loo", f"the mean Kendall tau of attention with leave-one-out "
                  f"importance ({task})",
                  "attention correlates weakly with leave-one-out importance (Jain & Wallace "
                  "2019, section 4.1)",
                  {s: r[s]["tau_loo"] for s in r}, "<", 0.5, "signed"),
            Claim(f"{task}.median_tvd_permuted", f"the median output TVD under permuted "
                  f"attention ({task})",
                  "permuting attention often changes the output little (Jain & Wallace 2019, "
                  "section 4.2)",
                  {s: r[s]["median_tvd_permuted"] for s in r}, "<", 0.1),
            Claim(f"{task}.adversarial_jsd", f"the mean JSD of adversarial attention from the "
                  f"original with the output held within TVD {TVD_HOLD} ({task})",
                  "very different attention gives the same prediction (Jain & Wallace 2019, "
                  "section 4.3; JSD at most ln 2 = 0.693)",
                  {s: r[s]["adversarial_jsd"] for s in r}, ">", 0.3),
            Claim(f"{task}.uniform", f"the share of predictions kept with uniform attention "
                  f"({task})",
                  "on some tasks uniform attention does about as well, so attention is not "
                  "needed there (Wiegreffe & Pinter 2019, section 3; trained with it)",
                  {s: r[s]["uniform_keeps_prediction"] for s in r}, ">=", 0.9, "%"),
        ]  # fmt: skip
    rows = []
    for task in tasks:
        r = results[task]
        for key, unit in (("tau_grad", "signed"), ("tau_loo", "signed"),
                          ("median_tvd_permuted", ""), ("adversarial_jsd", ""),
                          ("uniform_keeps_prediction", "%"), ("decisive_top_attention", "%"),
                          ("decisive_top_gradient", "%"), ("decisive_top_leave_one_out", "%")):  # fmt: skip
            if key in r[ctx.seeds[0]]:
                rows.append([task, key.replace("_", " "), value_range([r[s][key] for s in r],
                                                                      unit)])  # fmt: skip
    report = Report(
        "attention-vs-importance", "Is attention explanation? Attention against importance",
        CITATION,
        "Each Transformer encoder classifier is trained with attnlab train, once per seed. On "
        "held-out examples, the last layer's [CLS] attention is compared with gradient and "
        "leave-one-out importance (Kendall tau), and replaced by permuted, adversarial and "
        "uniform rows to see how much the output moves.",
        claims=claims,
        tables=[Table("Measures per task (range over seeds)", ["task", "measure", "attnlab"],
                      rows)],
        runs=runs,
        notes=["the papers' BiLSTM with additive attention, and Wiegreffe & Pinter's "
               "frozen-attention and trained-uniform baselines, are not here yet: they need a "
               "model kind and a training variant attnlab lacks; the uniform baseline is "
               "applied at test time",
               "cues: a generated task (data/cue_words.tsv) where one word decides the label; "
               "its rows show how often each measure ranks that word first"],
        data={t: {str(s): v for s, v in r.items()} for t, r in results.items()},
    )  # fmt: skip
    report.pictures.append(("Kendall tau per example: attention against gradient and "
                            "leave-one-out importance, every seed", _figure(tasks, results)))  # fmt: skip
    return report


def _figure(tasks, results) -> str:
    from attnlab.interventions.figures import new_figure
    from attnlab.render.plots import png_html

    fig, axes = new_figure(1, len(tasks), figsize=(4.5 * len(tasks), 3.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        r = results[task]
        grad = [v for s in r for v in r[s]["tau_grad_all"] if not math.isnan(v)]
        loo = [v for s in r for v in r[s]["tau_loo_all"] if not math.isnan(v)]
        ax.hist([grad, loo], bins=np.linspace(-1, 1, 21), label=["gradient", "leave-one-out"])
        ax.set_xlabel("Kendall tau with attention")
        ax.set_ylabel("examples")
        ax.set_title(task, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return png_html(fig)


EXPERIMENT = Experiment(
    "attention-vs-importance", "Is attention explanation?",
    "attention against gradient and leave-one-out importance; permuted, adversarial and "
    "uniform attention", CITATION, recipe,
)  # fmt: skip
