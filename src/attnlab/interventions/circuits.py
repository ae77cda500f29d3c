"""Circuits: which edges of the residual graph carry a behaviour, and how much of it they carry.

Every edge (or, with ``positions``, every edge at every position: a "unit") is scored on a set
of clean/corrupt pairs (``attnlab.interventions.edges``: EAP, EAP-IG or exact patching); the
circuit of size k is the k units of largest |score| (the mean over the pairs). Its
faithfulness, with every unit outside it ablated,

    f(C) = (M(C) - M(none)) / (M(all) - M(none))

where M is the metric's mean over the pairs, M(all) the clean run (nothing ablated) and
M(none) the run with every unit ablated: the corrupt run itself when the ablation is
``corrupt`` (each ablated unit carries its term from the pair's corrupt input), the run with
every term at its mean over the corrupt inputs when it is ``mean``. 1: the circuit alone
recovers the whole clean - corrupt gap; 0: none of it. Reported beside it: the same for at
least 20 random sets of each size, and 95% confidence intervals by bootstrap over the pairs
(the pairs resampled with replacement, the circuit kept as chosen on all of them).

ACDC (Conmy et al. 2023) finds a circuit exactly instead, one forward pass per unit: visiting
the units from the output backwards (readers last to first, each reader's writers last to
first), it ablates a unit for good if the faithfulness falls by less than tau. Its circuit is
set beside EAP-IG's (or the chosen method's) top units of the same size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from attnlab.interventions.edges import (
    ABLATIONS,
    Circuits,
    Edges,
    Terms,
    check_scoring,
    score_batch,
    short,
)
from attnlab.interventions.pairs import METRIC_WORDS, Batch, PromptSet, prepare_pairs
from attnlab.interventions.subjects import InterventionError, Subject
from attnlab.render.display import Result

RANDOM_SETS = 20  # random unit sets per size, at least
BOOTSTRAP = 1000  # resamples of the pairs for each confidence interval
BUDGET = 2**27  # bytes of terms one batched patched run may hold
SCORE_WORDS = {
    "denoising": "denoising: (term_clean - term_corrupt) . dM/d(reader input) at the corrupt run "
    "(exact: M(corrupt, unit patched to clean) - M(corrupt)); positive = moving the edge toward "
    "clean raises the metric",
    "noising": "noising: (term_clean - term_corrupt) . dM/d(reader input) at the clean run "
    "(exact: M(clean) - M(clean, unit patched to corrupt)); EAP-IG's points start at the clean "
    "input; positive = moving the edge toward corrupt lowers the metric",
}


class Prose:
    """A paragraph wrapped at the console's width at spaces, no line ending in a space."""

    def __init__(self, text: str, style: str = ""):
        self.text, self.style = text, style

    def __rich_console__(self, console, options):
        import textwrap

        from rich.text import Text

        width = max(20, options.max_width)
        for line in textwrap.wrap(self.text, width, break_on_hyphens=False) or [""]:
            yield Text(line, style=self.style)


@dataclass
class Point:
    """The faithfulness of the top k units and of random sets of k (a point of the curve)."""

    k: int
    fraction: float  # k / units
    faithfulness: float
    lo: float  # 95% bootstrap interval over the pairs
    hi: float
    random_mean: float  # over the random sets (each its own faithfulness on all the pairs)
    random_lo: float  # the lowest and highest random set
    random_hi: float

    def to_dict(self) -> dict:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in vars(self).items()}


@dataclass
class CircuitResult(Result):
    """A circuit found on a prompt set (see the module doc). Plain data: ``to_dict`` is what
    ``attnlab circuit --json`` prints."""

    method: str
    steps: int
    metric: str
    ablation: str
    prompts: str
    n_pairs: int
    positions: bool
    units: int
    edges_total: int  # edges of the graph (without positions)
    labels: list[str]  # of the units, in order
    kinds: list[dict]  # per unit: writer, reader, kind (q/k/v/mlp/readout), position
    scores: np.ndarray  # (units,) the mean over the pairs
    clean: float
    corrupt: float
    ablated: float  # M(none): every unit ablated
    k: int
    chosen: Point
    curve: list[Point]
    random_sets: int
    nodes: list[dict] = field(default_factory=list)
    acdc: dict | None = None
    notes: list[str] = field(default_factory=list)
    warning: str | None = None
    tokens: dict[str, list[str]] = field(default_factory=dict)
    direction: str = "denoising"  # which run the units are patched in (edges.DIRECTIONS)

    # -- what it says --------------------------------------------------------------------------

    @property
    def order(self) -> np.ndarray:
        """The units by |score|, largest first (ties: in the graph's order)."""
        return np.argsort(-np.abs(self.scores), kind="stable")

    @property
    def circuit(self) -> list[int]:
        return self.order[: self.k].tolist()

    def method_words(self) -> str:
        base, other = ("clean", "corrupt") if self.direction == "noising" else ("corrupt", "clean")
        if self.method == "eap-ig":
            return (f"EAP-IG, {self.steps} step{'s' * (self.steps != 1)} on the line from the "
                    f"{base} to the {other} input embeddings, {self.direction}")  # fmt: skip
        return {"eap": f"EAP (one gradient, at the {base} run), {self.direction}",
                "exact": f"exact patching, one unit at a time in the {base} run"}[self.method]  # fmt: skip

    def ablation_words(self) -> str:
        return ("every unit outside the circuit carries its term from the pair's corrupt input"
                if self.ablation == "corrupt" else "every unit outside the circuit carries its "
                "term's mean over the corrupt inputs")  # fmt: skip

    def definitions(self) -> dict:
        return {
            "score": SCORE_WORDS[self.direction],
            "faithfulness": "(M(circuit) - M(none)) / (M(all) - M(none)), M the metric's mean "
            "over the pairs, " + self.ablation_words(),
            "reader input": "before the reader's norm; the norm is recomputed from the patched sum",
            "grouped-query": "a K/V head shared by several query heads is one key reader and "
            "one value reader (kvJ.k, kvJ.v) for its group",
            "unit": "an edge at one position" if self.positions else "an edge at every position",
            "methods compared": "exact patching moves one edge alone in the corrupt run; EAP "
            "linearises that at the corrupt run (it misses what a saturated softmax does: a "
            "key that would win attention outright gets almost no gradient); EAP-IG "
            "integrates along the line where every edge moves together, so it credits edges "
            "that act jointly (redundant heads) more than patching one of them alone does",
        }

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        from attnlab.render.tables import FitTable

        what = (
            f"edges per position: {self.units:,} units"
            if self.positions
            else f"{self.units:,} edges"
        )
        parts = []
        if self.warning:
            parts.append(Prose(f"warning: {self.warning}", "bold red"))
        ablated = f", all units at their mean {self.ablated:.4f}" if self.ablation == "mean" else ""
        parts += [
            Prose(f"circuit of {METRIC_WORDS[self.metric]} on {self.prompts}", "bold"),
            Prose(f"method: {self.method_words()}; ablation: {self.ablation_words()}; {what}"),
            Prose(
                f"metric, mean over {self.n_pairs} pair{'s' * (self.n_pairs != 1)}: clean "
                f"{self.clean:.4f}, corrupt {self.corrupt:.4f}{ablated}"
            ),  # fmt: skip
            Text(""),
        ]
        t = FitTable(title=f"the {min(12, self.units)} largest of {self.units:,} scores")
        t.add_column("unit")
        t.add_column("score", justify="right")
        for u in self.order[:12]:
            t.add_row(self.labels[u], f"{self.scores[u]:+.4f}")
        parts.append(t)
        c = FitTable(title=f"faithfulness of the top k (random: {self.random_sets} sets of k)")
        for h, j in (("k", "right"), ("of all", "right"), ("circuit", "right"),
                     ("95% CI", "right"), ("random", "right"), ("random range", "right")):  # fmt: skip
            c.add_column(h, justify=j)
        for p in self.curve:
            c.add_row(f"{p.k:,}", f"{100 * p.fraction:.1f}%", f"{p.faithfulness:+.3f}",
                      f"{p.lo:+.2f}..{p.hi:+.2f}", f"{p.random_mean:+.3f}",
                      f"{p.random_lo:+.2f}..{p.random_hi:+.2f}")  # fmt: skip
        parts.append(Text(""))
        parts.append(c)
        p = self.chosen
        parts.append(Text(""))
        parts.append(Prose(
            f"the circuit: the top {p.k:,} units ({100 * p.fraction:.1f}%) recover "
            f"{p.faithfulness:.3f} of the gap (95% CI {p.lo:.3f}..{p.hi:.3f}); random sets of "
            f"{p.k:,}: {p.random_mean:.3f} on average ({p.random_lo:.3f}..{p.random_hi:.3f})",
            "bold"))  # fmt: skip
        if self.acdc:
            a = self.acdc
            parts.append(Prose(
                f"ACDC (tau {a['tau']:g}, {a['runs']:,} runs): kept {a['k']:,} units, "
                f"faithfulness {a['faithfulness']:.3f} on the pairs it pruned on (other pairs "
                "may give less); "
                f"{a['overlap']:,} of them are among "
                f"{self.method.upper()}'s top {a['k']:,}, whose faithfulness is "
                f"{a['method_faithfulness']:.3f}"))  # fmt: skip
        parts += [Prose(f"note: {n}", "dim") for n in self.notes]
        return Group(*parts)

    def to_dict(self, top: int = 200) -> dict:
        units = [{"unit": int(u), "label": self.labels[u], "score": float(self.scores[u]),
                  **self.kinds[u]} for u in self.order[: max(top, self.k)]]  # fmt: skip
        return {
            "method": self.method, "steps": self.steps, "direction": self.direction,
            "metric": self.metric,
            "metric_definition": METRIC_WORDS[self.metric], "ablation": self.ablation,
            "prompts": self.prompts, "pairs": self.n_pairs, "positions": self.positions,
            "units": self.units, "edges": self.edges_total, "definitions": self.definitions(),
            "clean_metric": self.clean, "corrupt_metric": self.corrupt,
            "ablated_metric": self.ablated, "top": units,
            "circuit": {"k": self.k, "units": self.circuit, **self.chosen.to_dict()},
            "curve": [p.to_dict() for p in self.curve], "random_sets": self.random_sets,
            "nodes": self.nodes, "acdc": self.acdc, "notes": self.notes, "warning": self.warning,
        }  # fmt: skip

    # -- pictures -----------------------------------------------------------------------------

    def save_png(self, path):
        """The circuit graph (``circuit_pictures.graph_figure``)."""
        from attnlab.interventions.circuit_pictures import graph_figure
        from attnlab.interventions.figures import save_png

        return save_png(graph_figure(self), path)

    def save_curve_png(self, path):
        from attnlab.interventions.circuit_pictures import curve_figure
        from attnlab.interventions.figures import save_png

        return save_png(curve_figure(self), path)

    def save_html(self, path):
        from attnlab.interventions.circuit_pictures import write_page

        return write_page(self, path)

    def _repr_html_(self) -> str:
        import html

        from attnlab.interventions.circuit_pictures import curve_figure, graph_figure
        from attnlab.interventions.figures import figure_html

        return (f"<pre>{html.escape(str(self))}</pre>" + figure_html(graph_figure(self))
                + figure_html(curve_figure(self)))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Running masks
# ---------------------------------------------------------------------------------------------


@dataclass
class Prepared:
    """The prompt set's batches with their clean and ablation terms: what every faithfulness
    run reads."""

    circ: Circuits
    edges: Edges
    batches: list[Batch]
    clean: list[Terms]
    src: list[Terms]  # what an ablated unit carries: the corrupt terms, or their mean
    metric: str
    n_pairs: int

    def metric_of(self, keep: torch.Tensor) -> np.ndarray:
        """(K, pairs) the metric of each pair with only the units ``keep[k]`` (K, units) left
        as they are and every other unit ablated."""
        K = keep.size(0)
        out = np.zeros((K, self.n_pairs))
        for b, clean, src in zip(self.batches, self.clean, self.src):
            chunk = max(1, BUDGET // max(1, clean.row_bytes() * len(b)))
            for c in range(0, K, chunk):
                m = self.circ.mixed(b, b.clean, src, ~keep[c : c + chunk], self.edges,
                                    self.metric)  # fmt: skip
                out[c : c + chunk][:, b.index] = m.cpu().numpy()
        return out


def faithfulness(values: np.ndarray, clean: np.ndarray, none: np.ndarray) -> np.ndarray:
    """(..., pairs) metrics -> (...,) (mean - mean(none)) / (mean(clean) - mean(none))."""
    gap = clean.mean() - none.mean()
    return (values.mean(-1) - none.mean()) / gap


def bootstrap(values: np.ndarray, clean: np.ndarray, none: np.ndarray, n: int,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(K, pairs) -> the 2.5% and 97.5% points (K,) of the faithfulness over ``n`` resamples
    of the pairs with replacement."""
    P = values.shape[-1]
    idx = rng.integers(0, P, size=(n, P))  # (n, P)
    gap = clean[idx].mean(-1) - none[idx].mean(-1)  # (n,)
    f = (values[:, idx].mean(-1) - none[idx].mean(-1)) / gap  # (K, n)
    return np.nanpercentile(f, 2.5, axis=-1), np.nanpercentile(f, 97.5, axis=-1)


def grid(units: int, points: int = 14) -> list[int]:
    """Sizes for the curve: 1 to ``units``, about evenly apart on a log scale."""
    g = np.unique(np.round(np.geomspace(1, units, points)).astype(int))
    return [int(x) for x in g]


# ---------------------------------------------------------------------------------------------
# Finding the circuit
# ---------------------------------------------------------------------------------------------


def find_circuit(subject: Subject, prompts: PromptSet, *, method: str = "eap-ig",
                 steps: int = 5, metric: str | None = None, ablation: str = "corrupt",
                 positions: bool = False, k: int | None = None, fraction: float | None = None,
                 target: float = 0.9, random_sets: int = RANDOM_SETS,
                 resamples: int = BOOTSTRAP, seed: int = 0, acdc: float | None = None,
                 acdc_max: int = 4096, position: int | None = None,
                 curve_points: int = 14, direction: str = "denoising") -> CircuitResult:  # fmt: skip
    """Score every unit on ``prompts``, then take the top k as the circuit and measure it (see
    the module doc). The circuit's size: ``k`` units, or ``fraction`` of them, or else the
    smallest size on the curve whose faithfulness reaches ``target``. ``metric``: logit-diff
    (every pair has a foil) or logprob; default logit-diff where every pair names a foil.
    ``acdc``: also run ACDC with this tau (refused past ``acdc_max`` units: one forward pass
    each). ``direction``: the units' scores denoising (patched in the corrupt run) or noising
    (in the clean run); faithfulness is the same measure either way."""
    check_scoring(method, direction)
    if ablation not in ABLATIONS:
        raise InterventionError(f"--ablation must be corrupt or mean, got {ablation!r}")
    if random_sets < RANDOM_SETS:
        raise InterventionError(f"random sets: at least {RANDOM_SETS} per size")
    circ = Circuits(subject)  # a kind with no residual graph is refused here, in one line
    if metric is None:
        metric = "logit-diff" if all(p.foil is not None for p in prompts.pairs) else "logprob"
    batches = prepare_pairs(subject, prompts, metric, position)
    if positions and len(batches) > 1:
        raise InterventionError("edges per position need every pair to have the same length "
                                "(positions line up across pairs); these pairs have "
                                f"{len(batches)} lengths: drop --positions")  # fmt: skip
    edges = Edges(circ.graph, batches[0].lengths, positions)
    U = edges.count
    if k is not None and not 1 <= k <= U:
        raise InterventionError(f"--k {k}: the graph has {U:,} "
                                f"{'units (edges x positions)' if positions else 'edges'}")  # fmt: skip
    if acdc is not None and acdc_max < U:
        raise InterventionError(f"ACDC runs one forward pass per unit: this graph has {U:,}, "
                                f"past --acdc-max {acdc_max:,}")  # fmt: skip
    n_pairs = len(prompts)
    scores = np.zeros((n_pairs, U))
    node_score: dict[str, np.ndarray] = {}
    cleans, srcs = [], []
    clean_m, corrupt_m = np.zeros(n_pairs), np.zeros(n_pairs)
    for b in batches:
        s = score_batch(circ, b, edges, metric, method, steps, nodes=method != "exact",
                        direction=direction)  # fmt: skip
        scores[b.index] = s.scores.cpu().numpy()
        for name, v in s.nodes.items():
            node_score.setdefault(name, np.zeros(n_pairs))[b.index] = v.cpu().numpy()
        cleans.append(s.clean)
        srcs.append(s.corrupt if ablation == "corrupt" else s.corrupt.mean())
        clean_m[b.index] = s.clean.metric.cpu().numpy()
        corrupt_m[b.index] = s.corrupt.metric.cpu().numpy()
    run = Prepared(circ, edges, batches, cleans, srcs, metric, n_pairs)
    mean_scores = scores.mean(0)
    order = np.argsort(-np.abs(mean_scores), kind="stable")
    none = corrupt_m if ablation == "corrupt" else run.metric_of(
        torch.zeros(1, U, dtype=torch.bool))[0]  # fmt: skip
    sizes = grid(U, curve_points)
    if k is None and fraction is not None:
        k = max(1, min(U, int(math.floor(fraction * U))))
    if k is not None:
        sizes = sorted(set(sizes) | {k})
    rng = np.random.default_rng(seed)
    keep = torch.zeros(len(sizes) * (1 + random_sets), U, dtype=torch.bool)
    for i, n in enumerate(sizes):
        keep[i * (1 + random_sets), order[:n]] = True
        for j in range(random_sets):
            keep[i * (1 + random_sets) + 1 + j, rng.choice(U, n, replace=False)] = True
    values = run.metric_of(keep)  # (rows, pairs)
    f = faithfulness(values, clean_m, none)
    lo, hi = bootstrap(values, clean_m, none, resamples, rng)
    curve = []
    for i, n in enumerate(sizes):
        a = i * (1 + random_sets)
        rand = f[a + 1 : a + 1 + random_sets]
        curve.append(Point(n, n / U, float(f[a]), float(lo[a]), float(hi[a]),
                           float(rand.mean()), float(rand.min()), float(rand.max())))  # fmt: skip
    if k is None:
        k = next((p.k for p in curve if p.faithfulness >= target), U)
    chosen = next(p for p in curve if p.k == k)
    gap = clean_m.mean() - none.mean()
    warning = None
    if abs(gap) < 1e-6:
        warning = (f"clean and {'corrupt' if ablation == 'corrupt' else 'mean-ablated'} runs "
                   f"give the same metric ({clean_m.mean():.4f}): every faithfulness divides "
                   "by nothing; pick pairs the model tells apart")  # fmt: skip
    notes = list(subject.notes)
    kv = [r for r in circ.graph.readers if r.kind in "kv" and len(r.heads) > 1]
    if kv:
        g = len(kv[0].heads)
        notes.append(f"grouped-query attention: each K/V head serves {g} query heads and is "
                     "one key reader and one value reader for its group (kvJ.k, kvJ.v)")  # fmt: skip
    if not all(circ.graph.additive(st) for st in circ.graph.stacks):
        notes.append("post-norm blocks: a writer's term at a reader is its output carried "
                     "through the norms on the stream between them, their scales frozen at "
                     "each run's own; a reader with only some edges patched keeps its run's "
                     "constants (biases)")  # fmt: skip
    result = CircuitResult(
        method, steps if method == "eap-ig" else 1, metric, ablation, prompts.source, n_pairs,
        positions, U, len(circ.graph.edges()), [edges.label(u) for u in range(U)],
        _kinds(edges), mean_scores, float(clean_m.mean()), float(corrupt_m.mean()),
        float(none.mean()), k, chosen, curve, random_sets,
        _nodes(circ, edges, scores, node_score), None, notes, warning,
        dict(batches[0].tokens), direction,
    )  # fmt: skip
    if acdc is not None:
        result.acdc = run_acdc(run, acdc, clean_m, none, order)
    return result


def _kinds(edges: Edges) -> list[dict]:
    out = []
    for u in range(edges.count):
        w, r, p = edges.unit(u)
        out.append({"writer": w.name, "reader": r.name, "input": r.kind, "position": p})
    return out


def _nodes(circ: Circuits, edges: Edges, scores: np.ndarray, node: dict) -> list[dict]:
    """Each writer's node score (its own gradient) beside the sum of its units' scores: equal
    where the writer's stream is a plain sum after it (``graph.additive``), by the chain rule
    (every reader downstream reads its output unchanged, and each is counted)."""
    if not node:
        return []
    sums: dict[str, float] = {}
    mean = scores.mean(0)
    for u in range(edges.count):
        w, _, _ = edges.unit(u)
        sums[w.name] = sums.get(w.name, 0.0) + float(mean[u])
    return [{"writer": w.name, "label": short(w), "node_score": float(node[w.name].mean()),
             "sum_of_edges": sums.get(w.name, 0.0),
             "equal_by_definition": circ.graph.additive(w.stack)}
            for w in circ.graph.writers]  # fmt: skip


def run_acdc(run: Prepared, tau: float, clean: np.ndarray, none: np.ndarray,
             order: np.ndarray) -> dict:  # fmt: skip
    """ACDC's greedy pruning (module doc): every unit from the output backwards, ablated for
    good where the faithfulness falls by less than ``tau``."""
    U = run.edges.count
    keep = torch.ones(1, U, dtype=torch.bool)
    current = float(faithfulness(run.metric_of(keep), clean, none)[0])
    runs = 1
    for u in reversed(range(U)):
        trial = keep.clone()
        trial[0, u] = False
        f = float(faithfulness(run.metric_of(trial), clean, none)[0])
        runs += 1
        if current - f < tau:
            keep, current = trial, f
    kept = keep[0].nonzero().flatten().tolist()
    n = len(kept)
    top = set(order[:n].tolist())
    mine = torch.zeros(1, U, dtype=torch.bool)
    mine[0, order[:n]] = True
    method_f = float(faithfulness(run.metric_of(mine), clean, none)[0]) if n else 0.0
    return {"tau": tau, "runs": runs, "k": n, "units": kept, "faithfulness": current,
            "overlap": len(top & set(kept)), "method_faithfulness": method_f}  # fmt: skip
