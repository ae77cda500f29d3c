"""Trace one forward pass step by step, the way the notes walk through "I like to eat apples".

Every number comes from the recorded activations (``Recording.cache``) and the model's weights;
nothing is recomputed by a second implementation, except the raw scores Q K^T, which are
shown before the 1/sqrt(d_k) scaling that the recorded ``scores`` already include. For the
chosen layer and head of each attention:

    X (N, M) -> Q = X W_Q, K = X W_K, V = X W_V        (N, d_k), (N, d_k), (N, d_v)
    scores = Q K^T / sqrt(d_k) (N, S) -> mask -> softmax over keys -> weights (N, S)
    z = weights V (N, d_v); concat heads (N, H d_v); out = concat W_O (N, M)
    h = x + out; FFN(LN(h)); ...

and then only what the model itself predicts, in its own words:

    GPT                   logits (N, vocab) -> the next-token probabilities after the text
    masked LM             the masked-LM head's probabilities at each [MASK] (as ``predict``)
    text classifier, ViT  the class read from [CLS]
    encoder with no head  its contextual vectors (no prediction)
    encoder-decoder       the encoder's self-attention, the decoder's masked self-attention
                          and cross-attention, then each decoder step's prediction
    LSTM (+ attention)    encoder states, the score e_ts and alignment a_t of each output step
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from attnlab.attention import MultiHeadAttention, causal_mask, sliding_window_mask
from attnlab.blocks import Block
from attnlab.inspect.recording import InspectError, Recording, record
from attnlab.norms import RMSNorm
from attnlab.positional import RotaryHalf
from attnlab.render.display import (
    TERMINAL_TOKENS,
    Preview,
    Result,
    heatmap_html,
    matrix_table,
    preview,
    preview_text,
    rounded,
    show_token,
)

TRACE_MORE = "--start {next} shows the keys from {next}; --json has every value"
FULL_VALUES = 16384  # steps with at most this many numbers carry all of them in --json


@dataclass
class Step:
    """One step of the forward pass: what it is, its shape, what it means, its numbers.

    ``lines`` are how the terminal and a notebook show a step that is not a matrix (tokens,
    predictions); ``extra`` is its data for JSON. ``numbers`` is the step's array, or a
    function that computes it when ``value`` is first read (a GPT's logits: most readers of
    a trace, the workbench's step list and its predictions, never ask for them)."""

    name: str
    title: str
    shape: tuple[int, ...]
    meaning: str
    numbers: np.ndarray | Callable[[], np.ndarray] | None = None
    rows: list[str] | None = None  # token labels when the matrix is token x token
    cols: list[str] | None = None
    extra: dict = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    @property
    def value(self) -> np.ndarray | None:
        if callable(self.numbers):
            self.numbers = self.numbers()
        return self.numbers

    def to_dict(self) -> dict:
        d = {
            "name": self.name,
            "title": self.title,
            "shape": list(self.shape),
            "meaning": self.meaning,
        }
        if self.value is not None:
            d["preview"] = preview(self.value)
            if self.value.size <= FULL_VALUES:
                d["values"] = rounded(self.value, 5)
        if self.rows is not None:
            d["rows"] = self.rows
            d["cols"] = self.cols or self.rows
        d.update(self.extra)
        return d


@dataclass
class Trace(Result):
    """The steps of one forward pass for one layer and head; ``about`` says what the model is."""

    text: str
    tokens: list[str]
    ids: list[int]
    layer: int
    head: int
    steps: list[Step]
    about: dict = field(default_factory=dict)
    start: int = 0  # first key column of the token x token tables in the terminal
    widest: int = 0  # the most tokens of any stack recorded: the keys --start may pick from

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step {name!r}; steps: {', '.join(s.name for s in self.steps)}")

    @property
    def heading(self) -> str:
        return f"trace of {self.text!r}: layer {self.layer}, head {self.head}"

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        parts = [Text(self.heading, style="bold")]
        if self.about.get("description"):
            parts.append(Text(f"the model: {self.about['description']}.", style="italic"))
        parts.append(Text(""))
        for n, s in enumerate(self.steps, 1):
            shape = " x ".join(map(str, s.shape)) if s.shape else "-"
            parts.append(Text(f"[{n}] {s.title}{self._sum_note(s)}   shape ({shape})",
                              style="bold cyan"))  # fmt: skip
            parts.append(Text(f"    {s.meaning}"))
            if s.lines:
                parts.append(Text("\n".join("    " + line for line in s.lines)))
            elif s.rows is not None and s.value is not None and s.value.ndim == 2:
                parts.append(matrix_table(s.value, s.rows, s.cols or s.rows, heat=False,
                                          limit=TERMINAL_TOKENS, start=self.start, max_lines=48, row_name="queries",
                                          col_name="keys", more=TRACE_MORE))  # fmt: skip
            elif s.value is not None:
                parts.append(Preview(s.value))
            parts.append(Text(""))
        return Group(*parts)

    def _sum_note(self, s: Step) -> str:
        """' = [2] + [3]' for a step that is the sum of earlier steps."""
        number = {x.name: i for i, x in enumerate(self.steps, 1)}
        names = s.extra.get("sum_of") or []
        return (" = " + " + ".join(f"[{number[x]}]" for x in names)) if names else ""

    def to_dict(self) -> dict:
        return {
            "about": self.about,
            "text": self.text,
            "tokens": self.tokens,
            "ids": self.ids,
            "layer": self.layer,
            "head": self.head,
            "steps": [s.to_dict() for s in self.steps],
        }

    def _repr_html_(self) -> str:
        import html

        out = [f"<h4>{html.escape(self.heading)}</h4>"]
        if self.about.get("description"):
            out.append(f"<p><i>{html.escape(self.about['description'])}.</i></p>")
        for n, s in enumerate(self.steps, 1):
            shape = " x ".join(map(str, s.shape))
            out.append(
                f"<div><b>[{n}] {html.escape(s.title + self._sum_note(s))}</b> "
                f"<code>({shape})</code><br>"
                f"<i>{html.escape(s.meaning)}</i></div>"
            )
            if s.lines:
                out.append(f"<pre>{html.escape(chr(10).join(s.lines))}</pre>")
            elif s.rows is not None and s.value is not None and s.value.ndim == 2:
                out.append(
                    heatmap_html(s.value, s.rows, s.cols or s.rows, limit=24, diverging=True)
                )
            elif s.value is not None:
                out.append(f"<pre>{html.escape(preview_text(s.value))}</pre>")
        return "\n".join(out)


def _np(t) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _head_slice(w: torch.Tensor, h: int, d: int) -> np.ndarray:
    """The rows of a (H * d, M) projection weight that make head h, as the (M, d) matrix W."""
    return _np(w[h * d : (h + 1) * d].T)


def _top(probs: torch.Tensor, k: int) -> list[tuple[float, int]]:
    top = torch.topk(probs, min(k, probs.numel()))
    return list(zip(top.values.tolist(), top.indices.tolist()))


def _token_line(tokens: list[str], ids: list[int] | None = None) -> str:
    if ids is None or len(ids) != len(tokens):
        return "  ".join(show_token(t) for t in tokens)
    return "  ".join(f"{show_token(t)}={i}" for t, i in zip(tokens, ids))


@torch.no_grad()
def trace(
    model,
    tokenizer,
    text: str,
    layer: int = 0,
    head: int = 0,
    top_k: int = 5,
    rec: Recording | None = None,
) -> Trace:
    """Explain one forward pass of ``model`` over ``text`` step by step (see module docstring).
    Given ``rec`` (a recording of ``text``), the steps are read from it, once per recording
    and arguments (``Recording.once``: the explorer's prediction and the walkthrough share
    them)."""
    if rec is None:
        return _trace(model, tokenizer, text, layer, head, top_k, record(model, tokenizer, text))
    key = ("trace", id(model), id(tokenizer), text, layer, head, top_k)
    return rec.once(key, lambda: _trace(model, tokenizer, text, layer, head, top_k, rec))


def _trace(model, tokenizer, text: str, layer, head: int, top_k: int, rec: Recording) -> Trace:
    if rec.memory_stack is not None:
        return _trace_encoder_decoder(model, tokenizer, text, layer, head, top_k, rec)
    info = rec.select(layer=layer, name="attn.weights")
    stack = info.stack
    toks, ids = rec.tokens[stack], rec.ids.get(stack, [])
    steps: list[Step] = []
    walk = model.walkthrough(rec.cache, list(toks))
    if walk is not None:  # no transformer blocks: the model names its own steps
        steps.append(Step("tokens", "tokens and ids", (len(toks),),
                          f"the text split into N = {len(toks)} tokens, each mapped to its "
                          "integer id in the vocabulary.", lines=[_token_line(toks, ids)]))  # fmt: skip
        for w in walk:
            v = _np(w.value)
            steps.append(Step(w.name, w.title, v.shape, w.meaning, v, w.rows, w.cols))
        _output_steps(steps, model, tokenizer, rec, stack, top_k)
        return Trace(text, list(toks), list(ids), 0, 0, steps, rec.about)
    _input_steps(steps, model, rec, stack, info, toks, ids)
    _attention_steps(steps, model, rec, info, head)
    _block_steps(steps, model, rec, info)
    _output_steps(steps, model, tokenizer, rec, stack, top_k)
    return Trace(text, list(toks), list(ids), info.layer or 0, head, steps, rec.about)


# ---------------------------------------------------------------------------------------------
# One stack: tokens, embedding, one block
# ---------------------------------------------------------------------------------------------


def _input_steps(steps, model, rec, stack, info, toks, ids, prefix_name="", what="") -> None:
    """Tokens, the embedding, positions, and the residual stream entering the chosen layer."""
    c, add = rec.cache, steps.append
    N = len(toks)
    root = stack + "." if stack else ""
    attn = model.get_submodule(info.module_path)
    vit = model.reads == "image"  # patches of an image, not tokens of a text
    if vit:
        g = int(round(math.sqrt(N - 1)))
        p = rec.extra.get("patch_size", "P")
        add(Step(prefix_name + "tokens", "patches as tokens", (N,),
                 f"the image cut into {g} x {g} = {N - 1} patches of {p} x {p} pixels, each a "
                 "token labelled r<row>c<column> from the top left, after a [CLS] token whose "
                 "final state names the class.", lines=[_token_line(toks)]))  # fmt: skip
    else:
        add(Step(prefix_name + "tokens", f"{what}tokens and ids", (N,),
                 f"the text split into N = {N} tokens, each mapped to its integer id in the "
                 "vocabulary.", lines=[_token_line(toks, ids)]))  # fmt: skip
    if root + "embed" in c:
        e = _np(c[root + "embed"][0])
        if vit:
            meaning = (f"each patch's pixels, flattened, times a learned matrix: one vector of "
                       f"M = {e.shape[1]} numbers per patch ([CLS], a learned vector, joins "
                       "them next).")  # fmt: skip
        else:
            meaning = (f"each token looks up a learned vector of M = {e.shape[1]} numbers: the "
                       "N x M embedding matrix (one row per token).")  # fmt: skip
        add(Step(prefix_name + "embedding", "patch embedding" if vit else "embedding matrix",
                 e.shape, meaning, e))  # fmt: skip
    if root + "embed_cls" in c:
        e = _np(c[root + "embed_cls"][0])
        add(Step(prefix_name + "embedding_cls", "[CLS] then the patch embeddings", e.shape,
                 "the learned [CLS] vector as row 0, the patch embeddings after it.", e))  # fmt: skip
    if root + "pos" in c:
        p = _np(c[root + "pos"])
        p = p[0] if p.ndim == 3 else p
        add(Step(prefix_name + "positional", "positional encoding", p.shape,
                 "attention alone is blind to order, so a vector for each position is added "
                 "to its token's embedding.", p))  # fmt: skip
    elif attn.rotary is not None:
        add(Step(prefix_name + "positional", "positional encoding (rotary)", (),
                 "positions are not added here: they rotate pairs of channels of Q and K inside "
                 "attention, by position x frequency."))  # fmt: skip
    if root + "type" in c:
        t = _np(c[root + "type"][0])
        add(Step(prefix_name + "token_type", "token-type embedding", t.shape,
                 "a learned vector for each token's segment (all segment 0 for one text), "
                 "added too.", t))  # fmt: skip
    named = {s.name: s for s in steps}
    parts = [
        prefix_name + x
        for x in ("embedding_cls", "positional", "token_type")
        if named.get(prefix_name + x) is not None and named[prefix_name + x].value is not None
    ]
    if prefix_name + "embedding_cls" not in named and prefix_name + "embedding" in named:
        parts.insert(0, prefix_name + "embedding")
    summed = " + ".join(named[x].title.split(" (")[0] for x in parts)
    if root + "embed_sum" in c:  # the sum goes through a LayerNorm before layer 0
        e = _np(c[root + "embed_sum"][0])
        add(Step(prefix_name + "embed_sum", summed, e.shape,
                 "the embeddings above added together, one M-vector per token (a LayerNorm "
                 "comes next).", e, extra={"sum_of": parts}))  # fmt: skip
    prefix = info.module_path[: -len("attn")]  # "blocks.0."
    if prefix + "resid_pre" in c:
        x_in = _np(c[prefix + "resid_pre"][0])
        extra, title = {}, f"input to {stack + ' ' if stack else ''}layer {info.layer}"
        if info.layer not in (0, None):
            what = f"the output of layer {info.layer - 1}"
        elif root + "embed_sum" in c:
            what = (
                "the embedding sum above through the embedding layer norm (mean 0, "
                "variance 1 per row, then scaled and shifted by learned weights)"
            )
            title = f"{title}: layer norm of the embedding sum"
        elif len(parts) > 1:
            what, extra = summed, {"sum_of": parts}
            title = f"{title} = {summed}"
        else:
            what = "the embedding itself"
        add(Step(prefix_name + "block_input", title, x_in.shape,
                 f"the residual stream entering this layer: {what}, one M-vector per token.",
                 x_in, extra=extra))  # fmt: skip
    norm = _attention_norm(model, prefix)
    if norm and prefix + norm in c:
        x = _np(c[prefix + norm][0])
        rms = _norm_words(model.get_submodule(prefix + norm))
        add(Step(prefix_name + "ln1", f"{rms[0] if rms else 'layer norm'} before attention",
                 x.shape, (rms[1] if rms else "each row is normalised to mean 0 and variance "
                 "1, then scaled and shifted by learned weights") + ": X, the input to "
                 "attention.", x))  # fmt: skip


NO_NORM = ("no norm", "this model has no norm here (an identity): the row is the residual "
           "stream as it is")  # fmt: skip


def _attention_norm(model, prefix: str) -> str | None:
    """The name of the norm in front of self-attention in the block at ``prefix`` ("blocks.0."),
    as the block declares it (None: post-norm, attention reads the stream itself)."""
    step = model.get_submodule(prefix.rstrip(".")).step("attn")
    return step.norm if step is not None else None


def _norm_words(norm) -> tuple[str, str] | None:
    """(name, what it does) for an RMSNorm (read from its ``offset``) or no norm at all (an
    identity: ``GPTConfig(norm="none")``, or a post-norm model's final position); None for a
    LayerNorm."""
    if isinstance(norm, torch.nn.Identity):
        return NO_NORM
    if not isinstance(norm, RMSNorm):
        return None
    gain = "(1 + w), its weights stored around 0" if norm.offset else "learned weights w"
    return ("RMS norm", "each row is divided by its root mean square sqrt(mean(x^2) + eps) "
            f"(no centring, no shift), then multiplied by {gain}")  # fmt: skip


def _attention_steps(steps, model, rec, info, head, prefix_name="") -> None:
    """W_Q, W_K, W_V of one head, Q, K, V, the scores, the mask (or none), the softmax, the
    weighted sum, the concatenated heads and W_O, for the attention map ``info``."""
    c, add = rec.cache, steps.append
    H = info.n_heads
    if not 0 <= head < H:
        where = f"layer {info.layer}" if info.layer is not None else info.label
        raise InspectError(f"no head {head}; {where} has heads 0..{H - 1}")
    path = info.module_path  # e.g. "blocks.0.attn" or "decoder.blocks.0.cross"
    attn = model.get_submodule(path)
    cross = info.kind == "cross"
    src = "the source tokens (the encoder's output)" if cross else "the same tokens"
    dk, dv = attn.d_k, attn.d_v
    g = H // attn.n_kv_heads  # query heads per K/V head (grouped-query)
    kv = head // g  # the K/V head this query head reads
    wq = _head_slice(attn.q_proj.weight, head, dk)
    wk, wv = _head_slice(attn.k_proj.weight, kv, dk), _head_slice(attn.v_proj.weight, kv, dv)
    n = prefix_name
    add(Step(n + "W_Q", f"W_Q of head {head}", wq.shape,
             f"learned projection M -> d_k = {dk}: Q = X W_Q asks 'what am I looking for?'", wq))  # fmt: skip
    if g > 1:
        add(Step(n + "shared_kv", f"K/V head {kv}, shared", (),
                 f"grouped-query attention: {H} query heads share {H // g} key/value heads; "
                 f"query heads {kv * g}..{kv * g + g - 1} all read K/V head {kv}, so the K and V "
                 "below are theirs too."))  # fmt: skip
    add(Step(n + "W_K", f"W_K of head {kv if g > 1 else head}", wk.shape,
             f"K = W_K applied to {src} says 'what do I contain?'; a query meets keys through "
             "dot products.", wk))  # fmt: skip
    add(Step(n + "W_V", f"W_V of head {kv if g > 1 else head}", wv.shape,
             f"V = W_V applied to {src} (d_v = {dv}) is what a token passes on when it is "
             "attended to.", wv))  # fmt: skip
    q = _np(c[f"{path}.q"][0, head])
    k, v = (_np(c[f"{path}.{x}"][0, kv]) for x in ("k", "v"))
    # said for the modern pieces only (QK-norm, rotate-half rotary), so a GPT-2-style model's
    # trace keeps its JSON; its adjacent-pair rotary is explained at the positional step
    if attn.q_norm is not None or isinstance(attn.rotary, RotaryHalf):
        how = " and ".join(w for w, on in (
            ("normed per head by an RMSNorm (QK-norm: keeps the scores from growing)",
             attn.q_norm is not None),
            ("rotated by position (rotary: each pair of channels turns by position x its "
             "frequency, so Q.K depends on the tokens' distance)", attn.rotary is not None))
            if on)  # fmt: skip
        add(Step(n + "qk_before", "Q and K, then " + ("QK-norm and rotation" if attn.q_norm
             is not None and attn.rotary is not None else "QK-norm" if attn.q_norm is not None
             else "rotation"), (), f"the Q and K shown below are already {how}."))  # fmt: skip
    add(Step(n + "Q", "Q = X W_Q (+ bias)", q.shape, "one query vector per token.", q))
    add(Step(n + "K", "K = X W_K (+ bias)", k.shape,
             "one key vector per " + ("source token." if cross else "token."), k))  # fmt: skip
    add(Step(n + "V", "V = X W_V (+ bias)", v.shape,
             "one value vector per " + ("source token." if cross else "token."), v))  # fmt: skip
    raw = q @ k.T  # (N, S) raw similarities
    q_lab, k_lab = rec.labels(info.name)
    add(Step(n + "raw_scores", "raw scores Q K^T", raw.shape,
             "entry (i, j) is the dot product of query i and key j: how well token j matches "
             "what token i is looking for.", raw, q_lab, k_lab))  # fmt: skip
    scaled = _np(c[f"{path}.scores"][0, head])  # the softmax's input (scaled, biased, capped)
    bias = not cross and f"{path.split('.')[0]}.position_bias" in c  # T5's relative bias
    scale = attn.scale if attn.scale is not None else 1 / math.sqrt(dk)
    if attn.scale is None:
        title = f"scaled by 1/sqrt(d_k) = 1/sqrt({dk}) = {scale:.4f}"
        meaning = "dividing by sqrt(d_k) keeps the scores' spread near 1 so the softmax does not saturate."
    else:
        title = f"scaled by {scale:.4g}" if scale != 1 else "not scaled"
        meaning = (f"this model multiplies the scores by {scale:.4g} instead of 1/sqrt(d_k)"
                   + (" (T5 folds the scale into W_Q's initialisation)" if scale == 1 else "")
                   + ".")  # fmt: skip
    if bias:
        title += ", plus the relative position bias"
        meaning += (" The stack's relative position bias (shown above) is added: entry (i, j) "
                    "gains the learned number of head and distance j - i.")  # fmt: skip
    cap = attn.softcap
    add(Step(n + "scaled_scores", title, scaled.shape, meaning, raw * scale if cap else scaled,
             q_lab, k_lab))  # fmt: skip
    if cap:
        add(Step(n + "softcap", f"softcap {cap:g} tanh(s / {cap:g})", scaled.shape,
                 f"the scores are squashed smoothly into (-{cap:g}, {cap:g}): near 0 they are "
                 "unchanged, large ones saturate, so no single key can take all the weight.",
                 scaled, q_lab, k_lab))  # fmt: skip
    prefix = path.rsplit(".", 1)[0]  # the block
    block = model.get_submodule(prefix) if prefix else model
    causal = not cross and (block.causal if isinstance(block, Block) else model.causal)
    window = attn.window
    if causal and window:
        T, S = scaled.shape
        keep = (causal_mask(T, S) & sliding_window_mask(T, S, window)).numpy()
        masked = np.where(keep, scaled, -np.inf)
        add(Step(n + "masked_scores", f"causal mask and sliding window of {window}",
                 masked.shape, f"a token may not look at later tokens, nor at tokens {window} or "
                 "more positions back: those scores become -inf, so after the softmax they "
                 "weigh 0.", masked, q_lab, k_lab))  # fmt: skip
    elif causal:
        T, S = scaled.shape
        masked = np.where(causal_mask(T, S).numpy(), scaled, -np.inf)
        add(Step(n + "masked_scores", "causal mask", masked.shape,
                 "a token may not look at later tokens: scores right of the diagonal become "
                 "-inf, so after the softmax they weigh 0.", masked, q_lab, k_lab))  # fmt: skip
    else:
        why = ("every output position may read every source token (only source padding would "
               "be hidden)") if cross else (
            "no causal mask: attention is bidirectional, every token reads every other token, "
            "before and after it (only padding would be hidden)")  # fmt: skip
        add(Step(n + "no_mask", "no mask", (), why + "."))
    w = _np(c[f"{path}.weights"][0, head])
    sums = w.sum(-1)
    weighting = attn.weighting if isinstance(attn, MultiHeadAttention) else "softmax"
    if weighting == "softmax":
        title, meaning = "softmax over the keys", (
            f"each row becomes probabilities: row sums are {sums.min():.6f}..{sums.max():.6f}, "
            "i.e. every row sums to 1.")  # fmt: skip
    else:  # rows that need not sum to 1 (attnlab.attention.WEIGHTINGS)
        title, how = {
            "softmax1": ("softmax with an extra zero logit", "exp(s) / (1 + sum of exp(s)): the "
                         "extra logit, fixed at 0, takes the rest of each row's weight"),
            "sigmoid": ("sigmoid of each score", "sigmoid(s), each key on its own, with no "
                        "normalisation over the keys"),
        }[weighting]  # fmt: skip
        meaning = (f"each weight is {how}: row sums are {sums.min():.6f}..{sums.max():.6f}, "
                   "so a row need not sum to 1.")  # fmt: skip
    add(Step(n + "weights", title, w.shape, meaning, w, q_lab, k_lab,
             extra={"row_sums": rounded(sums, 6)}))  # fmt: skip
    z = _np(c[f"{path}.z"][0, head])
    add(Step(n + "z", "weights x V", z.shape,
             "each token's new vector is the weighted "
             f"{'average' if weighting == 'softmax' else 'sum'} of the value vectors it attends "
             "to.", z))  # fmt: skip
    zall = c[f"{path}.z"][0]  # (H, N, d_v)
    concat = _np(zall.transpose(0, 1).reshape(zall.size(1), -1))  # (N, H * d_v)
    add(Step(n + "concat", f"concatenate the {H} heads", concat.shape,
             f"the {H} heads' outputs side by side: H x d_v = {H} x {dv} = {concat.shape[1]} "
             "numbers per token.", concat))  # fmt: skip
    out = _np(c[f"{path}.out"][0])
    add(Step(n + "attn_out", "output projection W_O", out.shape,
             "W_O mixes the heads' outputs back to the model width M: attention's update to "
             "each token.", out))  # fmt: skip


def _block_steps(
    steps, model, rec, info, prefix_name="", cross_info=None, head=0, input_name=None
) -> None:
    """The block's residual steps as it declares them (``Block.residual``): each sublayer's
    update ((cross-attention,) the feed-forward network; the attention's own steps come
    before), the norm on its output and its scale where the step has them, and the residual
    connection; then the block output and a note on the layers after it. Every step that is a
    sum says which steps it adds (``sum_of``); where a post-norm block normalises a sum, the
    sum and the norm are two steps. ``input_name`` is the step holding the block's input
    (default: ``block_input``)."""
    c, add = rec.cache, steps.append
    prefix = info.module_path[: -len("attn")]
    block = model.get_submodule(prefix.rstrip(".")) if prefix else model
    n = prefix_name
    cur = input_name or n + "block_input"
    parallel = any(s.reads == "block" for s in block.residual)
    for s in block.residual:
        if s.sublayer == "attn":
            update = _update_steps(steps, rec, prefix, n, s, n + "attn_out")
            how = _equation(s, "x", "attention", "LN1" if parallel else "LN")
            if s.post:
                how += ": the update is normed again before it is added"
            elif parallel:
                how += "; the MLP reads x too, in parallel, and adds its update"
            cur = _residual(steps, rec, prefix, n, n + "resid_mid", s, cur, update, how,
                            "residual connection: x + attention update",
                            "layer norm after attention",
                            "the update is added to the token's own vector: attention refines, "
                            "it does not replace")  # fmt: skip
        elif s.sublayer == "cross" and cross_info is not None:
            _attention_steps(steps, model, rec, cross_info, head, prefix_name="cross.")
            update = _update_steps(steps, rec, prefix, "cross.", s, "cross.attn_out")
            cur = _residual(steps, rec, prefix, n, "cross.resid", s, cur, update,
                            _equation(s, "h", "cross"),
                            "residual connection: h + cross-attention update",
                            "layer norm after cross-attention",
                            "what the output tokens read from the source is added")  # fmt: skip
        elif s.sublayer == "mlp" and prefix + "mlp_out" in c:
            _ffn_steps(steps, model, rec, prefix, n, s, block)
            update = _update_steps(steps, rec, prefix, n, s, n + "ffn_out")
            normed = s.after is not None
            title = ("residual connection: h + FFN update" if normed  # the norm makes the output
                     else f"output of layer {info.layer} = residual + FFN update")  # fmt: skip
            _residual(steps, rec, prefix, n, n + "block_output", s, cur, update,
                      _equation(s, "h", "FFN"), title,
                      f"output of layer {info.layer}: layer norm of the sum above",
                      "the FFN's update added to the residual stream"
                      + ("" if normed else ": the token vectors handed to the next layer"))  # fmt: skip
    if block.step("mlp") is None and prefix + "resid_post" in c:  # attention only
        r = _np(c[prefix + "resid_post"][0])
        add(Step(n + "block_output", f"output of layer {info.layer}", r.shape,
                 "this block has no feed-forward network: its output is the residual after "
                 "attention, handed to the next layer.", r))  # fmt: skip
    n_blocks = len(rec.blocks(info.stack))
    if info.layer is not None and info.layer + 1 < n_blocks:
        N = len(rec.tokens[info.stack])
        width = c[prefix + "resid_pre"].shape[-1] if prefix + "resid_pre" in c else 0
        add(Step(n + "more_layers", f"layers {info.layer + 1}..{n_blocks - 1}", (N, width),
                 "the remaining layers repeat the same steps with their own weights."))  # fmt: skip


def _equation(s, x: str, what: str, norm: str = "LN") -> str:
    """A residual step in symbols: ``x + attention(LN(x))``, ``x + attention(x)`` (post-norm:
    the norm comes after the sum), ``x + 0.5 LN_post(attention(LN(x)))``."""
    u = f"{what}({norm}({x}))" if s.norm else f"{what}({x})"
    u = f"LN_post({u})" if s.post else u
    return f"{x} + {s.scale:g} {u}" if s.scale != 1 else f"{x} + {u}"


UPDATES = {"attn": ("attention", "attention's"), "cross": ("cross-attention", "cross-attention's"),
           "mlp": ("feed-forward", "the FFN's")}  # fmt: skip


def _update_steps(steps, rec, prefix, n, s, update: str) -> str:
    """The norm on a sublayer's output and the residual scale, where the step has them (each a
    step of its own); returns the name of the step holding what is added to the stream."""
    c, add = rec.cache, steps.append
    what, whose = UPDATES[s.sublayer]
    name = "ffn" if s.sublayer == "mlp" else s.sublayer
    if s.post and prefix + f"{s.sublayer}_post" in c:  # a second norm before it is added
        u = _np(c[prefix + f"{s.sublayer}_post"][0])
        add(Step(n + f"{s.sublayer}_post", f"norm of the {what} update", u.shape,
                 f"this model normalises {whose} output again before adding it.", u))  # fmt: skip
        update = n + f"{s.sublayer}_post"
    if s.scale != 1:
        by_name = {x.name: x for x in steps}
        u = s.scale * by_name[update].value
        add(Step(n + f"{name}_scaled", f"the {what} update times {s.scale:g}", u.shape,
                 f"this block scales each update by {s.scale:g} before adding it to the "
                 "residual stream.", u))  # fmt: skip
        update = n + f"{name}_scaled"
    return update


def _residual(steps, rec, prefix, n, name, s, prev, update, how, title, normed_title, meaning):
    """prev + update, then (post-norm) its norm; returns the step holding the result."""
    c, add = rec.cache, steps.append
    sum_key = f"{s.sublayer}_sum"
    out_key = s.point or "resid_post"
    if s.after and prefix + sum_key in c:  # post-norm: the sum, then the norm
        h = _np(c[prefix + sum_key][0])
        add(Step(n + sum_key, title, h.shape, f"{meaning} ({how}, before its norm).", h,
                 extra={"sum_of": [prev, update]}))  # fmt: skip
        if prefix + out_key in c:
            h = _np(c[prefix + out_key][0])
            add(Step(name, normed_title, h.shape,
                     f"LN({how}): the sum normalised per row, then scaled and shifted by "
                     "learned weights.", h))  # fmt: skip
        return name
    if prefix + out_key in c:
        h = _np(c[prefix + out_key][0])
        add(Step(name, title, h.shape, f"{meaning} ({how}).", h,
                 extra={"sum_of": [prev, update]}))  # fmt: skip
        return name
    return prev


def _ffn_steps(steps, model, rec, prefix, n, s, block) -> None:
    """The norm before the feed-forward network, its hidden layer and its output."""
    c, add = rec.cache, steps.append
    if s.norm and prefix + s.norm in c:
        h = _np(c[prefix + s.norm][0])
        rms = _norm_words(block.get_submodule(s.norm))
        add(Step(n + "ln2", f"{rms[0] if rms else 'layer norm'} before the feed-forward network",
                 h.shape, NO_NORM[1] + ": the MLP reads it." if rms == NO_NORM
                 else "normalised again before the position-wise MLP.", h))  # fmt: skip
    if prefix + "mlp.hidden" in c:
        hid = _np(c[prefix + "mlp.hidden"][0])
        if prefix + "mlp.gate" in c:  # a gated FFN: down(act(gate(x)) * up(x))
            add(Step(n + "ffn_hidden", "feed-forward: gate x up", hid.shape,
                     f"each token on its own goes through two projections M -> {hid.shape[1]}: "
                     "one through a non-linearity (the gate), multiplied elementwise by the "
                     "other (SwiGLU / GeGLU).", hid))  # fmt: skip
        else:
            add(Step(n + "ffn_hidden", "feed-forward: widen, then the activation", hid.shape,
                     f"each token on its own goes through W_1 (M -> {hid.shape[1]}) and a "
                     "non-linearity.", hid))  # fmt: skip
    f = _np(c[prefix + "mlp_out"][0])
    add(Step(n + "ffn_out", "feed-forward: back to M", f.shape,
             "W_2 maps back to the model width: the FFN's update to each token.", f))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# What a single-stack model predicts
# ---------------------------------------------------------------------------------------------


def _output_steps(steps, model, tokenizer, rec, stack, top_k) -> None:
    c, add = rec.cache, steps.append
    root = stack + "." if stack else ""
    toks = rec.tokens[stack]
    if root + "ln_f" in c:
        hf = _np(c[root + "ln_f"][0])
        rms = _norm_words(model.final_norm())
        add(Step("ln_f", "no final norm" if rms == NO_NORM else
                 f"final {rms[0] if rms else 'layer norm'}", hf.shape,
                 "the last residual stream, as it is (no norm after the last layer)."
                 if rms == NO_NORM else "the last residual stream, normalised.", hf))  # fmt: skip
    predicts = model.predicts  # what the model's head makes of its last hidden state
    if predicts == "masked-token":
        _masked_lm_steps(steps, tokenizer, rec, top_k)
    elif predicts == "class":
        _class_steps(steps, rec, top_k, model.class_reads)
    elif predicts == "nothing" or (not rec.has_logits and not model.causal):
        h = _np(c[root + "ln_f"][0]) if root + "ln_f" in c else None
        add(Step("output", "contextual vectors (no prediction head)",
                 h.shape if h is not None else (len(toks),),
                 "this encoder has no masked-LM or classification head: its output is one "
                 "vector per token, read in context both ways; it predicts no token and no "
                 "class (`attnlab embed` pools the vectors into a sentence embedding)."))  # fmt: skip
    elif rec.has_logits:
        last = rec.last_logits[0]  # (V,): the others are computed only if the step is read
        V, causal = last.shape[-1], model.causal
        add(Step("logits", "logits", (len(toks), V),
                 f"each position scores all {V} vocabulary entries"
                 + (" (the LM head: a dot product with every token's embedding)." if causal
                    else ": the model's output at every position.")  # fmt: skip
                 , lambda: _np(c.get(root + "logits", rec.logits))[0]))  # fmt: skip
        if causal:
            probs = torch.softmax(last.double(), -1)
            preds = [{"id": int(i), "prob": float(p),
                      "token": tokenizer.decode([int(i)]) if tokenizer else str(int(i))}
                     for p, i in _top(probs, top_k)]  # fmt: skip
            add(Step("predictions",
                     f"top {len(preds)} next-token predictions after {show_token(toks[-1])!r}",
                     (V,),
                     "softmax of the last position's logits: the model's guess for the next "
                     "token.", extra={"predictions": preds},
                     lines=[f"{show_token(p['token']):>8}  p={p['prob']:.3f}" for p in preds]))  # fmt: skip


def _masked_lm_steps(steps, tokenizer, rec, top_k) -> None:
    """The masked-LM head's logits and, at each [MASK], its top-k fillers (``predict``'s)."""
    from attnlab.tasks.mlm import mask_fills, mask_token

    add = steps.append
    lg = _np(rec.cache["mlm_logits"][0])  # (T, V)
    add(Step("mlm_logits", "masked-LM head logits", lg.shape,
             "the head turns each final vector into a score for every vocabulary entry: "
             "LN(act(h W + b)) E^T + b, E the token embedding. Only the scores at [MASK] "
             "positions are predictions: the other tokens are given.", lg))  # fmt: skip
    ids = rec.ids[""]
    mask_id, mask = mask_token(tokenizer)
    fills = mask_fills(tokenizer, ids, rec.cache["mlm_logits"][0], mask_id, top_k)
    if not fills:
        add(Step("masked", f"no {mask} in the text", (0,),
                 f"a masked LM predicts only where the text says {mask}: put {mask} where a "
                 f"token should be guessed (e.g. 'The {mask} of the river').",
                 extra={"masks": []}))  # fmt: skip
        return
    lines = []
    for f in fills:
        shown = "  ".join(f"{show_token(x['token'])} {x['p']:.3f}" for x in f)
        lines.append(f"position {f[0]['position']}: {shown}")
    add(Step("masked", f"predictions at the {len(fills)} {mask} position"
             + ("s" if len(fills) > 1 else ""), (len(fills), len(fills[0])),
             f"softmax of the masked-LM logits at each {mask}: the model's guess for the hidden "
             "token, read from both sides of it.", extra={"masks": fills}, lines=lines))  # fmt: skip


def _class_steps(steps, rec, top_k, reads: str) -> None:
    """The [CLS] state, the classifier's logits and the top classes."""
    c, add = rec.cache, steps.append
    if "pooled" in c:
        p = _np(c["pooled"][0])
        add(Step("pooled", "[CLS] through the pooler", p.shape,
                 "the first token's final vector, through tanh(W h + b): the summary of the "
                 "whole text the classifier reads.", p))  # fmt: skip
    logits = c["class_logits"][0] if "class_logits" in c else rec.logits[0, 0]
    lg = _np(logits)
    add(Step("class_logits", "class logits", lg.shape,
             f"a linear layer scores each class from {reads}.", lg))  # fmt: skip
    names = rec.extra.get("classes") or [str(i) for i in range(lg.shape[-1])]
    probs = torch.softmax(torch.as_tensor(lg, dtype=torch.float64), -1)
    preds = [
        {"id": int(i), "label": names[int(i)], "prob": float(p)} for p, i in _top(probs, top_k)
    ]
    truth = rec.extra.get("truth")
    add(Step("classes", f"top {len(preds)} classes", (lg.shape[-1],),
             "softmax of the class logits: the model's answer"
             + (f" (the true class is {truth})." if truth is not None else "."),
             extra={"classes": preds, **({"truth": truth} if truth is not None else {})},
             lines=[f"{p['label']:>8}  p={p['prob']:.3f}" for p in preds]))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Encoder-decoders: the Transformer, and the LSTM with and without attention
# ---------------------------------------------------------------------------------------------


def _trace_encoder_decoder(model, tokenizer, text, layer, head, top_k, rec) -> Trace:
    steps: list[Step] = []
    add = steps.append
    src, tgt = rec.tokens["encoder"], rec.tokens["decoder"]
    add(Step("tokens", "source tokens and ids", (len(src),),
             f"the source split into S = {len(src)} tokens (<eos> marks its end).",
             lines=[_token_line(src, rec.ids.get("encoder"))]))  # fmt: skip
    add(Step("output", "the output, decoded greedily", (len(tgt),),
             f"the model's own translation {rec.extra.get('translation', '')!r}; the decoder is "
             "run again on it, <bos> first, so each step below sees the tokens before it.",
             extra={"translation": rec.extra.get("translation"), "decoder_tokens": tgt},
             lines=[_token_line(tgt, rec.ids.get("decoder"))]))  # fmt: skip
    self_maps = [m for m in rec.maps() if m.kind == "self"]
    cross_maps = [m for m in rec.maps() if m.kind == "cross"]
    if any(m.module_path.endswith(".attn") and ".blocks." in m.module_path for m in self_maps):
        enc = rec.select(layer=layer, name="encoder.blocks")
        enc_in = _stack_input(steps, model, rec, "encoder", enc)
        _attention_steps(steps, model, rec, enc, head, prefix_name="encoder.")
        _block_steps(steps, model, rec, enc, prefix_name="encoder.", input_name=enc_in)
        dec = rec.select(layer=layer, name="decoder.blocks")
        dec = next(m for m in self_maps if m.module_path == dec.module_path.rsplit(".", 1)[0]
                   + ".attn")  # fmt: skip
        cross = next(m for m in cross_maps if m.layer == dec.layer)
        dec_in = _stack_input(steps, model, rec, "decoder", dec)
        _attention_steps(steps, model, rec, dec, head, prefix_name="decoder.")
        _block_steps(
            steps,
            model,
            rec,
            dec,
            prefix_name="decoder.",
            cross_info=cross,
            head=head,
            input_name=dec_in,
        )
        weights, alignment = rec.weights(cross.name)[head], False  # (T, S)
    else:  # kind branch 1 of 2: an LSTM's recurrence, scores and context are no blocks; the
        # walk-through names its formulas (rnn.SCORE_FORMULAS), prose no declaration holds yet
        _lstm_steps(steps, model, rec, src, tgt)
        weights = rec.weights(cross_maps[0].name)[0] if cross_maps else None
        alignment = True  # an LSTM's one attention: an alignment, not heads
    _decoder_step_predictions(steps, tokenizer, rec, weights, top_k, head, alignment)
    layer_shown = layer if self_maps else 0
    return Trace(text, list(src), list(rec.ids.get("encoder", [])), layer_shown, head, steps,
                 rec.about)  # fmt: skip


def _stack_input(steps, model, rec, stack, info) -> str:
    """An encoder-decoder stack's input (token embedding x sqrt(M), sinusoidal position, their
    sum) and the residual stream entering the chosen layer; returns the name of the step that
    holds the block's input."""
    c, add = rec.cache, steps.append
    what = "each source token" if stack == "encoder" else "each output token so far (<bos> first)"
    relative = f"{stack}.position_bias" in c  # T5: positions enter as a bias on the scores
    name = f"{stack}.embedding"
    if f"{stack}.embed" in c and relative:
        e = _np(c[f"{stack}.embed"][0])
        add(Step(name, f"{stack} input: token embedding", e.shape,
                 f"{what} looks up a learned vector (one matrix for both stacks), with no scale "
                 "and no position vector: positions enter as the bias on the attention scores.",
                 e))  # fmt: skip
    elif f"{stack}.embed" in c:
        parts = []
        if f"{stack}.token" in c:
            t = _np(c[f"{stack}.token"][0])
            add(Step(f"{stack}.token", f"{stack} token embedding x sqrt(M)", t.shape,
                     f"{what} looks up a learned vector, scaled by sqrt(M) = "
                     f"{math.sqrt(t.shape[-1]):.3f}.", t))  # fmt: skip
            parts.append(f"{stack}.token")
        if f"{stack}.pos" in c:
            p = _np(c[f"{stack}.pos"])
            p = p[0] if p.ndim == 3 else p
            add(Step(f"{stack}.positional", f"{stack} positional encoding", p.shape,
                     "the sinusoid of each position: attention alone is blind to order.", p))  # fmt: skip
            parts.append(f"{stack}.positional")
        e = _np(c[f"{stack}.embed"][0])
        extra = {"sum_of": parts} if len(parts) > 1 else {}
        add(Step(name, f"{stack} input: " + ("token embedding + position" if extra else
                 "embedding"), e.shape, "the vectors layer 0 reads, one per token.", e,
                 extra=extra))  # fmt: skip
    if relative:
        b = _np(c[f"{stack}.position_bias"][0])  # (H, T, S)
        toks = rec.tokens.get(stack)
        add(Step(f"{stack}.position_bias", "relative position bias (head 0)", b[0].shape,
                 "a learned number per head and relative distance key - query, added to every "
                 "attention score of this stack: distances are bucketed (the near ones exactly, "
                 "the far ones in log-spaced buckets up to a maximum distance), computed once "
                 "in the first layer and shared by every layer; "
                 + ("the encoder's looks both ways." if stack == "encoder" else
                    "the decoder's sees only earlier positions (causal)."),
                 b[0], rows=toks, cols=toks))  # fmt: skip
    prefix = info.module_path[: -len("attn")]
    if info.layer and prefix + "resid_pre" in c:
        x = _np(c[prefix + "resid_pre"][0])
        add(Step(f"{stack}.block_input", f"input to {stack} layer {info.layer}", x.shape,
                 f"the output of {stack} layer {info.layer - 1}.", x))  # fmt: skip
        name = f"{stack}.block_input"
    norm = _attention_norm(model, prefix)
    if norm and prefix + norm in c:
        x = _np(c[prefix + norm][0])
        add(Step(f"{stack}.ln1", "layer norm before attention", x.shape,
                 "each row normalised: X, the input to attention.", x))  # fmt: skip
    return name


def _lstm_steps(steps, model, rec, src, tgt) -> None:
    """Encoder states; then the score e_ts and alignment a_t of each output step (with
    attention), or the single context vector (without)."""
    from attnlab.models.rnn import SCORE_FORMULAS

    c, add = rec.cache, steps.append
    enc = _np(c["encoder.out"][0])  # (S, C)
    add(Step("encoder.states", "encoder states s_1..s_S", enc.shape,
             "the LSTM reads the source left to right; s_j is its state after token j, so it "
             "knows token j and what came before it.", enc))  # fmt: skip
    score = model.config.attention  # an LSTM's score: none, dot, general or additive
    if score == "none":
        add(Step("context", "the context: the encoder's final state", (enc.shape[1],),
                 "the decoder starts from the encoder's last (h, c) and never sees the source "
                 "again: this one vector is all it knows about the input, however long.",
                 enc[-1]))  # fmt: skip
        if "decoder.hidden" in c:
            h = _np(c["decoder.hidden"][0])
            add(Step("decoder.states", "decoder states h_t", h.shape,
                     "the decoder LSTM's state at each output step, fed the previous output "
                     "token.", h))  # fmt: skip
        return
    e = _np(c["decoder.attn.scores"][0, 0])  # (T, S)
    add(Step("scores", f"scores {SCORE_FORMULAS[score]}", e.shape,
             f"the {score} score of every source state s for the decoder state h_t of each "
             "output step (row = output step, column = source token).", e, tgt, src))  # fmt: skip
    a = _np(c["decoder.attn.weights"][0, 0])  # (T, S)
    add(Step("alignment", "alignment a_t = softmax_s(e_t)", a.shape,
             "each output step's weights over the source tokens, summing to 1: where it looks "
             "before it predicts.", a, tgt, src,
             extra={"row_sums": rounded(a.sum(-1), 6)}))  # fmt: skip
    if "decoder.hidden" in c:
        h = _np(c["decoder.hidden"][0])
        add(Step("attentional_state", "h~_t = tanh(W_c [c_t; h_t])", h.shape,
                 "the context c_t = sum_s a_ts s joins the decoder state; this vector predicts "
                 "the next token.", h))  # fmt: skip


def _decoder_step_predictions(steps, tokenizer, rec, weights, top_k, head, alignment=False):
    """For each decoder step t: the token fed, the source tokens it attends to most, and the
    probabilities of the next output token (logits (T, V))."""
    add = steps.append
    logits = rec.cache.get("decoder.logits", rec.logits)[0]  # (T, V)
    lg = _np(logits)
    add(Step("logits", "logits of each decoder step", lg.shape,
             f"each output step scores all {lg.shape[-1]} target-vocabulary entries for the "
             "next output token.", lg))  # fmt: skip
    src, tgt = rec.tokens["encoder"], rec.tokens["decoder"]
    named = hasattr(tokenizer, "target_tokens")  # a pair tokenizer names the output ids
    rows, lines = [], []
    for t in range(lg.shape[0]):
        probs = torch.softmax(torch.as_tensor(lg[t], dtype=torch.float64), -1)
        top = []
        for p, i in _top(probs, top_k):
            tok = tokenizer.target_tokens([int(i)])[0] if named else str(i)
            top.append({"id": int(i), "token": tok, "prob": float(p)})
        row = {"step": t, "fed": tgt[t], "next": top}
        if weights is not None:
            w = weights[t].numpy()
            looks = [(src[j], float(w[j])) for j in np.argsort(-w)[:2]]
            row["attends_to"] = [{"token": s, "weight": x} for s, x in looks]
        rows.append(row)
        seen = (
            ", ".join(f"{show_token(s)} {x:.2f}" for s, x in looks) if weights is not None else ""
        )
        best = "  ".join(f"{show_token(x['token'])} {x['prob']:.3f}" for x in top[:3])
        lines.append(f"t={t} fed {show_token(tgt[t]):>6}"
                     + (f"  reads {seen}" if seen else "") + f"  -> {best}")  # fmt: skip
    what = ("the source tokens its cross-attention (head "
            f"{head}) weighs most" if weights is not None and not alignment
            else "the source tokens its alignment weighs most" if weights is not None
            else "(no attention: the source reaches it only through the context vector)")  # fmt: skip
    add(Step("decoder_steps", "each decoder step's prediction", (len(rows),),
             f"at step t the decoder has been fed the outputs before it; shown: {what}, and its "
             "most probable next tokens (the greedy output takes the first).",
             extra={"decoder_steps": rows}, lines=lines))  # fmt: skip
