"""``attention-vs-importance``: Jain & Wallace (2019), "Attention is not Explanation", with
Wiegreffe & Pinter (2019)'s baselines, on their own model and on a Transformer encoder.

Their model is a BiLSTM classifier whose states one additive attention pools
(``attnlab train --task classify --arch lstm-attention``); its attention is one row over the
tokens. The Transformer's analogue is the row the [CLS] position reads with in the last layer
(mean over heads where one distribution is needed). Per held-out example, with y the model's
own prediction:
  - Kendall's tau between that attention and |input x gradient| of y's logit per token, and
    between it and leave-one-out importance |p(y | x) - p(y | x without token j)|;
  - permuted attention: the row of every head shuffled over the keys (20 random
    permutations); the median total variation distance (TVD) of the output distribution from
    the intact one;
  - adversarial attention: per head, a row found by gradient ascent on its Jensen-Shannon
    divergence (JSD, nats, at most ln 2) from the intact row while the output's TVD is held
    under 0.01 by a penalty; the mean JSD reached where the TVD held;
  - the decisive token (a generated task built so one word decides the label): how often it is
    the top token under attention, under gradients and under leave-one-out;
  - uniform attention at test time: the row made uniform, and the share of predictions kept.
Wiegreffe & Pinter's baselines, per seed:
  - uniform attention trained: the BiLSTM trained with every token weighed 1/T
    (``--score uniform``), its held-out accuracy against the learned attention's;
  - the frozen-attention diagnostic (their section 3.4): an MLP that sees each token alone,
    pooled by attention, trained with its own attention, with uniform attention, and with the
    trained BiLSTM's attention imposed and frozen (``guided``); their held-out accuracies.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from attnlab.experiments.recipe import Context, Experiment, register
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


# The training options of each task and each model (``attnlab train``'s), and how long each
# model trains (quick: half as long, narrower)
TASKS = {
    "cues": dict(task="classify", tokenizer="word"),
    "language": dict(task="classify", data="examples/language_en_es.tsv"),
}
MODELS = {
    "lstm": dict(arch="lstm-attention", d_model=64),  # the papers' BiLSTM, additive attention
    "transformer": dict(n_layer=2, n_head=4, d_model=64),
    "lstm-uniform": dict(arch="lstm-attention", d_model=64, score="uniform"),  # W&P's baseline
}
MEASURED = ("lstm", "transformer")  # the models whose attention is measured
LABELS = {"lstm": "BiLSTM with additive attention", "transformer": "Transformer encoder",
          "lstm-uniform": "BiLSTM trained with uniform attention"}  # fmt: skip
TRAINING = dict(max_iters=200, eval_interval=200, lr=3e-3)
GUIDES = ("own", "uniform", "frozen")
GAP = 0.02  # accuracies this close count as "as well" (a few held-out examples)  # the MLP's attention: trained, uniform, the LSTM's


def options(ctx: Context, task: str, model: str) -> dict:
    """``attnlab train``'s options for ``model`` on ``task``."""
    out = {**TASKS[task], **MODELS[model], **TRAINING}
    if ctx.quick:
        out["max_iters"] = out["eval_interval"] = 100
        out["d_model"] = 32
    return out


def texts_of(ctx: Context, task: str, n: int) -> tuple[str | None, list[tuple[str, int | None]]]:
    """(the data file of ``task``, its last ``n`` texts with the decisive word's place)."""
    if task == "cues":
        path = ctx.out / "data" / "cue_words.tsv"
        rows = write_cue_data(path)
        return str(path), [(t, at) for _, t, at in rows[-n:]]  # the end of the file
    from attnlab.experiments.recipe import example_file

    lines = example_file("language_en_es.tsv").read_text(encoding="utf-8").splitlines()
    return None, [(ln.split("\t", 1)[1], None) for ln in lines if "\t" in ln][-n:]


def measure(run, texts, seed: int) -> dict:
    """Every per-example measure (``example``) of one trained classifier, summarised."""
    from attnlab.interventions.subjects import Subject

    subject = Subject(run.model, run.tokenizer, run.config.get("labels"))
    rng = np.random.default_rng(seed)
    return summary([example(subject, t, at, rng) for t, at in texts])


def accuracy(model, task, imposed=None) -> float:
    """Held-out accuracy of ``model`` on ``task``'s split (``imposed``: ids, mask -> the
    attention (B, T) given to the model instead of its own)."""
    right = 0
    with torch.no_grad():
        for lo in range(0, len(task.val_idx), 64):
            ids, mask, y = task.examples(task.val_idx[lo : lo + 64])
            w = imposed(ids, mask) if imposed is not None else None
            right += int((model(ids, mask, weights=w).argmax(-1) == y).sum())
    return right / len(task.val_idx)


def guided(task, teacher, guide: str, seed: int, steps: int, lr: float, width: int,
           batch: int = 32) -> float:  # fmt: skip
    """Wiegreffe & Pinter's frozen-attention diagnostic (their section 3.4): an MLP that sees
    each token alone, h_t = tanh(W e_t), pooled by attention into a classifier, trained on
    ``task`` (its batches: ``examples``, ``train_idx``, ``val_idx``) with its attention
    ``own`` (trained with it), ``uniform``, or ``frozen``: the weights ``teacher.attention(ids,
    mask)`` gives (a trained LSTM's), imposed and never trained, in training and at test.
    Every variant takes the same steps of the same batches (Adam, ``lr``); returns its
    held-out accuracy. Where the imposed weights beat the MLP's own and the uniform ones, the
    teacher's attention marks the tokens the task needs."""
    from attnlab.models.declare import model_for
    from attnlab.models.rnn_classifier import LSTMClassifierConfig

    cfg = LSTMClassifierConfig(vocab_size=task.tokenizer.vocab_size, d_embed=width,
                               d_hidden=width, encoder="mlp",
                               attention="uniform" if guide == "uniform" else "additive",
                               num_labels=len(task.classes), pad_id=teacher.config.pad_id)  # fmt: skip
    torch.manual_seed(seed)
    model = model_for(cfg)
    imposed = teacher.attention if guide == "frozen" else None
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        pick = torch.randint(len(task.train_idx), (batch,), generator=g).tolist()
        ids, mask, y = task.examples([task.train_idx[i] for i in pick])
        w = imposed(ids, mask) if imposed is not None else None
        loss = torch.nn.functional.cross_entropy(model(ids, mask, weights=w), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return accuracy(model.eval(), task, imposed)


def baselines(ctx: Context, task: str, seed: int, lstm, uniform) -> dict:
    """Wiegreffe & Pinter's baselines on one seed: the accuracy of the BiLSTM trained with
    uniform attention against the learned one, and the frozen-attention diagnostic."""
    from attnlab.tasks.base import open_task

    data = open_task(lstm.path, with_data=True, cfg=lstm.config, tokenizer=lstm.tokenizer)
    o = options(ctx, task, "lstm")
    out = {"lstm_accuracy": lstm.config["metrics"]["val_accuracy"],
           "uniform_accuracy": uniform.config["metrics"]["val_accuracy"]}  # fmt: skip
    out["uniform_gap"] = out["lstm_accuracy"] - out["uniform_accuracy"]
    teacher = lstm.model.eval()
    for guide in GUIDES:
        out[f"mlp_{guide}"] = guided(data, teacher, guide, seed, o["max_iters"], o["lr"],
                                     o["d_model"])  # fmt: skip
    out["frozen_vs_own"] = out["mlp_frozen"] - out["mlp_own"]
    out["frozen_vs_uniform"] = out["mlp_frozen"] - out["mlp_uniform"]
    return out


def recipe(ctx: Context) -> Report:
    tasks = ["cues"] if ctx.quick else ["cues", "language"]
    n = 10 if ctx.quick else 40
    results: dict[str, dict[str, dict[int, dict]]] = {}
    runs = []
    for task in tasks:
        data, texts = texts_of(ctx, task, n)
        results[task] = {m: {} for m in (*MEASURED, "baselines")}
        for seed in ctx.seeds:
            trained = {}
            for model in MODELS:
                name = f"{task}-{model}-seed{seed}"
                given = {**options(ctx, task, model), "seed": seed}
                trained[model] = ctx.train(name, {**given, **({"data": data} if data else {})})
                runs.append((f"{LABELS[model]} ({task}), seed {seed}",
                             str(trained[model].path.relative_to(ctx.out))))  # fmt: skip
            for model in MEASURED:
                ctx.log(f"experiment: attention against importance, {model} on {task}, seed "
                        f"{seed}, {len(texts)} examples")  # fmt: skip
                results[task][model][seed] = measure(trained[model], texts, seed)
            ctx.log(f"experiment: uniform and frozen-attention baselines on {task}, seed {seed}")
            results[task]["baselines"][seed] = baselines(ctx, task, seed, trained["lstm"],
                                                          trained["lstm-uniform"])  # fmt: skip
    report = Report(
        "attention-vs-importance", "Is attention explanation? Attention against importance",
        CITATION,
        "Each classifier (a BiLSTM with additive attention, the papers' model, and a "
        "Transformer encoder) is trained with attnlab train, once per seed. On held-out "
        "examples its attention (the LSTM's one attention; the Transformer's last-layer [CLS] "
        "row) is compared with gradient and leave-one-out importance (Kendall tau), and "
        "replaced by permuted, adversarial and uniform weights to see how much the output "
        "moves. Wiegreffe & Pinter's baselines: the BiLSTM trained with uniform attention, and "
        "an MLP that sees each token alone trained with its own, uniform, or the trained "
        "LSTM's attention imposed (frozen).",
        claims=claims(tasks, results), tables=[table(tasks, results, ctx.seeds)], runs=runs,
        notes=["cues: a generated task (data/cue_words.tsv) where one word decides the label; "
               "its rows show how often each measure ranks that word first",
               "the frozen-attention diagnostic's MLPs are trained in the experiment, not as "
               "runs: the frozen one needs its LSTM to predict (the same steps, batches and "
               "learning rate for its three variants)",
               "uniform attention at test time (uniform keeps prediction) swaps a trained "
               "model's weights; Wiegreffe & Pinter train with it (uniform accuracy)"],
        data={t: {m: {str(s): v for s, v in r.items()} for m, r in res.items()}
              for t, res in results.items()},
    )  # fmt: skip
    report.pictures.append(("Kendall tau per example: attention against gradient and "
                            "leave-one-out importance, every seed", _figure(tasks, results)))  # fmt: skip
    report.pictures.append(("Held-out accuracy: Wiegreffe & Pinter's baselines, every seed",
                            _baseline_figure(tasks, results)))  # fmt: skip
    return report


def claims(tasks: list[str], results: dict) -> list[Claim]:
    out = []
    for task in tasks:
        for model in MEASURED:
            r = results[task][model]
            where = f"({model}, {task})"
            out += [
                Claim(f"{task}.{model}.tau_grad", f"the mean Kendall tau of attention with "
                      f"gradient importance {where}",
                      "attention correlates weakly with gradient importance in BiLSTM "
                      "classifiers (Jain & Wallace 2019, section 4.1)",
                      {s: r[s]["tau_grad"] for s in r}, "<", 0.5, "signed"),
                Claim(f"{task}.{model}.tau_loo", f"the mean Kendall tau of attention with "
                      f"leave-one-out importance {where}",
                      "attention correlates weakly with leave-one-out importance (Jain & "
                      "Wallace 2019, section 4.1)",
                      {s: r[s]["tau_loo"] for s in r}, "<", 0.5, "signed"),
                Claim(f"{task}.{model}.median_tvd_permuted", f"the median output TVD under "
                      f"permuted attention {where}",
                      "permuting attention often changes the output little (Jain & Wallace "
                      "2019, section 4.2)",
                      {s: r[s]["median_tvd_permuted"] for s in r}, "<", 0.1),
                Claim(f"{task}.{model}.adversarial_jsd", f"the mean JSD of adversarial "
                      f"attention from the original with the output held within TVD "
                      f"{TVD_HOLD} {where}",
                      "very different attention gives the same prediction (Jain & Wallace "
                      "2019, section 4.3; JSD at most ln 2 = 0.693)",
                      {s: r[s]["adversarial_jsd"] for s in r}, ">", 0.3),
                Claim(f"{task}.{model}.uniform", f"the share of predictions kept with uniform "
                      f"attention at test time {where}",
                      "on some tasks uniform attention does about as well, so attention is not "
                      "needed there (Wiegreffe & Pinter 2019, section 3.1)",
                      {s: r[s]["uniform_keeps_prediction"] for s in r}, ">=", 0.9, "%"),
            ]  # fmt: skip
        b = results[task]["baselines"]
        out += [
            Claim(f"{task}.uniform_trained", f"the held-out accuracy the BiLSTM loses when "
                  f"trained with uniform attention ({task})",
                  "on several of Jain & Wallace's datasets a model trained with uniform "
                  "attention scores within a few points of the learned one, so attention is "
                  "not needed there (Wiegreffe & Pinter 2019, section 3.1, Table 2)",
                  {s: b[s]["uniform_gap"] for s in b}, "<=", GAP, "signed"),
            Claim(f"{task}.frozen_vs_own", f"the accuracy of an MLP with the BiLSTM's "
                  f"attention frozen in, less the MLP's with its own trained attention ({task})",
                  "the LSTM's attention imposed on an MLP does as well as (within 2 points) or "
                  "better than the MLP's own trained attention on most datasets (Wiegreffe & "
                  "Pinter 2019, section 3.4, Table 3)",
                  {s: b[s]["frozen_vs_own"] for s in b}, ">=", -GAP, "signed"),
            Claim(f"{task}.frozen_vs_uniform", f"the accuracy of an MLP with the BiLSTM's "
                  f"attention frozen in, less the MLP's with uniform attention ({task})",
                  "the LSTM's attention imposed on an MLP does better than uniform attention "
                  "(Wiegreffe & Pinter 2019, section 3.4, Table 3)",
                  {s: b[s]["frozen_vs_uniform"] for s in b}, ">", 0.0, "signed"),
        ]  # fmt: skip
    return out


MEASURES = (("tau_grad", "signed"), ("tau_loo", "signed"), ("median_tvd_permuted", ""),
            ("adversarial_jsd", ""), ("uniform_keeps_prediction", "%"),
            ("decisive_top_attention", "%"), ("decisive_top_gradient", "%"),
            ("decisive_top_leave_one_out", "%"))  # fmt: skip
BASELINES = (("lstm_accuracy", "lstm", "accuracy, learned attention"),
             ("uniform_accuracy", "lstm", "accuracy, trained uniform"),
             ("mlp_own", "mlp", "accuracy, own attention"),
             ("mlp_uniform", "mlp", "accuracy, uniform attention"),
             ("mlp_frozen", "mlp", "accuracy, the lstm's frozen"))  # fmt: skip


def table(tasks: list[str], results: dict, seeds: list[int]) -> Table:
    rows = []
    for task in tasks:
        for model in MEASURED:
            r = results[task][model]
            for key, unit in MEASURES:
                if key in r[seeds[0]]:
                    rows.append([task, model, key.replace("_", " "),
                                 value_range([r[s][key] for s in r], unit, short=True)])  # fmt: skip
        b = results[task]["baselines"]
        for key, model, what in BASELINES:
            rows.append([task, model, what, value_range([b[s][key] for s in b], "%", True)])
    return Table("Measures per task and model (range over seeds)",
                 ["task", "model", "measure", "attnlab (min..max)"], rows)  # fmt: skip


def _figure(tasks, results) -> str:
    from attnlab.interventions.figures import new_figure
    from attnlab.render.plots import png_html

    fig, axes = new_figure(len(MEASURED), len(tasks), figsize=(4.5 * len(tasks), 6.0),
                           squeeze=False)  # fmt: skip
    for j, task in enumerate(tasks):
        for i, model in enumerate(MEASURED):
            ax, r = axes[i][j], results[task][model]
            grad = [v for s in r for v in r[s]["tau_grad_all"] if not math.isnan(v)]
            loo = [v for s in r for v in r[s]["tau_loo_all"] if not math.isnan(v)]
            ax.hist([grad, loo], bins=np.linspace(-1, 1, 21), label=["gradient", "leave-one-out"])
            ax.set_xlabel("Kendall tau with attention")
            ax.set_ylabel("examples")
            ax.set_title(f"{LABELS[model]}, {task}", fontsize=9)
            ax.legend(fontsize=7)
    fig.tight_layout()
    return png_html(fig)


def _baseline_figure(tasks, results) -> str:
    from attnlab.interventions.figures import new_figure
    from attnlab.render.plots import png_html

    fig, axes = new_figure(1, len(tasks), figsize=(4.5 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        b = results[task]["baselines"]
        for x, (key, _, _) in enumerate(BASELINES):
            values = [b[s][key] for s in b]
            ax.scatter([x] * len(values), values, s=14)
            ax.bar(x, float(np.mean(values)), alpha=0.4)
        ax.set_xticks(range(len(BASELINES)))
        ax.set_xticklabels(["LSTM", "LSTM\nuniform", "MLP\nown", "MLP\nuniform", "MLP\nfrozen"],
                           fontsize=7)  # fmt: skip
        ax.set_ylabel("held-out accuracy")
        ax.set_ylim(0, 1.05)
        ax.set_title(task, fontsize=9)
    fig.tight_layout()
    return png_html(fig)


EXPERIMENT = register(Experiment(
    "attention-vs-importance", "Is attention explanation?",
    "attention against gradient and leave-one-out importance in a BiLSTM and a Transformer; "
    "permuted, adversarial, uniform and frozen attention", CITATION, recipe,
    order=30,
    about=("Jain & Wallace 2019 and Wiegreffe & Pinter 2019 (attention against gradient and leave-"
           "one-out importance; permuted, adversarial, uniform attention)"),
))  # fmt: skip
