"""Edges of the residual graph: attribute a metric to each, and run the model with any set of
them patched.

The graph (``attnlab.models.graph``) says who writes each residual stream (the embeddings,
each head, each feed-forward) and who reads it (each head's query, key and value input, each
feed-forward's input, the readout). Reader r's input is the sum of the terms its upstream
writers w add, c_w (their outputs as they arrive: through any post-norm block's norms, those
frozen), and some constants (biases). An edge w -> r is one term of one reader's input; with
``positions``, one term at one position of the stream (a "unit"; without, a unit is the edge
at every position).

Patching a set P of units (``Edges`` indexes them) in a forward pass of the ``base`` input
gives reader r, at each position, the input

    x_r' = x_r + sum_{w: (w, r) in P} (c_w^src - c_w)

where x_r and c_w are this forward pass's own (so whatever a patched edge changes upstream is
carried on: ACDC's convention) and c_w^src the other run's (``src``: the corrupt run, or the
mean of each term over the corrupt inputs). The reader's norm is recomputed from the patched
sum (its hook, ``graph.site``, sits after the norm: the circuit code applies the norm it names
to x_r'). Where every edge into a reader at a position is patched, the reader reads the other
run's input there, constants included: so patching every unit gives the other run exactly,
patching none the base run, and in a pre-norm model (the constants are the same in both runs)
this is the sum above. ``frozen`` units take the base run's own recorded value instead (path
patching holds paths at their clean values so).

Scores of every unit at once, for a corrupt -> clean pair (denoising, Syed et al. 2023):

    EAP     (c_w^clean - c_w^corrupt) . dM/dx_r        the gradient on the corrupt run
    EAP-IG  (c_w^clean - c_w^corrupt) . mean_k dM/dx_r(alpha_k)
            on the runs whose input embeddings (the stream entering block 0 of each stack) are
            interpolated, (1 - alpha) e_corrupt + alpha e_clean, alpha_k = k / n, k = 0..n-1:
            n = 1 is EAP (Hanna et al. 2024 integrate the same way, at the inputs)
    exact   M(corrupt with that one unit patched to clean) - M(corrupt)

dM/dx_r is taken at the reader's own input, before its norm (each head's input is its own:
``attnlab.attention.per_head_inputs``); a K/V head that grouped-query attention shares is one
key reader and one value reader for its group, its gradient summed over the group's heads.
Positive means: moving the edge toward the clean run moves the metric up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab import hooks
from attnlab.attention import per_head_inputs
from attnlab.interventions.pairs import Batch, metric_values
from attnlab.interventions.subjects import InterventionError, Subject
from attnlab.models.graph import Node, ResidualGraph, Walker

METHODS = ("eap", "eap-ig", "exact")
DIRECTIONS = ("denoising", "noising")  # which run is patched: the corrupt one, or the clean one
ABLATIONS = ("corrupt", "mean")


def graph_of(subject: Subject) -> ResidualGraph:
    """The model's residual graph, or one line saying why it has none and what works."""
    if not subject.model.residual:
        raise InterventionError(
            f"circuits are paths through a residual graph (writers adding to a stream that heads "
            f"and feed-forwards read); a {subject.kind} has none: its recurrent state is "
            "rewritten at every step, not added to. `attnlab patch` (its context vector), "
            "`attnlab ablate --context` and `attnlab attribute --method ig` work on it"
        )
    return subject.model.graph()


# ---------------------------------------------------------------------------------------------
# The units: edges, or edges at each position
# ---------------------------------------------------------------------------------------------


class Edges:
    """The units a circuit is made of, numbered: for each reader in the graph's order, for each
    writer upstream of it, for each position of its stream (one position, "every", without
    ``positions``). ``lengths``: each stack's number of positions."""

    def __init__(self, graph: ResidualGraph, lengths: dict[str, int], positions: bool = False):
        self.graph, self.positions, self.lengths = graph, positions, dict(lengths)
        self.readers = list(graph.readers)
        self.upstream = {r.name: graph.upstream(r) for r in self.readers}
        self.start: dict[str, int] = {}
        n = 0
        for r in self.readers:
            self.start[r.name] = n
            n += len(self.upstream[r.name]) * self.width(r)
        self.count = n

    def width(self, r: Node) -> int:
        """Positions per edge into ``r``: its stream's length, or 1 without positions."""
        return self.lengths[r.stack] if self.positions else 1

    def block(self, r: Node) -> slice:
        """The units of the edges into ``r``: writer-major, then position."""
        s = self.start[r.name]
        return slice(s, s + len(self.upstream[r.name]) * self.width(r))

    def per_reader(self, m: Tensor, r: Node) -> Tensor:
        """``m`` (N, units) -> (N, T or 1, W): the units into ``r``, position by writer."""
        W, P = len(self.upstream[r.name]), self.width(r)
        return m[:, self.block(r)].view(m.size(0), W, P).transpose(1, 2)

    def unit(self, u: int) -> tuple[Node, Node, int | None]:
        """(writer, reader, position or None) of unit ``u``."""
        for r in reversed(self.readers):
            if self.start[r.name] <= u:
                w, p = divmod(u - self.start[r.name], self.width(r))
                return self.upstream[r.name][w], r, (p if self.positions else None)
        raise IndexError(u)

    def label(self, u: int) -> str:
        w, r, p = self.unit(u)
        return f"{short(w)} -> {short(r)}" + (f" @{p}" if p is not None else "")

    def edge_pairs(self) -> list[tuple[Node, Node]]:
        """Every (writer, reader) edge, in the units' order."""
        return [(w, r) for r in self.readers for w in self.upstream[r.name]]

    def by_edge(self, x: Tensor) -> Tensor:
        """(..., units) -> (..., edges): each edge's units summed over its positions."""
        if not self.positions:
            return x
        cols = [x[..., self.block(r)].unflatten(-1, (len(self.upstream[r.name]), self.width(r)))
                .sum(-1) for r in self.readers]  # fmt: skip
        return torch.cat(cols, dim=-1)


def short(node: Node) -> str:
    """A node as tables print it: embed, 0.1 (a head), 0.mlp, 1.0.k, kv0.v, cross.1.0.q,
    encoder.0.1, readout (logits)."""
    stack = f"{node.stack}." if node.stack and len({node.stack}) else ""
    if node.kind == "embed":
        return f"{stack}embed"
    if node.kind == "readout":
        return f"{stack}logits"
    layer = node.path.split(".blocks.")[-1].split(".")[0] if ".blocks." in node.path else (
        node.path.split(".")[1])  # fmt: skip
    kind = "cross." if node.sublayer == "cross" else ""
    if node.kind == "mlp":
        return f"{stack}{layer}.mlp"
    if node.role == "writer":
        return f"{stack}{kind}{layer}.{node.head}"
    label = node.name.rsplit(".", 2)[-2]  # head3 or kv1
    who = label[4:] if label.startswith("head") else label
    return f"{stack}{kind}{layer}.{who}.{node.kind}"


# ---------------------------------------------------------------------------------------------
# Recording the runs, and the terms each reader reads
# ---------------------------------------------------------------------------------------------


@dataclass
class Terms:
    """One input's (or the mean's) terms at every reader: for each (stack, at), the upstream
    writers' terms in the graph's order, each (B, T, C); each reader's source (B, T, C); the
    recording. A term that reaches later readers unchanged (no norm between: a pre-norm model)
    is one tensor at all of them, so the terms of L layers take memory in L, not L^2."""

    parts: dict[tuple[str, tuple[int, int]], list[Tensor]]
    inputs: dict[str, Tensor]
    cache: dict
    metric: Tensor  # (B,)

    def mean(self) -> Terms:
        """Each term and input averaged over the rows, position by position (B = 1)."""
        means: dict[int, Tensor] = {}  # a term shared by several readers is averaged once

        def mean(t: Tensor) -> Tensor:
            if id(t) not in means:
                means[id(t)] = t.mean(0, keepdim=True)
            return means[id(t)]

        return Terms({k: [mean(t) for t in v] for k, v in self.parts.items()},
                     {k: v.mean(0, keepdim=True) for k, v in self.inputs.items()},
                     self.cache, self.metric.mean(0, keepdim=True))  # fmt: skip

    def row_bytes(self) -> int:
        """About the memory one row of a patched run (``Circuits.mixed``) holds in terms: each
        writer's once (a tensor shared by several readers counted once), and the largest
        reader group's stacked as a patch reads them."""
        ts = {id(t): t for v in self.parts.values() for t in v}
        once = sum(t.numel() * t.element_size() for t in ts.values())
        group = max((sum(t.numel() * t.element_size() for t in v) for v in self.parts.values()),
                    default=0)  # fmt: skip
        return (once + group) // max(1, self.metric.numel())


def differences(a: list[Tensor], b: list[Tensor], rows: Tensor | None = None,
                dim: int = 0) -> Tensor:  # fmt: skip
    """(W, B, T, C): each writer's term in ``a`` (its ``rows``) less its term in ``b``; the
    writers along ``dim`` (2: (B, T, W, C))."""
    return torch.stack([(x if rows is None else x[rows]) - y for x, y in zip(a, b)], dim)


@contextmanager
def no_weight_grads(model: nn.Module) -> Iterator[None]:
    """Inside, the parameters need no gradient (a backward pass computes the inputs' only)."""
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in params:
            p.requires_grad_(False)
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


class Circuits:
    """A subject's residual graph made runnable: record a batch with every reader's input its
    own, take the metric's gradient at every reader, and run with units patched."""

    def __init__(self, subject: Subject):
        self.subject, self.model = subject, subject.model
        self.dtype = next(self.model.parameters()).dtype  # the terms'
        self.graph = graph_of(subject)
        self.norms = {r.name: (self.model.get_submodule(r.norm) if r.norm else None)
                      for r in self.graph.readers}  # fmt: skip
        self.sites: dict[str, list[tuple[Node, int | None]]] = {}
        for r in self.graph.readers:
            site = self.graph.site(r)
            self.sites.setdefault(site.hook, []).append((r, site.index))
        self.recorded = self.graph.recorded()
        self.groups: dict[tuple[str, tuple[int, int]], list[Node]] = {}
        for r in self.graph.readers:
            self.groups.setdefault((r.stack, r.at), []).append(r)
        # forward order of the reader groups within each stack (a Walker goes forward only)
        self.order = sorted(self.groups, key=lambda k: (self.graph.stacks.index(k[0]), k[1]))

    # -- runs ----------------------------------------------------------------------------------

    def _forward(self, args: tuple) -> Tensor:
        return self.subject.forward(*args)

    def terms(self, cache: dict, dtype: torch.dtype | None = None) -> tuple[dict, dict]:
        """From a recording: the writers' terms at each reader group (a list of (B, T, C), see
        ``Terms``), and each reader's input (its source, before the norm), in the model's
        dtype."""
        dtype = dtype or self.dtype
        walkers = {s: Walker(self.model, s, cache, dtype=dtype) for s in self.graph.stacks}
        parts = {}
        for key in self.order:
            stack, at = key
            got = walkers[stack].to(at)
            ups = self.graph.upstream(self.groups[key][0])
            parts[key] = [got[w.name].to(dtype) for w in ups]
        inputs = {r.source: cache[r.source] for r in self.graph.readers}
        return parts, inputs

    def record(self, args: tuple, batch: Batch, metric: str) -> Terms:
        """One forward pass (no gradient), every reader reading its own copy of its input."""
        with torch.no_grad(), per_head_inputs(self.model), hooks.record(self.model,
                                                                         self.recorded) as c:  # fmt: skip
            m = metric_values(self._forward(args), batch, metric)
        return Terms(*self.terms(c), dict(c), m)

    def gradients(self, args: tuple, batch: Batch, metric: str,
                  embed: dict[str, Tensor] | None = None, writers: bool = False):  # fmt: skip
        """One forward and backward pass: (metric (B,), {reader name: dM/dx_r (B, T, C)},
        the recording, and with ``writers`` {writer name: dM/d(its output) (B, T, C)}).
        ``embed``: {stack: the stream entering its block 0} to run instead of the input's
        own (EAP-IG's interpolation)."""
        live: dict[str, Tensor] = {}
        views: dict[str, Tensor] = {}
        joins: dict[str, Tensor] = {}
        edits: dict[str, list[Callable]] = {}

        def add(name: str, fn: Callable) -> None:
            edits.setdefault(name, []).append(fn)

        for stack in self.graph.stacks:  # the gradient starts at each stack's input
            x = (embed or {}).get(stack)
            add(_entry(self.graph, stack),
                lambda t, n, x=x: (t if x is None else x.to(t.dtype)).detach().requires_grad_())  # fmt: skip
        for source in dict.fromkeys(r.source for r in self.graph.readers):
            add(source, _grab(live))
        for hook, readers in self.sites.items():
            r0, index = readers[0]
            norm = self.norms[r0.name] if self.graph.site(r0).normed else None
            add(hook, _reading_own(live, views, r0.source, norm, index))
        if writers:
            for hook in dict.fromkeys(self.graph.joins(w)[0] for w in self.graph.writers):
                add(hook, _grab(joins))
        combined = {n: _chain(fns) for n, fns in edits.items()}
        with (no_weight_grads(self.model), torch.enable_grad(), per_head_inputs(self.model),
              hooks.record(self.model, self.recorded, edit=combined) as c):  # fmt: skip
            m = metric_values(self._forward(args), batch, metric)
            wanted = list(views.values()) + (list(joins.values()) if writers else [])
            got = torch.autograd.grad(m.sum(), wanted, allow_unused=True)
        got = [torch.zeros_like(t) if g is None else g for t, g in zip(wanted, got)]
        by_site = dict(zip(views, got[: len(views)]))
        grads = {}
        for hook, readers in self.sites.items():
            for r, idx in readers:
                g = by_site[hook]
                grads[r.name] = g if idx is None else g[:, idx]
        out = (m.detach(), grads, dict(c))
        if writers:
            at_join = dict(zip(joins, got[len(views) :]))
            wg = {}
            for w in self.graph.writers:
                hook, scale = self.graph.joins(w)
                wg[w.name] = at_join[hook] / scale
            out += (wg,)
        return out

    def mixed(self, batch: Batch, args: tuple, src: Terms, patched: Tensor, edges: Edges,
              metric: str, frozen: Tensor | None = None,
              base: Terms | None = None) -> Tensor:  # fmt: skip
        """(K, B) the metric of the input ``args`` (one of ``batch``'s) run K times side by
        side, row k with the units ``patched[k]`` (K, units) taking ``src``'s terms and the
        units ``frozen[k]`` the base run's own (``base``: Terms of ``args``), as the module
        doc says. ``src`` has B rows, or 1 (a mean)."""
        K, B = patched.size(0), len(batch)
        N = K * B
        rows = batch.repeat(K)
        run_args = tuple(a.repeat(K, *([1] * (a.dim() - 1))) for a in args)
        pair = torch.arange(N) % B  # (N,) the pair of each row
        src_rows = pair % src.metric.numel()
        masks, fmasks = {}, {}
        for r in self.graph.readers:
            m = edges.per_reader(patched, r)  # (K, P, W)
            if bool(m.any()):
                masks[r.name] = m.repeat_interleave(B, 0)  # (N, P, W)
            if frozen is not None:
                f = edges.per_reader(frozen, r)
                if bool(f.any()):
                    fmasks[r.name] = f.repeat_interleave(B, 0)
        live: dict[str, Tensor] = {}
        edits: dict[str, list[Callable]] = {}
        with (
            torch.no_grad(),
            per_head_inputs(self.model),
            hooks.record(self.model, self.recorded) as cache,
        ):
            walkers = {s: Walker(self.model, s, cache, dtype=self.dtype)
                       for s in self.graph.stacks}  # fmt: skip
            memo: dict = {}

            def this_terms(key) -> list[Tensor]:  # W x (N, T, C): this run's terms at a group
                if key not in memo:
                    got = walkers[key[0]].to(key[1])
                    ups = self.graph.upstream(self.groups[key][0])
                    memo[key] = [got[w.name] for w in ups]
                return memo[key]

            for source in dict.fromkeys(r.source for r in self.graph.readers):
                edits.setdefault(source, []).append(_grab(live))
            for hook, readers in self.sites.items():
                todo = [(r, i) for r, i in readers if r.name in masks or r.name in fmasks]
                if todo:
                    edits.setdefault(hook, []).append(self._patching(
                        todo, live, this_terms, src, src_rows, base, pair, masks, fmasks))  # fmt: skip
            combined = {n: _chain(fns) for n, fns in edits.items()}
            with hooks.record(self.model, [], edit=combined):
                m = metric_values(self._forward(run_args), rows, metric)
        return m.view(K, B)

    def _patching(self, readers, live, this_terms, src: Terms, src_rows, base, pair, masks,
                  fmasks) -> Callable:  # fmt: skip
        """The edit of one reader site in a patched run: each reader at it whose units are
        patched reads x_r + sum of (other - this) terms, through its norm (module doc)."""

        def edit(y: Tensor, name: str) -> Tensor:
            out = y.clone()
            for r, idx in readers:
                key, x = (r.stack, r.at), live[r.source]  # x (N, T, C) this run's input
                this = this_terms(key)  # W x (N, T, C)
                delta = torch.zeros_like(x)
                full = None
                for ms, terms, rows in ((masks.get(r.name), src, src_rows),
                                        (fmasks.get(r.name), base, pair)):  # fmt: skip
                    if ms is None:
                        continue
                    diff = differences(terms.parts[key], this, rows).to(x.dtype)  # (W, N, T, C)
                    delta += (
                        torch.einsum("npw,wntc->ntc", ms.to(x.dtype), diff)
                        if ms.size(1) > 1
                        else torch.einsum("nw,wntc->ntc", ms[:, 0].to(x.dtype), diff)
                    )
                ms = masks.get(r.name)
                touched = ms.any(-1) if ms is not None else None  # (N, P)
                if fmasks.get(r.name) is not None:
                    f_any = fmasks[r.name].any(-1)
                    touched = f_any if touched is None else touched | f_any
                else:
                    full = ms.all(-1)  # every edge into r there is patched: src's input exactly
                x_new = x + delta
                if full is not None and bool(full.any()):
                    x_new = torch.where(full[..., None], src.inputs[r.source][src_rows], x_new)
                site = self.graph.site(r)
                norm = self.norms[r.name] if site.normed else None
                y_new = norm(x_new) if norm is not None else x_new
                cur = out if idx is None else out[:, idx]
                new = torch.where(touched[..., None], y_new, cur)
                if idx is None:
                    out = new
                else:
                    out[:, idx] = new
            return out

        return edit


def _entry(graph: ResidualGraph, stack: str) -> str:
    """The hook of the stream entering block 0 of ``stack``."""
    w = next(w for w in graph.writers if w.stack == stack and w.kind == "embed")
    return graph.joins(w)[0]


def _grab(store: dict) -> Callable:
    def grab(x: Tensor, name: str) -> Tensor:
        store[name] = x
        return x

    return grab


def _chain(fns: list[Callable]) -> Callable:
    if len(fns) == 1:
        return fns[0]

    def run(x: Tensor, name: str) -> Tensor:
        for f in fns:
            x = f(x, name)
        return x

    return run


def _reading_own(live: dict, views: dict, source: str, norm, index) -> Callable:
    """The edit of a reader site that makes its readers read their own copy of the source,
    through their norm again (``norm``; None: the site is before any norm): the copy (a view)
    is what the gradient is taken against."""

    def edit(y: Tensor, name: str) -> Tensor:
        x = live[source]
        xe = x.unsqueeze(1).expand_as(y) if index is not None else x.view_as(x)
        views[name] = xe
        return norm(xe) if norm is not None else xe

    return edit


# ---------------------------------------------------------------------------------------------
# Scores
# ---------------------------------------------------------------------------------------------


@dataclass
class Scored:
    """One batch of pairs scored: every unit's score per pair (B, units), each writer's node
    score per pair (B,) where the method gives one, and the clean and corrupt runs' Terms."""

    scores: Tensor
    nodes: dict[str, Tensor]
    clean: Terms
    corrupt: Terms


def _unit_scores(circ: Circuits, edges: Edges, diffs: Callable, grads: dict) -> Tensor:
    """(B, units): sum over the channels of each writer's term difference at each reader
    (``diffs(key)`` (B, T, W, C)) times the reader's gradient (B, T, C), per position or
    summed over them. A reader group's readers (a layer's heads' q, k and v inputs) share the
    differences: one matrix product per position scores all of them."""
    groups: dict[tuple, list[Node]] = {}
    for r in edges.readers:
        groups.setdefault((r.stack, r.at), []).append(r)
    cols = {}
    for key, readers in groups.items():
        D = diffs(key)  # (B, T, W, C)
        G = torch.stack([grads[r.name].to(D.dtype) for r in readers], -1)  # (B, T, C, R)
        S = torch.matmul(D, G).double()  # (B, T, W, R)
        for i, r in enumerate(readers):
            s = S[..., i].transpose(1, 2)  # (B, W, T)
            cols[r.name] = s.flatten(1) if edges.positions else s.sum(-1)
    return torch.cat([cols[r.name] for r in edges.readers], dim=1)


def check_scoring(method: str, direction: str) -> None:
    """Refuse, in one line, a scoring method or direction that is not one of ours."""
    if method not in METHODS:
        raise InterventionError(f"--method must be one of {', '.join(METHODS)}, got {method!r}")
    if direction not in DIRECTIONS:
        raise InterventionError(f"--direction must be one of {', '.join(DIRECTIONS)}, got "
                                f"{direction!r}")  # fmt: skip


def score_batch(circ: Circuits, batch: Batch, edges: Edges, metric: str, method: str = "eap",
                steps: int = 1, nodes: bool = False, direction: str = "denoising") -> Scored:  # fmt: skip
    """Every unit's score for each pair of ``batch`` (module doc): EAP, EAP-IG with ``steps``
    points, or exact. ``nodes``: also each writer's node score, (c_w^clean - c_w^corrupt) .
    dM/d(c_w) at the corrupt run, from the gradient where its output joins the stream (EAP's
    node attribution; with EAP-IG averaged over the same points). ``direction``: "denoising"
    (the module doc) or "noising", where the base run is the clean one: exact is M(clean) -
    M(clean with that unit patched to corrupt), EAP takes the gradient at the clean run, and
    EAP-IG's points start there, alpha_k = k / n of the way to the corrupt input."""
    check_scoring(method, direction)
    noising = direction == "noising"
    base_args, other_args = (
        (batch.clean, batch.corrupt) if noising else (batch.corrupt, batch.clean)
    )
    other = circ.record(other_args, batch, metric)
    if method == "exact" and not nodes:
        base = circ.record(base_args, batch, metric)
        clean, corrupt = (base, other) if noising else (other, base)
        scores = exact_scores(circ, batch, edges, clean, corrupt, metric, direction)
        return Scored(scores, {}, clean, corrupt)
    n = steps if method == "eap-ig" else 1
    total: dict[str, Tensor] = {}
    wtotal: dict[str, Tensor] = {}
    base = None
    for k in range(n):
        embed = None
        if k:  # the inputs' embeddings on the line from the base run (alpha 0) to the other
            embed = {s: torch.lerp(base.cache[_entry(circ.graph, s)],
                                   other.cache[_entry(circ.graph, s)], k / n)
                     for s in circ.graph.stacks}  # fmt: skip
        got = circ.gradients(base_args, batch, metric, embed=embed, writers=nodes)
        m, g, cache = got[:3]
        if k == 0:
            base = Terms(*circ.terms(cache), cache, m)
        for name, v in g.items():
            total[name] = total[name] + v if name in total else v
        if nodes:
            for name, v in got[3].items():
                wtotal[name] = wtotal[name] + v if name in wtotal else v
    clean, corrupt = (base, other) if noising else (other, base)
    grads = {name: v / n for name, v in total.items()}
    node_scores = {}
    if nodes:
        for w in circ.graph.writers:
            d = circ.graph.output(clean.cache, w) - circ.graph.output(corrupt.cache, w)
            node_scores[w.name] = torch.einsum("btc,btc->b", d.double(),
                                               (wtotal[w.name] / n).double())  # fmt: skip
    if method == "exact":
        scores = exact_scores(circ, batch, edges, clean, corrupt, metric, direction)
    else:
        scores = _unit_scores(
            circ, edges, lambda key: differences(clean.parts[key], corrupt.parts[key], dim=2), grads
        )
    return Scored(scores, node_scores, clean, corrupt)


def exact_scores(circ: Circuits, batch: Batch, edges: Edges, clean: Terms, corrupt: Terms,
                 metric: str, direction: str = "denoising", budget: int = 2**27) -> Tensor:  # fmt: skip
    """(B, units): M(corrupt, that unit patched to clean) - M(corrupt) for every unit (with
    ``direction`` "noising": M(clean) - M(clean, that unit patched to corrupt)), run side by
    side in chunks of about ``budget`` bytes of terms. A unit whose two terms are equal (at its
    position) changes nothing: 0, and no run."""
    B = len(batch)
    noising = direction == "noising"  # the clean run, each unit patched to corrupt
    base_args, base, src = (
        (batch.clean, clean, corrupt) if noising else (batch.corrupt, corrupt, clean)
    )
    sign = -1.0 if noising else 1.0  # the score is M(clean) - M(clean, patched) when noising
    moved = torch.zeros(edges.count, dtype=torch.bool)
    for r in edges.readers:
        D = differences(clean.parts[(r.stack, r.at)], corrupt.parts[(r.stack, r.at)]).abs()
        D = D.amax(dim=(1, 3))  # (W, T)
        moved[edges.block(r)] = (D > 0).flatten() if edges.positions else (D > 0).any(-1)
    todo = moved.nonzero().flatten().tolist()
    out = torch.zeros(B, edges.count, dtype=torch.float64)
    chunk = max(1, budget // max(1, clean.row_bytes() * B))
    for c in range(0, len(todo), chunk):
        units = todo[c : c + chunk]
        patched = torch.zeros(len(units), edges.count, dtype=torch.bool)
        patched[torch.arange(len(units)), units] = True
        m = circ.mixed(batch, base_args, src, patched, edges, metric)  # (K, B)
        out[:, units] = (sign * (m - base.metric[None])).T.cpu()
    return out


# ---------------------------------------------------------------------------------------------
# Path patching
# ---------------------------------------------------------------------------------------------


def path_patch(circ: Circuits, batch: Batch, sender: str, receivers: list[str],
               metric: str) -> dict:  # fmt: skip
    """A sender's effect along chosen paths only (Wang et al. 2022): in the clean run, each
    receiver (a reader: a head's q, k or v input, a feed-forward's input, or the readout)
    reads the sender's term from the corrupt run and every other writer's term held at its
    clean value; everything downstream of the receivers runs on, carrying the change. Returns
    the metric (B,) clean, corrupt and path-patched, and the share of the clean - corrupt
    change the path carries: (M(path) - M(clean)) / (M(corrupt) - M(clean))."""
    g = circ.graph
    w = g.node(sender)
    rs = [g.node(r) for r in receivers]
    if w.role != "writer" or any(r.role != "reader" for r in rs):
        raise InterventionError("path patching runs from a writer (embed, a head, a "
                                "feed-forward) into readers (q/k/v inputs, mlp_in, readout)")  # fmt: skip
    edges = Edges(g, batch.lengths)
    patched = torch.zeros(1, edges.count, dtype=torch.bool)
    frozen = torch.zeros(1, edges.count, dtype=torch.bool)
    pairs = edges.edge_pairs()
    for r in rs:
        if w not in g.upstream(r):
            raise InterventionError(f"{short(w)} does not write into {short(r)}'s stream before it")
        for u, (ww, rr) in enumerate(pairs):
            if rr == r:
                (patched if ww == w else frozen)[0, u] = True
    clean = circ.record(batch.clean, batch, metric)
    corrupt = circ.record(batch.corrupt, batch, metric)
    m = circ.mixed(batch, batch.clean, corrupt, patched, edges, metric, frozen=frozen,
                   base=clean)[0]  # fmt: skip
    gap = corrupt.metric - clean.metric
    return {"sender": short(w), "receivers": [short(r) for r in rs], "clean": clean.metric,
            "corrupt": corrupt.metric, "patched": m,
            "share": float((m - clean.metric).mean() / gap.mean())}  # fmt: skip
