"""What each attention head does: ``attnlab heads`` and the timeline's report of the head
scores (``attnlab.training.probes``: the taxonomy of Elhage et al. 2021 and Olsson et al. 2022,
measured on probe inputs, with the definition of each score), and Elhage et al.'s composition
between heads read from the weights.

A head is named after the score that is furthest over its threshold (``THRESHOLDS``), on the
repeated tokens. Used by ``attnlab heads`` and ``attnlab timeline`` (the snapshots training
takes: ``attnlab.training.snapshots``); a head named here is ablated with
``attnlab.interventions.ablate``. ``composition_scores`` gives Elhage et al.'s Q-, K- and
V-composition between the heads of consecutive layers, read from the weights alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import Tensor, nn

from attnlab.attention import MultiHeadAttention
from attnlab.inspect.recording import InspectError
from attnlab.models.declare import max_positions
from attnlab.models.graph import LowRank, composition, head_factors, norm_gain
from attnlab.render.display import Result
from attnlab.training.probes import (
    KIND_NAMES,
    PROBE_HALF,
    SCORES,
    SELF_MAPS,
    THRESHOLDS,
    ProbeResult,
    head_scores,
    kind_of,
    repeated_tokens,
    run_probe,
    self_attention_maps,
)

__all__ = ["KIND_NAMES", "PROBE_HALF", "SCORES", "SELF_MAPS", "THRESHOLDS", "HeadsReport",
           "ProbeResult", "composition", "composition_scores", "head_label", "head_matrices",
           "head_scores", "heads_of_run", "kind_of", "repeated_tokens", "run_probe",
           "score_heads", "self_attention_maps"]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Composition between layers (Elhage et al. 2021), from the weights
# ---------------------------------------------------------------------------------------------


def head_matrices(attn: nn.Module, ln: nn.Module | None = None) -> list[dict[str, Tensor]]:
    """Per head h of a MultiHeadAttention, in the column-vector convention y = W x:
    W_QK = W_Q^T W_K (C, C), so a query x_q and a key x_k score x_q^T W_QK x_k, and
    W_OV = W_O W_V (C, C), what the head writes for a value x (``head_factors``, multiplied
    out). The norm's gain before the attention (``ln``) is folded into W_Q, W_K and W_V (its
    centring and scaling per token are not); biases are left out. With rotary positions this
    is W_QK at relative offset 0."""
    out = []
    for qk, ov in _factors(attn, ln):
        out.append({"QK": qk.full().float(), "OV": ov.full().float()})  # (C, C) each
    return out


def _factors(attn: nn.Module, ln: nn.Module | None) -> list[tuple[LowRank, LowRank]]:
    """Each head's (QK, OV) factored (``attnlab.models.graph.head_factors``)."""
    gain = norm_gain(ln, attn.q_proj.weight.size(1))  # ones where there is no gain
    return [head_factors(attn, h, gain) for h in range(attn.n_heads)]


def _reading_norm(block: nn.Module, step) -> nn.Module | None:
    """The norm between the stream and a residual step's sublayer, as the block declares it
    (``attnlab.blocks.Residual.norm``: pre-norm; None where the sublayer reads the stream)."""
    return block.get_submodule(step.norm) if step.norm else None


def composition_scores(model: nn.Module) -> list[dict] | None:
    """Q/K/V composition of every head of layer l + 1 with every head of layer l, for a model
    that declares one stack of blocks (``stacks == ("",)``: a GPT, an encoder, a ViT); None
    otherwise. Each row: {"writer": "0.1", "reader": "1.0", "Q": q, "K": k, "V": v}."""
    if tuple(model.stacks) != ("",) or len(model.stack_blocks("")) < 2:
        return None
    blocks = model.stack_blocks("")
    heads = [_factors(b.attn, _reading_norm(b, b.step("attn"))) for b in blocks]
    rows = []
    for layer in range(1, len(heads)):
        for r, (qk, ov) in enumerate(heads[layer]):
            for w, (_, writer) in enumerate(heads[layer - 1]):
                c = {k.upper(): composition(k, writer, qk, ov) for k in "qkv"}
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
    vocab: int | None = None  # the probe's vocabulary: guessing uniformly scores ln(vocab)

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
            t.add_row(r["name"], *cells, r["kind"] or "-", style="bold" if r["kind"] else None)
        bars = ", ".join(
            f"{n.replace('-token', '')} >= {v:g}"
            + ("" if KIND_NAMES[n] in (n, n.replace("-token", "")) else f" ({KIND_NAMES[n]})")
            for n, v in THRESHOLDS.items()
        )
        parts = [t, Text(f"kind: the score furthest over its bar ({bars}); -: no score "
                         "reaches its bar", style="dim")]  # fmt: skip
        if self.loss_first_half is not None:
            line = (f"next-token loss on the first half {self.loss_first_half:.3f}, on the "
                    f"repeated half {self.loss_repeated_half:.3f} nats")  # fmt: skip
            if self.vocab:
                line += (f" (the halves are random tokens: guessing uniformly scores ln "
                         f"{self.vocab} = {math.log(self.vocab):.3f}; a model of real text, "
                         "confident in what it learned, can score worse; an induction head "
                         "lowers the repeated half)")  # fmt: skip
            parts.append(Text(line))
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
        why = ("this model reads no token ids" if model.probe_vocab_size is None else
               f"its {max_positions(model)} positions hold no repeated sequence of 2 or more "
               "tokens")  # fmt: skip
        notes.append(f"{why}: scored on the sample only (no duplicate-token or induction "
                     "score)")  # fmt: skip
    if any(isinstance(m, MultiHeadAttention) and m.rotary is not None for m in model.modules()):
        notes.append("rotary positions: composition is measured at relative offset 0")
    described = (f"{rep.size(0)} random sequences of {rep.size(1) // 2} tokens, each repeated "
                 "once" if rep is not None else "the sample")  # fmt: skip
    return HeadsReport(
        rows, described,
        None if samp is None else (sample_name or f"{sample.size(0)} held-out sequences"),
        probe.loss_first_half if probe else None, probe.loss_repeated_half if probe else None,
        composition_scores(model), notes, vocab=model.probe_vocab_size if probe else None,
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
    if sample is None and model.probe_vocab_size is None:  # a model that reads no token ids
        sample = model.probe_inputs(4, seed), False
        notes.append("scored on 4 random inputs of the model's shape")
    inputs, ids = sample if sample is not None else (None, True)
    report = score_heads(model, inputs, ids, n=n, seed=seed)
    report.notes += notes
    return report
