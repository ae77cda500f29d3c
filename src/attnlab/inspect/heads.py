"""What each attention head does, as scores in [0, 1]: the head taxonomy of Elhage et al. (2021)
and Olsson et al. (2022), measured on probe inputs.

A score is the mean attention a head puts on the key position(s) that define it, over the query
rows where those positions exist. For a map A (B, H, T, T) over token ids x (B, T):

    previous-token   A[t, t-1]                                  rows t >= 1
    duplicate-token  sum of A[t, j] over j < t with x[j] = x[t]  rows with an earlier duplicate
    induction        sum of A[t, j] over j < t with x[j-1] = x[t]: the token AFTER an earlier
                     occurrence of the current token (the one an induction head copies)
    first-token      A[t, 0]: the first position as an attention sink       rows t >= 1
    self             A[t, t]                                    rows t >= 1 (causal), all (not)
    entropy          H(A[t, :]) / ln(keys t can see): 0 = one key, 1 = uniform over them

(Row 0 of a causal map sees only key 0 and is left out of every score but none of these needs
it.) Duplicate-token and induction need token ids; on images they are None.

The probes: ``repeated_tokens`` draws random token sequences r (no token twice, where the
vocabulary allows) and feeds r r (each repeated once), where a previous-token head, a
duplicate-token head and an induction head each have one right answer at every position of
the second half; a held-out sample of the run's own data
shows what the heads do on real input. A head is named after the score that is furthest over
its threshold (``THRESHOLDS``), on the repeated tokens.

Used by training snapshots (``attnlab.inspect.snapshots``), ``attnlab heads`` and
``attnlab timeline``; a head named here is ablated with ``attnlab.interventions.ablate``.
``composition_scores`` gives Elhage et al.'s Q-, K- and V-composition between the heads of
consecutive layers, read from the weights alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab import hooks
from attnlab.inspect.recording import InspectError, max_positions, output_tensor
from attnlab.metrics import half_losses
from attnlab.modes import evaluating
from attnlab.render.display import Result

SCORES = ("previous-token", "duplicate-token", "induction", "first-token", "self", "entropy")
# a head is named after a score at or over its threshold (the one furthest over it)
THRESHOLDS = {"induction": 0.4, "previous-token": 0.4, "duplicate-token": 0.4,
              "first-token": 0.5, "self": 0.5}  # fmt: skip
KIND_NAMES = {"induction": "induction", "previous-token": "previous-token",
              "duplicate-token": "duplicate-token", "first-token": "sink", "self": "self"}  # fmt: skip
PROBE_HALF = 24  # tokens in each half of a repeated probe (at most; block_size / 2 if smaller)
SELF_MAPS = "attn.weights"  # self-attention maps end in this (see attnlab.inspect.recording)


# ---------------------------------------------------------------------------------------------
# Scores of one attention map
# ---------------------------------------------------------------------------------------------


def _masked_mean(per_row: Tensor, rows: Tensor) -> Tensor:
    """Mean over batch and query rows where ``rows`` (B, T) holds: (B, H, T) -> (H,).
    A head with no such row scores NaN (the caller turns it into None)."""
    w = rows.to(per_row.dtype)[:, None, :]  # (B, 1, T)
    n = w.sum()
    if n == 0:
        return torch.full(per_row.shape[1:2], float("nan"))
    return (per_row * w).sum(dim=(0, 2)) / n


def head_scores(weights: Tensor, ids: Tensor | None = None, causal: bool = True) -> dict:
    """Every score of every head of one self-attention map.

    weights (B, H, T, T): each query row a distribution over the keys it may see. ids (B, T):
    the token ids (None: images, patches; duplicate-token and induction are then None).
    Returns {score name: a (H,) float tensor, or None where the score is not defined}.
    """
    B, H, T, S = weights.shape
    if T != S:
        raise ValueError(f"head scores need a self-attention map (T == S), got {T} x {S}")
    w = weights.float()
    t = torch.arange(T)
    rows = torch.ones(B, T, dtype=torch.bool)
    if causal:
        rows[:, 0] = False  # query 0 sees only key 0: it says nothing about a head
    after_first = rows.clone()
    after_first[:, 0] = False
    out: dict[str, Tensor | None] = {}
    prev = torch.zeros(B, H, T)
    prev[:, :, 1:] = w[:, :, t[1:], t[1:] - 1]  # (B, H, T-1) A[t, t-1]
    out["previous-token"] = _masked_mean(prev, after_first)
    if ids is None:
        out["duplicate-token"] = out["induction"] = None
    else:
        ids = ids.to(w.device)
        earlier = t[None, :] < t[:, None]  # (T, S) key j before query t
        same = ids[:, :, None] == ids[:, None, :]  # (B, T, S) x[t] == x[j]
        dup = same & earlier  # (B, T, S)
        out["duplicate-token"] = _masked_mean((w * dup[:, None]).sum(-1), dup.any(-1))
        # key j is induction's target for query t when x[j-1] == x[t] and j - 1 < t, j != t
        ind = torch.zeros_like(dup)
        ind[:, :, 1:] = same[:, :, :-1] & earlier[None, :, :-1]  # (B, T, S) shifted one key on
        ind &= t[None, :, None] != t[None, None, :]  # not the query itself
        out["induction"] = _masked_mean((w * ind[:, None]).sum(-1), ind.any(-1))
    out["first-token"] = _masked_mean(w[:, :, :, 0], after_first)
    out["self"] = _masked_mean(w[:, :, t, t], rows)
    visible = (t + 1).float() if causal else torch.full((T,), float(S))  # (T,) keys each row sees
    ent = -(w * torch.log(w.clamp_min(1e-12))).sum(-1)  # (B, H, T) nats
    norm = torch.where(visible > 1, ent / torch.log(visible.clamp_min(2.0)), torch.zeros_like(ent))
    out["entropy"] = _masked_mean(norm, (visible > 1)[None, :].expand(B, T))
    return out


def kind_of(scores: dict[str, float | None]) -> str | None:
    """The name of a head: the score furthest over its threshold, or None."""
    best, best_ratio = None, 1.0
    for name, threshold in THRESHOLDS.items():
        v = scores.get(name)
        if v is not None and v >= threshold and v / threshold >= best_ratio:
            best, best_ratio = KIND_NAMES[name], v / threshold
    return best


# ---------------------------------------------------------------------------------------------
# Probes: what a model is run on to score its heads
# ---------------------------------------------------------------------------------------------


def vocab_size(model: nn.Module) -> int | None:
    """The number of token ids the model's probe forward reads (None: it reads no tokens)."""
    if model.reads == "image":
        return None  # it is probed with other inputs (a ViT: images)
    cfg = getattr(model, "config", None)
    for key in ("tgt_vocab_size", "vocab_size"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def probe_forward(model: nn.Module) -> Callable[[Tensor], Tensor]:
    """How a probe input is run through ``model``: its ``conformance_forward`` (an
    encoder-decoder: the decoder over a fixed source) or ``model(x)``; returns the main output."""
    custom = getattr(model, "conformance_forward", None)
    if custom is not None:
        return custom
    return lambda x: output_tensor(model(x))


def repeated_tokens(model: nn.Module, n: int = 16, seed: int = 0, half: int | None = None):
    """``n`` random sequences r r: (n, 2 * half) token ids from the model's vocabulary (its
    pad id left out), the tokens of r all different when the vocabulary is large enough, so
    that every position of the second half has one previous token, one earlier duplicate and
    one token after it; None for a model that reads no token ids."""
    V = vocab_size(model)
    if V is None or V < 2:
        return None
    limit = max_positions(model) or 2 * PROBE_HALF
    cfg = getattr(model, "config", None)
    if model.reads == "source":  # an encoder-decoder's probe is its decoder's input
        limit = getattr(cfg, "max_len", limit)
    half = min(half or PROBE_HALF, limit // 2)
    if half < 2:
        return None
    g = torch.Generator().manual_seed(seed)
    pad = getattr(model, "pad_id", None)
    ids = torch.tensor([i for i in range(V) if i != pad])  # (V',) the tokens a probe may hold
    if half <= len(ids):  # each row: a random arrangement of the vocabulary, cut to half
        r = ids[torch.rand(n, len(ids), generator=g).argsort(dim=1)[:, :half]]
    else:
        r = ids[torch.randint(0, len(ids), (n, half), generator=g)]
    return torch.cat([r, r], dim=1)  # (n, 2 * half)


def self_attention_maps(cache: dict, T: int) -> list[str]:
    """Names of the self-attention maps over the probe's own T positions, in recording order."""
    return [k for k, v in cache.items() if k.endswith(SELF_MAPS) and v.dim() == 4
            and v.size(-1) == T and v.size(-2) == T]  # fmt: skip


@dataclass
class ProbeResult:
    """One probe through a model: its self-attention maps, their scores, and (for a language
    model on repeated tokens) the loss on each half."""

    maps: dict[str, Tensor]  # map name -> weights (B, H, T, T)
    scores: dict[str, dict[str, Tensor | None]]  # map name -> score name -> (H,)
    loss_first_half: float | None = None
    loss_repeated_half: float | None = None


@torch.no_grad()
def run_probe(model: nn.Module, x: Tensor, ids: bool = True, repeated: bool = False) -> ProbeResult:
    """Record ``model``'s attention on ``x`` (token ids (B, T) or images) and score every
    self-attention head. ``ids``: x holds token ids. ``repeated``: x is r r, so that the
    next-token loss of each half is measured (causal models whose output is (B, T, V))."""
    points = hooks.hook_points(model)
    names = [n for n in points if n.endswith(SELF_MAPS)]
    with evaluating(model), hooks.record(model, names=names) as cache:
        out = probe_forward(model)(x)
    T = x.size(1) if ids else None
    if T is None:  # images: every square map is over the patches
        maps = {k: v for k, v in cache.items() if v.dim() == 4 and v.size(-1) == v.size(-2)}
    else:
        maps = {k: cache[k] for k in self_attention_maps(cache, T)}
    causal = bool(getattr(model, "causal", False))
    scores = {k: head_scores(v, x if ids else None, causal) for k, v in maps.items()}
    result = ProbeResult(maps, scores)
    if repeated and ids and causal and out.dim() == 3 and out.size(1) == T:
        result.loss_first_half, result.loss_repeated_half = half_losses(out, x)
    return result


# ---------------------------------------------------------------------------------------------
# Composition between layers (Elhage et al. 2021), from the weights
# ---------------------------------------------------------------------------------------------


def head_matrices(attn: nn.Module, ln: nn.Module | None = None) -> list[dict[str, Tensor]]:
    """Per head h of a MultiHeadAttention, in the column-vector convention y = W x:
    W_QK = W_Q^T W_K (C, C), so a query x_q and a key x_k score x_q^T W_QK x_k, and
    W_OV = W_O W_V (C, C), what the head writes for a value x. The LayerNorm gain before the
    attention (``ln``) is folded into W_Q, W_K and W_V (its centring and scaling per token are
    not); biases are left out. With rotary positions this is W_QK at relative offset 0."""
    H, D, dv = attn.n_heads, attn.d_k, attn.d_v
    g = H // getattr(attn, "n_kv_heads", H)  # query heads per K/V head (grouped-query)
    gain = None
    if ln is not None and ln.weight is not None:  # Gemma's RMSNorm multiplies by (1 + w)
        gain = getattr(ln, "offset", 0.0) + ln.weight.detach().float()
    out = []
    for h in range(H):
        j = h // g  # the K/V head query head h reads
        wq = attn.q_proj.weight[h * D : (h + 1) * D].detach().float()  # (D, C)
        wk = attn.k_proj.weight[j * D : (j + 1) * D].detach().float()
        wv = attn.v_proj.weight[j * dv : (j + 1) * dv].detach().float()  # (d_v, C)
        wo = attn.out_proj.weight[:, h * attn.d_v : (h + 1) * attn.d_v].detach().float()  # (C, d_v)
        if gain is not None:
            wq, wk, wv = wq * gain, wk * gain, wv * gain
        out.append({"QK": wq.T @ wk, "OV": wo @ wv})  # (C, C) each
    return out


def composition(reader: dict[str, Tensor], writer: Tensor) -> dict[str, float]:
    """Elhage et al.'s composition of a later head (``reader``: its W_QK and W_OV) with an
    earlier head's W_OV (``writer``), each ||M W_OV|| / (||M|| ||W_OV||) in the Frobenius norm:
        Q: M = W_QK^T (the earlier head's output read by the queries)
        K: M = W_QK   (read by the keys: how an induction head finds the previous-token
                       head's output)
        V: M = W_OV   (read by the values)
    0 = the later head ignores what the earlier one writes; at most 1."""
    wn = writer.norm()

    def score(m: Tensor) -> float:
        return float((m @ writer).norm() / (m.norm() * wn).clamp_min(1e-12))

    return {"Q": score(reader["QK"].T), "K": score(reader["QK"]), "V": score(reader["OV"])}


def composition_scores(model: nn.Module) -> list[dict] | None:
    """Q/K/V composition of every head of layer l + 1 with every head of layer l, for a model
    with one stack of blocks (``model.blocks``: a GPT, an encoder, a ViT); None otherwise.
    Each row: {"writer": "0.1", "reader": "1.0", "Q": q, "K": k, "V": v}."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or len(blocks) < 2:
        return None
    mats = [head_matrices(b.attn, b.ln1 if getattr(b, "norm_first", True) else None)
            for b in blocks]  # fmt: skip
    rows = []
    for layer in range(1, len(mats)):
        for r, reader in enumerate(mats[layer]):
            for w, writer in enumerate(mats[layer - 1]):
                c = composition(reader, writer["OV"])
                rows.append({"writer": f"{layer - 1}.{w}", "reader": f"{layer}.{r}", **c})
    return rows


# ---------------------------------------------------------------------------------------------
# The report of `attnlab heads`
# ---------------------------------------------------------------------------------------------


def _floats(scores: dict[str, Tensor | None], h: int) -> dict[str, float | None]:
    out = {}
    for name in SCORES:
        v = scores.get(name)
        x = None if v is None else float(v[h])
        out[name] = None if x is None or math.isnan(x) else round(x, 4)
    return out


def head_label(map_name: str) -> tuple[str, int | None, str]:
    """``blocks.1.attn.weights`` -> ("", 1, "1"); ``decoder.blocks.0.attn.weights`` ->
    ("decoder", 0, "decoder.0"): the stack, the layer, and how --ablate names it."""
    parts = map_name.split(".")
    if "blocks" in parts:
        i = parts.index("blocks")
        stack, layer = ".".join(parts[:i]), int(parts[i + 1])
        return stack, layer, f"{stack}.{layer}" if stack else str(layer)
    stack = map_name[: -len(SELF_MAPS)].rstrip(".")
    return stack, None, stack


@dataclass
class HeadsReport(Result):
    """Every self-attention head with its scores on repeated random tokens (and on a held-out
    sample of the run's data), the kind it is named, and the composition between layers."""

    rows: list[dict]
    probe: str  # what the repeated probe was
    sample: str | None  # what the sample probe was (None: no data)
    loss_first_half: float | None = None
    loss_repeated_half: float | None = None
    composition: list[dict] | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "heads": self.rows,
            "probe": self.probe,
            "sample": self.sample,
            "loss_first_half": self.loss_first_half,
            "loss_repeated_half": self.loss_repeated_half,
            "composition": self.composition,
            "notes": self.notes,
        }

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        from attnlab.render.tables import FitTable

        t = FitTable(title=f"attention heads, scored on {self.probe}")
        t.add_column("head", justify="left")
        for name in SCORES:
            t.add_column(name.replace("-token", ""), justify="right")
        t.add_column("kind", justify="left")
        for r in self.rows:
            s = r["scores"]
            cells = ["-" if s[n] is None else f"{s[n]:.2f}" for n in SCORES]
            t.add_row(r["name"], *cells, r["kind"] or "", style="bold" if r["kind"] else None)
        parts = [t]
        if self.loss_first_half is not None:
            parts.append(Text(f"next-token loss on the first half {self.loss_first_half:.3f}, "
                              f"on the repeated half {self.loss_repeated_half:.3f} nats"))  # fmt: skip
        if any(r.get("sample_scores") for r in self.rows):
            s = FitTable(title=f"on {self.sample}")
            s.add_column("head", justify="left")
            for name in SCORES:
                s.add_column(name.replace("-token", ""), justify="right")
            for r in self.rows:
                v = r.get("sample_scores") or {}
                s.add_row(r["name"], *["-" if v.get(n) is None else f"{v[n]:.2f}" for n in SCORES])
            parts += [Text(""), s]
        if self.composition:
            top = sorted(self.composition, key=lambda c: -c["K"])[:8]
            c = FitTable(title="composition (Elhage et al.): strongest K-composition first")
            for col in ("earlier head", "later head", "Q", "K", "V"):
                c.add_column(col, justify="right")
            for row in top:
                c.add_row(row["writer"], row["reader"], f"{row['Q']:.3f}", f"{row['K']:.3f}",
                          f"{row['V']:.3f}")  # fmt: skip
            parts += [Text(""), c]
        parts += [Text(f"note: {n}", style="dim") for n in self.notes]
        return Group(*parts)


def score_heads(model: nn.Module, sample: Tensor | None = None, sample_ids: bool = True,
                n: int = 16, seed: int = 0, sample_name: str | None = None) -> HeadsReport:  # fmt: skip
    """Score every self-attention head of ``model`` on ``n`` repeated random-token sequences
    (and on ``sample``, held-out inputs of the run's data, when given)."""
    rep = repeated_tokens(model, n=n, seed=seed)
    probe = None if rep is None else run_probe(model, rep, ids=True, repeated=True)
    samp = None if sample is None else run_probe(model, sample, ids=sample_ids)
    source = probe if probe is not None else samp
    if source is None or not source.maps:
        raise InspectError(
            "this model has no self-attention heads to score (an LSTM's one attention reads the "
            "encoder from the decoder, or pools a classifier's states; previous-token and "
            "induction are defined for tokens attending to tokens)"
        )
    rows = []
    for name, weights in source.maps.items():
        stack, layer, label = head_label(name)
        for h in range(weights.size(1)):
            scores = _floats(source.scores[name], h)
            row = {"layer": layer, "head": h, "name": f"{label}.{h}", "scores": scores,
                   "kind": kind_of(scores)}  # fmt: skip
            if stack:
                row["stack"] = stack
            if probe is not None and samp is not None and name in samp.scores:
                row["sample_scores"] = _floats(samp.scores[name], h)
            rows.append(row)
    notes = []
    if probe is None:
        why = ("this model reads no token ids" if vocab_size(model) is None else
               f"its {max_positions(model)} positions hold no repeated sequence of 2 or more "
               "tokens")  # fmt: skip
        notes.append(f"{why}: scored on the sample only (no duplicate-token or induction "
                     "score)")  # fmt: skip
    if getattr(model, "config", None) is not None and getattr(model.config, "pos", "") == "rotary":
        notes.append("rotary positions: composition is measured at relative offset 0")
    described = (f"{rep.size(0)} random sequences of {rep.size(1) // 2} tokens, each repeated "
                 "once" if rep is not None else "the sample")  # fmt: skip
    return HeadsReport(
        rows, described,
        None if samp is None else (sample_name or f"{sample.size(0)} held-out sequences"),
        probe.loss_first_half if probe else None, probe.loss_repeated_half if probe else None,
        composition_scores(model), notes,
    )  # fmt: skip


def heads_of_run(run, n: int = 16, seed: int = 0) -> HeadsReport:
    """``score_heads`` on an opened run (``attnlab.load_run``): its model, and for the sample
    probe a few held-out inputs of the data it was trained on (when its task can rebuild them;
    an imported model has none)."""
    from attnlab.tasks import open_task

    model, run_dir = run.model, run.path
    sample = None
    notes = []
    if run.no_data_of_its_own is not None:  # its task's default data is not its own
        notes.append(f"no held-out sample (the run {run.no_data_of_its_own})")
    else:
        try:
            sample = open_task(run_dir, True, run.config, run.tokenizer).sample_inputs(4, 64)
        except Exception as e:  # no data to rebuild (a moved corpus): no sample
            notes.append(f"no held-out sample ({' '.join(str(e).split())[:120]})")
    if sample is None and repeated_tokens(model, n=1) is None:
        probe = getattr(model, "conformance_inputs", None)  # a model that reads no token ids
        if probe is not None:
            sample = probe(4, seed), False
            notes.append("scored on 4 random inputs of the model's shape")
    inputs, ids = sample if sample is not None else (None, True)
    report = score_heads(model, inputs, ids, n=n, seed=seed)
    report.notes += notes
    return report
