"""The logit lens and the tuned lens: what would the model say if it stopped at layer l?

Logit lens (nostalgebraist, 2020): read an intermediate residual stream h_l with the model's
own head, logits_l = head(LN_f(h_l)). At the last block's output it IS the model's logits.
For every residual point (after the embeddings, after each attention, after each MLP) and
every position we show the top token and KL(p_final || p_l), how far that layer's guess is
from the final distribution.

Tuned lens (Belrose et al., 2023): first map h_l by an affine probe A_l h_l + b_l fitted to
predict the final residual h_L, then read it the same way. The probes are fitted in closed
form (ridge regression over a corpus's tokens, no training loop):

    [A_l b_l] = argmin  sum_n ||A_l h_l,n + b_l - h_L,n||^2 + lambda ||A_l||^2

and saved in the run directory as tuned_lens.safetensors + tuned_lens.json.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from attnlab.interventions.edits import edited
from attnlab.interventions.figures import heat, new_figure, save_png
from attnlab.interventions.subjects import InterventionError, Point, Subject
from attnlab.render.display import Result, heatmap_html, matrix_table, show_token


@dataclass
class LensResult(Result):
    text: str
    tuned: bool
    points: list[str]  # row labels: embed, 0.attn, 0.mlp, ...
    tokens: list[str]  # output positions
    top: list[list[str]]  # (points, T) top token
    top_prob: np.ndarray  # (points, T)
    kl: np.ndarray  # (points, T) KL(final || lens) in nats
    last_vs_model: float  # max |lens at the last point - the model's logits|
    notes: list[str] = field(default_factory=list)

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        from attnlab.render.tables import FitTable

        kind = "tuned lens" if self.tuned else "logit lens"
        t = FitTable(title=f"{kind}: top token per layer (row) and position (column)")
        t.add_column("", style="bold")
        for tok in self.tokens:
            t.add_column(show_token(tok), justify="center")
        for label, row in zip(self.points, self.top):
            t.add_row(label, *[show_token(x) for x in row])
        kl = matrix_table(self.kl, self.points, self.tokens, f"KL(final || {kind}) in nats")
        parts = [t, Text(""), kl, Text(f"\nlast layer vs the model's logits: max |difference| "
                                       f"{self.last_vs_model:.2e}", style="dim")]  # fmt: skip
        parts += [Text(f"note: {n}", style="dim") for n in self.notes]
        return Group(*parts)

    def to_dict(self) -> dict:
        return {"text": self.text, "lens": "tuned" if self.tuned else "logit",
                "points": self.points, "tokens": self.tokens, "top": self.top,
                "top_prob": np.round(self.top_prob, 5).tolist(),
                "kl": np.round(self.kl, 5).tolist(), "last_vs_model": self.last_vs_model,
                "notes": self.notes}  # fmt: skip

    def figure(self):
        T = len(self.tokens)
        fig, ax = new_figure(figsize=(min(12.0, max(5.0, 0.45 * T + 2.5)),
                                      0.4 * len(self.points) + 1.8))  # fmt: skip
        heat(ax, self.kl, self.points, [show_token(t) for t in self.tokens],
             f"{'tuned' if self.tuned else 'logit'} lens: KL(final || layer), top token printed",
             diverging=False, annotate=False, xlabel="position (its token)",
             ylabel="residual stream point", colorbar_label="KL(final || lens), nats")  # fmt: skip
        top = float(np.nanmax(self.kl)) or 1.0
        for i, row in enumerate(self.top):  # the top token in each cell
            for j, tok in enumerate(row[:64]):
                ax.text(j, i, show_token(tok)[:4], ha="center", va="center", fontsize=6,
                        color="black" if self.kl[i, j] > 0.6 * top else "white")  # fmt: skip
        return fig

    def save_png(self, path):
        return save_png(self.figure(), path)

    def _repr_html_(self) -> str:
        from attnlab.interventions.figures import figure_html

        return figure_html(self.figure()) + heatmap_html(self.kl, self.points, self.tokens,
                                                         "KL(final || lens), nats")  # fmt: skip


@dataclass
class TunedLens:
    """One affine probe per residual point: h -> h @ weight.T + bias (the final point: none)."""

    weight: dict[str, torch.Tensor]  # hook name -> (C, C)
    bias: dict[str, torch.Tensor]  # hook name -> (C,)
    meta: dict

    def apply(self, name: str, h: torch.Tensor) -> torch.Tensor:
        if name not in self.weight:
            return h
        w, b = self.weight[name].to(h), self.bias[name].to(h)
        return h @ w.T + b

    def save(self, run_dir: str | Path) -> tuple[Path, Path]:
        """Write the probes and their description into ``run_dir`` (each file atomically),
        holding its writer lock: refused while a train writes the run (its weights change)."""
        from attnlab.rundir import write_tuned_lens

        tensors = {f"{n}.weight": w for n, w in self.weight.items()}
        tensors |= {f"{n}.bias": b for n, b in self.bias.items()}
        return write_tuned_lens(run_dir, tensors, self.meta)

    @classmethod
    def load(cls, run_dir: str | Path, subject: Subject) -> TunedLens:
        """The probes saved in ``run_dir``, checked against this model before use."""
        from attnlab import rundir

        run_dir = Path(run_dir)
        meta = rundir.read_tuned_lens_meta(run_dir)
        if meta is None:
            raise InterventionError(f"{run_dir}: no tuned lens; fit one with `attnlab lens "
                                    f"{run_dir} --train-tuned --data FILE`")  # fmt: skip
        if meta.get("model_sha256") != rundir.model_digest(run_dir):
            raise InterventionError(f"{run_dir}: the tuned lens was fitted on other weights; fit "
                                    "it again with --train-tuned")  # fmt: skip
        tensors = rundir.read_tuned_lens_probes(run_dir)
        C = _width(subject)
        weight, bias = {}, {}
        for name in meta.get("points", []):
            w, b = tensors.get(f"{name}.weight"), tensors.get(f"{name}.bias")
            if w is None or b is None or tuple(w.shape) != (C, C) or tuple(b.shape) != (C,):
                raise InterventionError(f"{run_dir / rundir.LENS_FILE}: probe {name!r} is missing or "
                                        f"not ({C}, {C})")  # fmt: skip
            weight[name], bias[name] = w, b
        return cls(weight, bias, meta)


def _width(subject: Subject) -> int:
    return subject.model.config.d_model


def _check_kind(subject: Subject) -> None:
    if not subject.model.residual:
        raise InterventionError("the lens reads a residual stream; an LSTM has none (its state "
                                "is rewritten at every step, not added to)")  # fmt: skip


def lens_points(subject: Subject) -> list[Point]:
    return subject.points(subject.output_stack, sublayers=True)


@torch.no_grad()
def logit_lens(subject: Subject, text: str, tuned: TunedLens | None = None) -> LensResult:
    """Top token and KL(final || layer) at every residual point x position (module doc)."""
    _check_kind(subject)
    p = subject.prepare(text)
    pts = lens_points(subject)
    with edited(subject.model, {}, [pt.name for pt in pts]) as (cache, _):
        final = subject.logits(p)  # (1, T, V)
    logp_final = torch.log_softmax(final[0].double(), -1)  # (T, V)
    tops, probs, kls, last = [], [], [], 0.0
    for i, pt in enumerate(pts):
        h = cache[pt.name]
        if tuned is not None:
            h = tuned.apply(pt.name, h)
        logits = subject.readout(h, pt.stack)[0]  # (T, V)
        if i == len(pts) - 1:
            last = float((logits - final[0]).abs().max())
        logp = torch.log_softmax(logits.double(), -1)
        kls.append((logp_final.exp() * (logp_final - logp)).sum(-1).clamp(min=0).numpy())
        pr, ix = logp.exp().max(-1)
        probs.append(pr.numpy())
        tops.append([subject.decode(int(j)) for j in ix])
    labels = [pt.label for pt in pts]
    return LensResult(text, tuned is not None, labels, p.tokens, tops, np.array(probs),
                      np.array(kls), last, list(subject.notes))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Fitting the tuned lens
# ---------------------------------------------------------------------------------------------


def training_batches(subject: Subject, data: str, max_tokens: int, encoding: str = "utf-8"):
    """Batches of token ids (B, T) from ``data``: a GPT reads non-overlapping windows of its
    block size; an encoder reads one line per sequence (framed by its special tokens)."""
    from attnlab import data as corpora

    model = subject.model
    if model.reads != "text" or list(model.stacks) != [""]:
        raise InterventionError(f"the tuned lens is fitted on text: GPT and encoder runs, not "
                                f"{subject.kind}")  # fmt: skip
    corpus = corpora.open_corpus(data, encoding)
    tok, dev = subject.tokenizer, subject.device
    block = subject.model.config.block_size
    if model.causal:  # a causal model reads windows; an encoder one line at a time
        ids: list[int] = []
        for chunk in corpus.chunks():
            ids.extend(tok.encode(chunk, add_special_tokens=False))
            if len(ids) >= max_tokens + block:
                break
        step = block if tok.bos_id is None else block - 1  # <bos> first: one text token less
        n = min(len(ids), max_tokens) // step
        if n < 2:
            raise InterventionError(f"{data}: too short; the tuned lens needs at least two "
                                    f"windows of {step} tokens")  # fmt: skip
        x = torch.tensor(ids[: n * step]).view(n, step)
        if tok.bos_id is not None:
            x = torch.cat([torch.full((n, 1), tok.bos_id, dtype=x.dtype), x], dim=1)
        return [x[i : i + 16].to(dev) for i in range(0, n, 16)]
    batches, total = [], 0
    for chunk in corpus.chunks():
        for line in chunk.splitlines():
            if not line.strip():
                continue
            ids = tok.encode(line)[:block]
            batches.append(torch.tensor([ids], device=dev))
            total += len(ids)
            if total >= max_tokens:
                return batches
    if len(batches) < 2:
        raise InterventionError(f"{data}: the tuned lens needs at least two lines of text")
    return batches


@torch.no_grad()
def fit_tuned_lens(
    subject: Subject,
    data: str,
    max_tokens: int = 32768,
    ridge: float = 1e-3,
    heldout: float = 0.1,
    encoding: str = "utf-8",
    quiet: bool = False,
) -> TunedLens:
    """Fit one affine probe per residual point to the final residual, by ridge regression in
    float64 over ``max_tokens`` tokens of ``data``; the last ``heldout`` share of the tokens is
    kept out to report the mean KL of the logit lens and the tuned lens on it."""
    _check_kind(subject)
    pts = lens_points(subject)
    names = [pt.name for pt in pts]
    acts: dict[str, list] = {n: [] for n in names}
    batches = training_batches(subject, data, max_tokens, encoding)
    for k, x in enumerate(batches):
        with edited(subject.model, {}, names) as (cache, _):
            subject.forward(x)
        for n in names:
            acts[n].append(cache[n].reshape(-1, cache[n].size(-1)).double().cpu())
        if not quiet and (k % 10 == 0 or k == len(batches) - 1):
            print(f"tuned lens: recorded {k + 1}/{len(batches)} batches", file=sys.stderr)
    X = {n: torch.cat(v) for n, v in acts.items()}
    N = X[names[0]].size(0)
    n_fit = max(1, int(N * (1 - heldout)))
    Y = X[names[-1]]
    weight, bias, report = {}, {}, {}
    for n in names[:-1]:
        x = torch.cat([X[n][:n_fit], torch.ones(n_fit, 1, dtype=torch.float64)], 1)  # (N, C+1)
        gram = x.T @ x
        reg = ridge * float(gram.diagonal()[:-1].mean()) * torch.eye(x.size(1), dtype=gram.dtype)
        reg[-1, -1] = 0.0  # the bias is not shrunk
        sol = torch.linalg.solve(gram + reg, x.T @ Y[:n_fit])  # (C+1, C)
        weight[n], bias[n] = sol[:-1].T.contiguous(), sol[-1].contiguous()
    if N - n_fit > 0:
        lens = TunedLens(weight, bias, {})
        y = Y[n_fit:][:2048]
        stack = pts[0].stack
        ref = torch.log_softmax(subject.readout(y[None].to(_dtype(subject)), stack)[0].double(), -1)
        for pt in pts[:-1]:
            h = X[pt.name][n_fit:][:2048][None].to(_dtype(subject))
            kl = {}
            for which, hh in (("logit", h), ("tuned", lens.apply(pt.name, h))):
                lp = torch.log_softmax(subject.readout(hh, stack)[0].double(), -1)
                kl[which] = float((ref.exp() * (ref - lp)).sum(-1).mean())
            report[pt.label] = kl
    meta = {"format": 1, "points": names[:-1], "labels": [pt.label for pt in pts[:-1]],
            "ridge": ridge, "data": str(data), "tokens": N, "fit_tokens": n_fit,
            "heldout_kl": report, "model_type": subject.kind}  # fmt: skip
    return TunedLens(weight, bias, meta)


def _dtype(subject: Subject):
    return next(subject.model.parameters()).dtype


def describe_fit(lens: TunedLens) -> str:
    """The held-out comparison as lines of text."""
    rows = [f"{'point':>10}  {'KL logit lens':>14}  {'KL tuned lens':>14}"]
    for label, kl in lens.meta.get("heldout_kl", {}).items():
        rows.append(f"{label:>10}  {kl['logit']:14.4f}  {kl['tuned']:14.4f}")
    return "\n".join(rows)
