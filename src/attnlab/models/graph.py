"""A model's residual graph: the nodes that write to each residual stream, the nodes that read
it, and the edges between them, read from the blocks' declared residual steps
(``attnlab.blocks.Residual``) and the model's stacks (``attnlab.models.declare``).

Writers add a vector (C,) per position to one stream (``stack``):
    {s}embed                    the embeddings (tokens, positions, ...): the stream entering
                                block 0, after whatever norm the model puts on it
    {s}blocks.{i}.attn.head{h}  one head of self-attention: z_h W_O^h, its slice of the output
                                projection (the projection's bias is a constant, not a head's),
                                through the step's output norm, frozen, and its residual scale
    {s}blocks.{i}.cross.head{h} one head of cross-attention, the same, into the decoder stream
    {s}blocks.{i}.mlp_out       a feed-forward network's output (after its output norm, scaled)
Readers read one stream, before the norm the step puts in front of them:
    {s}blocks.{i}.attn.head{h}.q      a head's query input
    {s}blocks.{i}.attn.head{j}.k, .v  key and value inputs, one per K/V head (``kv{j}`` where
                                      K/V heads are shared, grouped-query: ``heads`` are the query
                                      heads that read it)
    {s}blocks.{i}.cross.head{h}.q     cross-attention's query (the decoder's stream); its keys
                                      and values read the memory stack's final stream through
                                      that stack's final norm (the encoder's output)
    {s}blocks.{i}.mlp_in              a feed-forward network's input
    {s}readout                        the final norm and the head (the logits)
with {s} the stack's prefix ("encoder.", "decoder.", "" for a single stack).

An edge (writer, reader) exists when the writer is upstream of the reader in the stream the
reader reads: every writer of that stream at an earlier step (``Node.at``). A parallel block's
feed-forward reads the block's input, so its own block's heads do not reach it; an encoder's
writers reach a decoder only through cross-attention's key and value readers.

From a recording (``attnlab.hooks.record``) of a forward pass:
    graph.output(cache, writer)         what the writer adds to its stream (B, T, C)
    graph.input(cache, reader)          the stream the reader reads, before its norm (B, T, C)
    graph.contributions(cache, reader)  the terms whose sum is that input: each upstream
                                        writer's output, as it arrives (through any post-norm
                                        block's norms, their scales frozen at this input), and
                                        the constants (biases of projections and norms)
``walk`` is the decomposition these rest on (and direct logit attribution too): it carries
named parts of a stream through a stack's residual steps and checks their sum against every
recorded point of the stream. ``Walker`` is the same carried step by step, as far as asked:
the terms at each reader in turn, each step computed once, from a recording that may still be
filling (a forward pass under way).

Where a reader's own input passes (``graph.site(reader)``): a head's query, key or value input
is its copy in ``attnlab.attention.per_head_inputs`` (``{path}.q_in``, ``k_in``, ``v_in`` at
the head's index), after the reader's norm; a feed-forward's is its block's ``mlp_in``, after
the norm; the readout's is its source, the final stream, which nothing else reads (the model's
final norm follows). An edit there changes what that reader reads and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor, nn

from attnlab.blocks import Residual
from attnlab.norms import RMSNorm

# ---------------------------------------------------------------------------------------------
# The nodes and the graph
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """A writer or a reader of one residual stream.

    ``kind``: embed, head or mlp (writers); q, k, v, mlp or readout (readers). ``stack`` is the
    stream it writes or reads; ``at`` where in that stream ((layer, step): block ``layer``'s
    residual step ``step``; the embeddings (-1, 0); a reader of the final stream (n_layer, 0)).
    ``path`` is the module (``blocks.1.attn``), ``head`` the head (a K/V head for k and v),
    ``heads`` the query heads a K/V reader serves. ``source`` (readers) is the recorded point
    of the stream it reads, and ``norm`` the module path of the norm between them ("" where
    none)."""

    name: str
    role: str  # writer | reader
    kind: str
    stack: str
    at: tuple[int, int]
    path: str = ""
    sublayer: str | None = None  # attn | cross | mlp
    head: int | None = None
    heads: tuple[int, ...] = ()
    source: str = ""
    norm: str = ""

    @property
    def layer(self) -> int:
        return self.at[0]


@dataclass
class ResidualGraph:
    """The writers and readers of every residual stream of ``model``, in forward order, and the
    edges between them (see the module doc)."""

    model: nn.Module = field(repr=False)
    writers: tuple[Node, ...]
    readers: tuple[Node, ...]

    @property
    def stacks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n.stack for n in self.writers))

    def node(self, name: str) -> Node:
        for n in (*self.writers, *self.readers):
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r} in the residual graph")

    def upstream(self, reader: Node) -> list[Node]:
        """The writers with an edge into ``reader``: those of its stream before it."""
        return [w for w in self.writers if w.stack == reader.stack and w.at < reader.at]

    def edges(self, stack: str | None = None) -> list[tuple[Node, Node]]:
        """Every (writer, reader) edge, by reader in forward order (of one stream: ``stack``)."""
        return [(w, r) for r in self.readers if stack is None or r.stack == stack
                for w in self.upstream(r)]  # fmt: skip

    # -- values, from a recording --------------------------------------------------------------

    def site(self, reader: Node) -> Site:
        """Where ``reader``'s own input passes in a forward pass (see the module doc)."""
        if reader.kind in ("q", "k", "v"):
            return Site(f"{reader.path}.{reader.kind}_in", reader.head, True)
        if reader.kind == "mlp":
            return Site(reader.name, None, True)  # the block's mlp_in: the reader's own name
        return Site(reader.source, None, False)

    def recorded(self) -> list[str]:
        """The hooks to record for ``output``, ``input``, ``contributions`` and a ``Walker``
        to read every stream: each stack's input, what each step's writers write (each head's
        z, the feed-forward's output, the outputs an output norm reads, the sums a norm on the
        stream reads), and every reader's source. None of them makes attention record its
        weights (which would move it off the fused path)."""
        names = []
        for stack in self.stacks:
            root = _root(stack)
            names.append(root + "0.resid_pre")
            for i, block in enumerate(self.model.stack_blocks(stack)):
                for step in block.residual:
                    P = f"{root}{i}."
                    if step.sublayer == "mlp":
                        names.append(P + ("mlp_post" if step.post else "mlp_out"))
                    else:
                        names.append(f"{P}{step.sublayer}.z")
                        names += [P + step.output] if step.post else []
                    names += [f"{P}{step.sublayer}_sum"] if step.after else []
        names += [r.source for r in self.readers]
        return list(dict.fromkeys(names))

    def joins(self, writer: Node) -> tuple[str, float]:
        """Where ``writer``'s output joins its stream: (the hook holding what its step adds
        before the scale, the scale). A head's is the sum of its step's heads' outputs and the
        bias (the attention's ``out``, or its output norm's result); the embeddings' is the
        stream entering block 0 (scale 1). The gradient of anything downstream with respect to
        that hook, divided by the scale, is its gradient with respect to the writer's output."""
        if writer.kind == "embed":
            return _root(writer.stack) + "0.resid_pre", 1.0
        i, k = writer.at
        step = self.model.stack_blocks(writer.stack)[i].residual[k]
        P = f"{_root(writer.stack)}{i}."
        hook = f"{P}{step.sublayer}_post" if step.post else P + step.output
        return hook, step.scale

    def additive(self, stack: str) -> bool:
        """True when nothing but sums lies on ``stack`` after its writers: no norm on the
        stream (post-norm blocks put one after every step), so a writer's output reaches every
        reader downstream unchanged and a change in it moves each reader's input alike."""
        return not any(s.after for b in self.model.stack_blocks(stack) for s in b.residual)

    def input(self, cache: dict, reader: Node) -> Tensor:
        """The stream ``reader`` reads (B, T, C), before its norm."""
        return cache[reader.source]

    def output(self, cache: dict, writer: Node) -> Tensor:
        """What ``writer`` adds to its stream (B, T, C), as the forward pass added it (a head
        through its step's output norm with the norm's scale frozen at this input)."""
        first = cache[_root(writer.stack) + "0.resid_pre"]
        if writer.kind == "embed":
            return first
        parts = Parts(first.dtype)
        _step_parts(self.model, writer.stack, *writer.at, parts, _reading(cache, None))
        return parts.v[writer.name]

    def contributions(self, cache: dict, reader: Node, select=None) -> dict[str, Tensor]:
        """The terms whose sum is ``reader``'s input, in float64: {writer name: its output as
        it arrives at the reader} for every upstream writer, and {bias name: a constant} for the
        biases on the way. ``select`` picks rows of every (B, T, ...) tensor (default: all)."""
        return Walker(self.model, reader.stack, cache, select=select).to(reader.at)


@dataclass(frozen=True)
class Site:
    """Where a reader's own input passes: hook ``hook`` (at index ``index`` of its dim 1, a
    head's, where not None), after the reader's norm (``normed``) or before it (the readout,
    whose norm the model applies after)."""

    hook: str
    index: int | None
    normed: bool


def _root(stack: str, leaf: str = "") -> str:
    """ "blocks." (single stack) or "encoder.blocks." ...; with ``leaf``: "encoder.embed"."""
    if leaf:
        return f"{stack}.{leaf}" if stack else leaf
    return f"{stack}.blocks." if stack else "blocks."


def residual_graph(model: nn.Module) -> ResidualGraph:
    """The residual graph of a model built from ``attnlab.blocks.Block`` stacks (see the
    module doc), read from its declaration: ``stacks``, ``stack_blocks``, ``output_stack``,
    ``memory_stack`` and each stack's ``final_norm``."""
    writers, readers = [], []
    for stack in model.stacks:
        blocks = model.stack_blocks(stack)
        L, root = len(blocks), _root(stack)
        writers.append(Node(_root(stack, "embed"), "writer", "embed", stack, (-1, 0)))
        for i, block in enumerate(blocks):
            for k, step in enumerate(block.residual):
                P = f"{root}{i}."
                path = P + step.sublayer
                # what the step reads: the stream after the step before it, or the block's input
                first = k == 0 or step.reads == "block"
                source = P + ("resid_pre" if first else block.residual[k - 1].point)
                norm = P + step.norm if step.norm else ""
                at = (i, 0 if step.reads == "block" else k)
                if step.sublayer == "mlp":
                    readers.append(Node(P + "mlp_in", "reader", "mlp", stack, at, path, "mlp",
                                        source=source, norm=norm))  # fmt: skip
                    writers.append(Node(P + "mlp_out", "writer", "mlp", stack, (i, k), path, "mlp"))
                    continue
                attn = block.get_submodule(step.sublayer)
                H, G = attn.n_heads, attn.n_kv_heads
                g = H // G
                readers += [Node(f"{path}.head{h}.q", "reader", "q", stack, at, path,
                                 step.sublayer, h, (h,), source, norm) for h in range(H)]  # fmt: skip
                kv_stack, kv_at, kv_source, kv_norm = stack, at, source, norm
                if step.sublayer == "cross":  # keys and values: the memory stack's output
                    kv_stack = model.memory_stack
                    n = len(model.stack_blocks(kv_stack))
                    kv_at = (n, 0)
                    kv_source = f"{_root(kv_stack)}{n - 1}.resid_post"
                    kv_norm = _final_norm(model, kv_stack)
                for j in range(G):
                    label = f"head{j}" if g == 1 else f"kv{j}"
                    for kind in ("k", "v"):
                        readers.append(Node(f"{path}.{label}.{kind}", "reader", kind, kv_stack,
                                            kv_at, path, step.sublayer, j,
                                            tuple(range(j * g, j * g + g)), kv_source, kv_norm))  # fmt: skip
                writers += [Node(f"{path}.head{h}", "writer", "head", stack, (i, k), path,
                                 step.sublayer, h, (h,)) for h in range(H)]  # fmt: skip
        if stack == model.output_stack:
            readers.append(Node(_root(stack, "readout"), "reader", "readout", stack, (L, 0),
                                source=f"{root}{L - 1}.resid_post",
                                norm=_final_norm(model, stack)))  # fmt: skip
    return ResidualGraph(model, tuple(writers), tuple(readers))


def _final_norm(model, stack: str) -> str:
    """The path of the norm on ``stack``'s final stream, "" where there is none."""
    norm = model.final_norm(stack)
    return "" if isinstance(norm, nn.Identity) else _root(stack, "ln_f")


# ---------------------------------------------------------------------------------------------
# The decomposition: named parts of a stream, carried through the residual steps
# ---------------------------------------------------------------------------------------------


class Parts:
    """Named vectors (..., C) whose sum is a residual stream: writers' outputs and constants."""

    def __init__(self, dtype: torch.dtype = torch.float64):
        self.v: dict[str, Tensor] = {}
        self.dtype = dtype

    def add(self, name: str, x: Tensor) -> None:
        self.v[name] = x.detach().to(self.dtype)

    def total(self) -> Tensor:
        return sum(self.v.values())

    def map(self, fn) -> None:
        self.v = {k: fn(x) for k, x in self.v.items()}

    def error(self, recorded: Tensor) -> float:
        """How far the parts' sum is from ``recorded``, relative to its largest magnitude + 1."""
        err = float((self.total() - recorded.to(self.dtype)).abs().max())
        return err / (float(recorded.abs().max()) + 1.0)

    def freeze_norm(self, ln: nn.Module, u: Tensor, bias_name: str) -> bool:
        """Apply the norm ``ln`` to the parts with its scale frozen at input ``u`` (the sum it
        normalises): a LayerNorm becomes gamma (x - mean(x)) / sigma(u) on each part, plus its
        bias as a part; an RMSNorm (offset + w) / rms(u) times each part. False for a module
        that is no norm (an Identity): nothing is done."""
        if isinstance(ln, RMSNorm):
            self.map(lambda x: x * rms_gain(ln, u))
            return True
        if not isinstance(ln, nn.LayerNorm):
            return False
        u = u.to(self.dtype)
        sigma = torch.sqrt(u.var(-1, unbiased=False, keepdim=True) + ln.eps)
        gamma = ln.weight.detach().to(self.dtype) if ln.weight is not None else 1.0
        self.map(lambda x: gamma * (x - x.mean(-1, keepdim=True)) / sigma)
        if ln.bias is not None:
            self.add(bias_name, ln.bias)
        return True


def rms_gain(ln: RMSNorm, u: Tensor) -> Tensor:
    """(..., C) what an RMSNorm multiplies its input by, frozen at input ``u``: (offset + w) /
    rms(u), in float64."""
    u = u.double()
    return (ln.offset + ln.weight.detach().double()) / torch.sqrt(
        u.pow(2).mean(-1, keepdim=True) + ln.eps
    )


def norm_gain(ln: nn.Module | None, C: int) -> Tensor:
    """(C,) the per-channel gain a norm multiplies by, in float64: gamma for a LayerNorm,
    offset + w for an RMSNorm, ones for no norm (None or a module with no weight)."""
    w = None if ln is None else getattr(ln, "weight", None)
    g = torch.ones(C, dtype=torch.float64) if w is None else w.detach().double()
    return g + (float(ln.offset) if isinstance(ln, RMSNorm) else 0.0)


@dataclass
class LowRank:
    """A C x C map held as its factors, M = left @ right (left (C, d), right (d, C), float64):
    a head's QK or OV map has rank at most its head width d, so products and Frobenius norms
    of these maps are taken in d x d (``product_norm``): at C = 896 and d = 64 that is some
    3,000 times less work than multiplying the C x C maps (Qwen2.5-0.5B's 24 x 14 heads' every
    pair took minutes)."""

    left: Tensor  # (C, d)
    right: Tensor  # (d, C)

    def __post_init__(self) -> None:
        self.gram_left = self.left.T @ self.left  # (d, d): left^T left
        self.gram_right = self.right @ self.right.T  # (d, d): right right^T

    @cached_property
    def T(self) -> LowRank:  # noqa: N802  (M^T = right^T left^T, its grams swapped)
        t = LowRank.__new__(LowRank)
        t.left, t.right = self.right.T, self.left.T
        t.gram_left, t.gram_right = self.gram_right, self.gram_left
        return t

    def full(self) -> Tensor:
        """(C, C) M itself."""
        return self.left @ self.right

    def norm(self) -> float:
        """|M|_F, from ||L R||_F^2 = tr(L^T L R R^T)."""
        return float((self.gram_left * self.gram_right).sum().clamp_min(0.0).sqrt())


def product_norm(a: LowRank, b: LowRank) -> float:
    """|A B|_F of two factored maps, in the factors' widths: A B = L_a (R_a L_b) R_b, and
    ||L X R||_F^2 = tr(X^T (L^T L) X (R R^T)) with X = R_a L_b (d_a, d_b)."""
    x = a.right @ b.left
    return float((a.gram_left @ x @ b.gram_right * x).sum().clamp_min(0.0).sqrt())


def composition(kind: str, writer_ov: LowRank, reader_qk: LowRank, reader_ov: LowRank) -> float:
    """Elhage et al.'s composition of an earlier head's output (its OV, ``writer_ov``) into a
    later head, |M OV_A|_F / (|M|_F |OV_A|_F): ``kind`` "q" with M = QK_B^T (read by B's
    queries), "k" with M = QK_B (by its keys), "v" with M = OV_B (by its values); 0 for a
    head whose map is zero."""
    n = reader_ov if kind == "v" else reader_qk
    m = reader_qk.T if kind == "q" else n
    return product_norm(m, writer_ov) / max(n.norm() * writer_ov.norm(), 1e-12)


def head_factors(attn: nn.Module, h: int, gain: Tensor | None = None) -> tuple[LowRank, LowRank]:
    """Head ``h`` of a self-attention module as its QK and OV maps on the stream, factored
    (float64), in the column-vector convention: QK = (W_Q^h diag(g))^T (W_K^j diag(g)), so a
    query x_q and a key x_k score x_q^T QK x_k; OV = W_O^h (W_V^j diag(g)), what the head writes
    for a value x. ``g`` is the gain of the norm before the attention (``norm_gain``; its
    centring and 1/sigma left out), j the K/V head that head h reads (grouped-query); biases
    and rotary positions are left out (a rotary head's QK at offset 0)."""
    H, dk, dv = attn.n_heads, attn.d_k, attn.d_v
    j = h // (H // attn.n_kv_heads)
    wq = attn.q_proj.weight.detach()[h * dk : (h + 1) * dk].double()  # (dk, C)
    wk = attn.k_proj.weight.detach()[j * dk : (j + 1) * dk].double()  # (dk, C)
    wv = attn.v_proj.weight.detach()[j * dv : (j + 1) * dv].double()  # (dv, C)
    wo = attn.out_proj.weight.detach()[:, h * dv : (h + 1) * dv].double()  # (C, dv)
    if gain is not None:
        wq, wk, wv = wq * gain, wk * gain, wv * gain
    return LowRank(wq.T, wk), LowRank(wo, wv)


def _rows(x: Tensor, select) -> Tensor:
    return x if select is None else select(x)


def _reading(cache: dict, select) -> Callable[[str], Tensor]:
    """``at(name)``: a recorded tensor, rows first ((B, T, ...); a head output z (B, H, T, d_v)
    as (B, T, H, d_v)), rows picked by ``select``."""

    def at(name: str) -> Tensor:
        x = cache[name]
        return _rows(x.transpose(1, 2) if name.endswith(".z") else x, select)

    return at


def _head_out(W_h: Tensor, z_h: Tensor) -> Tensor:
    """W_O^h z_h: W_h (C, d_v), z_h (..., d_v) -> (..., C)."""
    return W_h @ z_h if z_h.dim() == 1 else z_h @ W_h.T


def _step_parts(model, stack: str, i: int, k: int, parts: Parts, at: Callable) -> Residual:
    """Add to ``parts`` what residual step ``k`` of block ``i`` of ``stack`` writes: each head's
    output and the projection's bias (attention), or the feed-forward's output, through the
    step's output norm (its scale frozen at the sublayer's output) and scaled. ``at(name)``
    reads a recorded tensor, rows selected; z as (..., H, d_v)."""
    block = model.stack_blocks(stack)[i]
    step = block.residual[k]
    P = f"{_root(stack)}{i}."
    new = Parts(parts.dtype)
    if step.sublayer == "mlp":  # one writer: what the block added, as recorded
        new.add(P + "mlp_out", at(P + ("mlp_post" if step.post else "mlp_out")))
    else:
        attn = block.get_submodule(step.sublayer)
        z = at(f"{P}{step.sublayer}.z").to(parts.dtype)  # (..., H, d_v)
        H, dv = z.shape[-2:]
        W = attn.out_proj.weight.detach().to(parts.dtype).view(-1, H, dv)  # (C, H, d_v): W_O^h
        for h in range(H):
            new.add(f"{P}{step.sublayer}.head{h}", _head_out(W[:, h], z[..., h, :]))
        if attn.out_proj.bias is not None:
            new.add(f"{P}{step.sublayer}.bias", attn.out_proj.bias)
        if step.post:  # heads share the norm on the attention's output, its scale frozen there
            new.freeze_norm(getattr(block, step.post), at(P + step.output), f"{P}{step.post}.bias")
    if step.scale != 1:
        new.map(lambda x: step.scale * x)
    parts.v.update(new.v)
    return step


def walk(model, stack: str, parts: Parts, cache: dict, select=None, tol: float | None = None,
         upto: tuple[int, int] | None = None, frozen: dict | None = None) -> float:  # fmt: skip
    """Carry ``parts``, whose sum is the stream entering block 0 of ``stack``, through its
    blocks' residual steps: each step adds what it writes (``_step_parts``), and a post-norm
    step's norm maps every part, its scale frozen at the recorded sum. At every recorded point
    of the stream the parts' sum is compared with the recording; returns the largest relative
    difference (``tol``: a RuntimeError past it). Stops before step ``upto`` ((layer, step)),
    or after the last block. ``frozen`` collects the norms frozen: {"after": {names}, "post":
    {sublayer: name}}. ``select`` picks rows of every (B, T, ...) tensor."""
    root, worst, at = _root(stack), 0.0, _reading(cache, select)

    def check(name: str) -> None:
        nonlocal worst
        err = parts.error(at(name))
        worst = max(worst, err)
        if tol is not None and err > tol:
            raise RuntimeError(f"lost track of the residual stream at {name}: the parts differ "
                               f"from the recorded value by {err:.2e} (relative)")  # fmt: skip

    for i, block in enumerate(model.stack_blocks(stack)):
        P = f"{root}{i}."
        check(P + "resid_pre")
        for k, step in enumerate(block.residual):
            if upto is not None and (i, k) >= upto:
                return worst
            _advance(model, stack, i, k, parts, at, frozen)
            check(P + (step.point or "resid_post"))
        check(P + "resid_post")
    return worst


def _advance(model, stack: str, i: int, k: int, parts: Parts, at: Callable,
             frozen: dict | None = None) -> None:  # fmt: skip
    """Carry ``parts`` over residual step ``k`` of block ``i``: add what it writes, then map
    every part through the norm on the sum where the step has one (its scale frozen at the
    recorded sum). ``frozen`` collects what was frozen (see ``walk``)."""
    block = model.stack_blocks(stack)[i]
    step = _step_parts(model, stack, i, k, parts, at)
    if step.post and frozen is not None:
        frozen.setdefault("post", {})[step.sublayer] = step.post
    if step.after:
        P = f"{_root(stack)}{i}."
        norm = getattr(block, step.after)
        done = parts.freeze_norm(norm, at(f"{P}{step.sublayer}_sum"), f"{P}{step.after}.bias")
        if done and frozen is not None:
            frozen.setdefault("after", {})[step.after] = type(norm).__name__


class Walker:
    """The named parts of one stream (``stack``) carried through its residual steps as far as
    asked: ``to(at)`` returns {writer or bias name: term} whose sum is the stream a reader at
    ``at`` reads (what ``ResidualGraph.contributions`` returns), carrying the parts on from
    where the last call stopped, so that walking to every reader in turn computes each step
    once. It reads ``cache`` only when it needs a step's values: a recording still filling (a
    forward pass under way, stopped at a reader) serves for every reader it has reached.
    ``dtype`` the parts' (float64 by default); ``select`` picks rows of every (B, T, ...)
    tensor."""

    def __init__(self, model, stack: str, cache: dict, dtype: torch.dtype = torch.float64,
                 select=None):  # fmt: skip
        self.model, self.stack, self.cache, self.select = model, stack, cache, select
        self.steps = [(i, k) for i, b in enumerate(model.stack_blocks(stack))
                      for k in range(len(b.residual))]  # fmt: skip
        self.parts, self.done = Parts(dtype), 0

    def to(self, at: tuple[int, int]) -> dict[str, Tensor]:
        """The parts before step ``at`` ((layer, step); (n_layer, 0): the final stream). A
        step already carried over is not undone: ``at`` never goes back."""
        if not self.parts.v:
            first = self.cache[_root(self.stack) + "0.resid_pre"]
            self.parts.add(_root(self.stack, "embed"), _rows(first, self.select))
        if self.done and self.steps[self.done - 1] >= at:
            raise ValueError(f"the walk is past {at}: walk to readers in forward order")
        read = _reading(self.cache, self.select)
        while self.done < len(self.steps) and self.steps[self.done] < at:
            _advance(self.model, self.stack, *self.steps[self.done], self.parts, read)
            self.done += 1
        return dict(self.parts.v)
