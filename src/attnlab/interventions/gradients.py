"""Gradient attributions on the input embeddings: input x gradient and integrated gradients.

For a metric f (the target's logit, or target - foil, at one output position) and the input
embeddings x (T, C) with a baseline b (zero vectors: "no token"; an encoder-decoder keeps its
positions and zeroes the token part; a ViT's baseline is a black image):

    input x gradient      a_t = sum_c (x - b)_tc * df/dx_tc (x)
    integrated gradients  a_t = sum_c (x - b)_tc * int_0^1 df/dx_tc (b + alpha (x - b)) dalpha

Integrated gradients (Sundararajan et al., 2017) is complete: sum_t a_t = f(x) - f(b) exactly
for the integral. The integral is computed with ``steps`` Gauss-Legendre nodes (or midpoints,
``rule="riemann"``); the completeness error |sum_t a_t - (f(x) - f(b))| / |f(x) - f(b)| is
how far the quadrature is from that, and every result prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from attnlab.interventions.edits import edited
from attnlab.interventions.figures import figure_html, new_figure, save_png, token_ticks
from attnlab.interventions.patching import metric_fn
from attnlab.interventions.subjects import InterventionError, Prepared, Subject
from attnlab.render.display import Result, show_token
from attnlab.render.plots import overlay

CHUNK = 16  # path points per forward pass


@dataclass
class GradResult(Result):
    method: str  # grad | ig
    text: str
    metric: str
    position: int
    tokens: list[str]  # input tokens (or patches)
    values: np.ndarray  # (T,)
    f_input: float
    f_baseline: float
    steps: int = 0
    rule: str = ""
    image: np.ndarray | None = None
    grid: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def completeness_error(self) -> float | None:
        """|sum a - (f(x) - f(b))| / |f(x) - f(b)| (integrated gradients only)."""
        if self.method != "ig":
            return None
        span = self.f_input - self.f_baseline
        return abs(float(self.values.sum()) - span) / max(abs(span), 1e-12)

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        from attnlab.render.tables import FitTable

        name = "integrated gradients" if self.method == "ig" else "input x gradient"
        parts = [Text(f"{name} of {self.metric} at output position {self.position}", style="bold")]
        if self.method == "ig":
            e = self.completeness_error
            verdict = "within 1%" if e < 0.01 else f"misses by {e:.2%}: use more --steps"
            parts.append(Text(f"{self.steps} steps ({self.rule}); f(x) - f(baseline) = "
                              f"{self.f_input - self.f_baseline:.5f}, sum of attributions "
                              f"{self.values.sum():.5f}: completeness error {e:.3%} ({verdict})"))  # fmt: skip
        t = FitTable()
        for c in ("pos", "token", "attribution", ""):
            t.add_column(c, justify="left" if c in ("token", "") else "right")
        top = float(np.abs(self.values).max()) or 1.0
        for i, (tok, v) in enumerate(zip(self.tokens, self.values)):
            t.add_row(str(i), show_token(tok), f"{v:+.4f}",
                      ("+" if v > 0 else "-") * max(0, round(12 * abs(v) / top)))  # fmt: skip
        parts.append(t)
        parts += [Text(f"note: {n}", style="dim") for n in self.notes]
        return Group(*parts)

    def to_dict(self) -> dict:
        d = {"method": self.method, "text": self.text, "metric": self.metric,
             "position": self.position, "tokens": self.tokens,
             "attributions": np.round(self.values, 6).tolist(), "f_input": self.f_input,
             "f_baseline": self.f_baseline, "sum": float(self.values.sum()), "notes": self.notes}  # fmt: skip
        if self.method == "ig":
            d |= {"steps": self.steps, "rule": self.rule,
                  "completeness_error": self.completeness_error}  # fmt: skip
        return d

    def figure(self):
        if self.image is not None:
            img = self.image if self.image.ndim == 2 else np.moveaxis(self.image, 0, -1)
            fig, ax = new_figure(figsize=(4, 3.8))
            top = float(np.abs(self.values).max()) or 1.0
            g = self.grid
            overlay(ax, img, self.values.reshape(g, g), cmap="RdBu_r", vmin=-top, vmax=top,
                    colorbar_label="attribution to the patch (red raises the logit)")  # fmt: skip
        else:
            fig, ax = new_figure(figsize=(min(12.0, max(5.0, 0.25 * len(self.tokens) + 2)), 3.0))
            ax.bar(range(len(self.values)), self.values,
                   color=["#d62728" if v > 0 else "#1f77b4" for v in self.values])  # fmt: skip
            token_ticks(ax, self.tokens, "input (its token)")
            ax.set_ylabel("attribution (red raises it)", fontsize=8)
            ax.axhline(0, color="black", lw=0.5)
        title = f"{'integrated gradients' if self.method == 'ig' else 'input x gradient'}: {self.metric}"
        if self.method == "ig":
            title += f" (completeness error {self.completeness_error:.2%})"
        ax.set_title(title, fontsize=9)
        return fig

    def save_png(self, path):
        return save_png(self.figure(), path)

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(str(self))}</pre>" + figure_html(self.figure())


def baseline_for(subject: Subject, x: torch.Tensor) -> torch.Tensor:
    """The "no input" point the model declares: zero token vectors (an encoder-decoder keeps
    its positions, which its ``encoder.embed`` includes), or a black image for a ViT."""
    return subject.model.gradient_baseline(x)


def _nodes(steps: int, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Quadrature nodes alpha and weights on [0, 1]."""
    if rule == "gauss-legendre":
        a, w = np.polynomial.legendre.leggauss(steps)
        return torch.tensor((a + 1) / 2), torch.tensor(w / 2)
    if rule == "riemann":
        return torch.tensor((np.arange(steps) + 0.5) / steps), torch.full((steps,), 1.0 / steps)
    raise InterventionError(f"unknown integration rule {rule!r}: gauss-legendre or riemann")


def _replace(site: str, value: torch.Tensor):
    return {site: lambda x, name: value.to(x.dtype)}


def input_attribution(
    subject: Subject,
    text: str,
    target: str,
    foil: str | None = None,
    method: str = "ig",
    steps: int = 64,
    position: int | None = None,
    rule: str = "gauss-legendre",
) -> GradResult:
    """Input x gradient (``method="grad"``) or integrated gradients (``"ig"``) of the target's
    logit (minus the foil's) at ``position``, per input token (module doc)."""
    if method not in ("grad", "ig"):
        raise InterventionError(f"unknown gradient method {method!r}: grad or ig")
    if steps < 1:
        raise InterventionError(f"--steps must be at least 1, got {steps}")
    t = subject.token_id(target)
    f = subject.token_id(foil) if foil is not None else None
    p = subject.prepare(text)
    pos = subject.metric_position(p, position, t)
    m = metric_fn(t, f, pos)
    site = subject.model.gradient_site
    with torch.no_grad(), edited(subject.model, {}, [site]) as (cache, _):
        f_x = float(m(subject.logits_at(p, pos))[0])
    x = cache[site].double()  # (1, T, C)
    b = baseline_for(subject, x).double()
    with torch.no_grad(), edited(subject.model, _replace(site, b)):
        f_b = float(m(subject.logits_at(p, pos))[0])
    if method == "grad":
        G = _gradient(subject, p, m, pos, site, x)
        values, n_steps = ((x - b) * G)[0].sum(-1), 0
    else:
        alphas, weights = _nodes(steps, rule)
        G = torch.zeros_like(x)
        for s in range(0, steps, CHUNK):
            a = alphas[s : s + CHUNK].to(x)[:, None, None]  # (k, 1, 1)
            path = b + a * (x - b)  # (k, T, C) points on the straight line from b to x
            w = weights[s : s + CHUNK].to(x)
            G += _gradient(subject, p, m, pos, site, path, w).sum(0, keepdim=True)
        values, n_steps = ((x - b) * G)[0].sum(-1), steps
    notes = list(subject.notes)
    if subject.model.gradient_note:
        notes.append(subject.model.gradient_note)
    image, grid = None, 0
    if "image" in p.extra:
        image, grid = p.extra["image"].numpy(), p.extra["grid"]
    from attnlab.interventions.patching import metric_name

    return GradResult(method, text, metric_name(subject, t, f), pos,
                      p.input_tokens[subject.model.gradient_first_token :],
                      values.detach().numpy(), f_x, f_b, n_steps,
                      rule if method == "ig" else "", image, grid, notes)  # fmt: skip


def _gradient(subject: Subject, p: Prepared, m, pos: int, site: str, points: torch.Tensor,
              weights: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """d(sum_k w_k f(points_k)) / d points: the gradient of the metric at each path point."""
    leaf = points.detach().clone().to(next(subject.model.parameters()).dtype).requires_grad_()
    with torch.enable_grad(), edited(subject.model, {site: lambda x, name: leaf}):
        out = m(subject.logits_at(p, pos, batch=leaf.size(0)))  # (k,)
        total = (out * weights).sum() if weights is not None else out.sum()
        (g,) = torch.autograd.grad(total, leaf)
    return g.double()
