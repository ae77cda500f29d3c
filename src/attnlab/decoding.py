"""Decoding for encoder-decoder models: greedy and beam search.

Works with any model that implements the incremental protocol (``Seq2SeqTransformer``,
``RNNSeq2Seq``):
    state = model.start(src, max_len)          # encode (B, S) once
    logp  = model.step(state, tokens)          # last tokens (B,) -> next-token log-probs (B, V)
    model.reorder(state, index)                # keep/duplicate batch rows (beam search)
Ids 0, 1, 2 are <pad>, <bos>, <eos>; <pad> and <bos> are never produced.

Beam search keeps the ``beam`` best partial translations by total log-probability; a finished
one is ranked by  log p(y | x) / lp(y),  lp(y) = ((5 + |y|) / 6) ** alpha  (Wu et al., 2016,
|y| counting <eos>), so alpha > 0 stops the search from preferring short outputs. With
beam = 1 it makes exactly the greedy choices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

PAD, BOS, EOS = 0, 1, 2


def pad_ids(seqs: list[list[int]], pad: int = PAD, device=None) -> Tensor:
    """Right-pad lists of ids into a (B, L) tensor."""
    L = max(1, max((len(s) for s in seqs), default=1))
    out = torch.full((len(seqs), L), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out.to(device) if device is not None else out


def default_max_len(model, src_len: int, max_len: int | None = None) -> int:
    """Longest output tried: ``max_len`` or twice the source plus 10, within the model's
    positions (a Transformer's ``config.max_len`` holds <bos> too)."""
    limit = getattr(model.config, "max_len", None)
    n = max_len or 2 * src_len + 10
    return min(n, limit - 1) if limit else n


def _forbid_specials(logp: Tensor) -> Tensor:
    logp[:, PAD] = float("-inf")
    logp[:, BOS] = float("-inf")
    return logp


@torch.no_grad()
def greedy(model, src: Tensor, max_len: int | None = None) -> list[list[int]]:
    """Pick the most probable token at every step, for a batch src (B, S).

    Returns each row's output ids without <eos> (stopped at <eos> or after ``max_len`` tokens).
    """
    max_len = default_max_len(model, src.size(1), max_len)
    B = src.size(0)
    state = model.start(src, max_len + 1)
    tokens = torch.full((B,), BOS, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    out = []
    for _ in range(max_len):
        logp = _forbid_specials(model.step(state, tokens))  # (B, V)
        tokens = logp.argmax(-1).masked_fill(done, PAD)  # (B,)
        out.append(tokens)
        done |= tokens == EOS
        if bool(done.all()):
            break
    ids = torch.stack(out, 1).tolist() if out else [[] for _ in range(B)]
    return [[t for t in row[: row.index(EOS)] if t != PAD] if EOS in row else row for row in ids]


@dataclass
class Hypothesis:
    tokens: list[int]  # output ids, without <eos>
    logprob: float  # log p(tokens, <eos> | source)
    score: float  # logprob / lp(length)
    finished: bool


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's lp = ((5 + length) / 6) ** alpha; alpha = 0 ranks by plain log-probability."""
    return ((5 + length) / 6) ** alpha


@torch.no_grad()
def beam_search(
    model, src: Tensor, beam: int = 4, alpha: float = 0.6, max_len: int | None = None
) -> list[Hypothesis]:
    """Beam search for ONE source (1, S). Returns up to ``beam`` hypotheses, best first.

    At each step every live hypothesis is extended by every token; the best 2 * beam extensions
    are read in order: one ending in <eos> is set aside as finished, the others refill the beam.
    The search stops when ``beam`` hypotheses have finished, or after ``max_len`` tokens.
    """
    if src.size(0) != 1:
        raise ValueError("beam_search decodes one source at a time: src must be (1, S)")
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    max_len = default_max_len(model, src.size(1), max_len)
    state = model.start(src, max_len + 1)
    alive: list[list[int]] = [[]]
    scores = torch.zeros(1, device=src.device)  # (K,) total log-probabilities of the live beams
    last = torch.full((1,), BOS, dtype=torch.long, device=src.device)
    finished: list[Hypothesis] = []
    for step in range(max_len):
        logp = _forbid_specials(model.step(state, last))  # (K, V)
        V = logp.size(-1)
        total = (scores[:, None] + logp).view(-1)  # (K * V,)
        top_scores, top_idx = total.topk(min(2 * beam, int(torch.isfinite(total).sum())))
        origins, new_alive, new_scores, new_last = [], [], [], []
        for s, idx in zip(top_scores.tolist(), top_idx.tolist()):
            k, tok = divmod(idx, V)
            if tok == EOS:
                n = len(alive[k]) + 1
                finished.append(Hypothesis(alive[k], s, s / length_penalty(n, alpha), True))
            else:
                origins.append(k)
                new_alive.append(alive[k] + [tok])
                new_scores.append(s)
                new_last.append(tok)
            if len(finished) >= beam or len(new_alive) == beam:
                break
        if len(finished) >= beam or not new_alive:
            break
        alive = new_alive
        scores = torch.tensor(new_scores, device=src.device)
        last = torch.tensor(new_last, dtype=torch.long, device=src.device)
        if step + 1 < max_len:
            model.reorder(state, torch.tensor(origins, dtype=torch.long, device=src.device))
    else:  # ran out of length: the live beams count, unfinished
        for toks, s in zip(alive, scores.tolist()):
            finished.append(Hypothesis(toks, s, s / length_penalty(len(toks), alpha), False))
    finished.sort(key=lambda h: h.score, reverse=True)
    return finished[:beam]


def translate(model, tokenizer, texts: list[str], beam: int = 1, alpha: float = 0.6,
              max_len: int | None = None) -> list[str]:  # fmt: skip
    """Source texts -> translations, greedy (beam = 1, batched) or by beam search."""
    device = next(model.parameters()).device
    srcs = [tokenizer.encode_source(t) for t in texts]
    if beam == 1:
        outs = greedy(model, pad_ids(srcs, device=device), max_len)
    else:
        outs = [beam_search(model, pad_ids([s], device=device), beam, alpha, max_len)[0].tokens
                for s in srcs]  # fmt: skip
    return [tokenizer.decode_target(o) for o in outs]


@torch.no_grad()
def record_translation(model, tokenizer, text: str, max_len: int | None = None):
    """Translate ``text`` greedily, then record one teacher-forced pass on (source, output).

    Returns an ``attnlab.inspect.Recording``: attention maps by name, (1, H, T, S); tokens
    {"encoder": source tokens, "decoder": decoder input tokens, <bos> first}; cross-attention
    reads the "encoder" stack; ``extra`` holds ``predicted`` (the token each decoder position
    produced, <eos> last) and ``translation``.
    """
    from attnlab.inspect.recording import Recording

    device = next(model.parameters()).device
    src_ids = tokenizer.encode_source(text)
    src = pad_ids([src_ids], device=device)
    out = greedy(model, src, max_len)[0]
    tgt_in = pad_ids([[BOS, *out]], device=device)
    logits, acts = model(src, tgt_in, record=True)
    return Recording(
        acts,
        {
            "encoder": tokenizer.source_tokens(src_ids),
            "decoder": tokenizer.target_tokens([BOS, *out]),
        },
        ids={"encoder": list(src_ids), "decoder": [BOS, *out]},
        memory_stack="encoder",
        logits=logits.detach(),
        model_type=model.model_type,
        extra={
            "predicted": tokenizer.target_tokens([*out, EOS]),
            "translation": tokenizer.decode_target(out),
        },
    )


class DecoderProbes:
    """What ``attnlab check`` needs from an encoder-decoder (mixed into both models).

    Each probe runs the decoder on target ids ``ids`` (B, T) over one fixed random source, so
    perturbing a target token changes nothing but the decoder's input:
    - ``conformance_forward``: decoder logits (B, T, V), causal in the target;
    - ``cache_difference``: incremental decoding (``start``/``step``) vs the full pass;
    - ``padding_difference``: padding the source changes no decoder output.
    """

    causal = True  # the decoder's self-attention
    uses_padding = True
    pad_id = PAD

    def _probe_source(self, batch: int, length: int = 7) -> Tensor:
        g = torch.Generator().manual_seed(1234)
        src = torch.randint(EOS + 1, self.config.src_vocab_size, (batch, length), generator=g)
        src[:, -1] = EOS
        return src.to(next(self.parameters()).device)

    def conformance_inputs(self, batch: int = 2, seed: int = 0, length: int = 12) -> Tensor:
        """Random target ids (B, T) without <pad>, <bos>-first like a decoder input."""
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(EOS + 1, self.config.tgt_vocab_size, (batch, length), generator=g)
        ids[:, 0] = BOS
        return ids.to(next(self.parameters()).device)

    def conformance_forward(self, ids: Tensor) -> Tensor:
        return self(self._probe_source(ids.size(0)), ids)

    @torch.no_grad()
    def cache_difference(self, ids: Tensor) -> float:
        src = self._probe_source(ids.size(0))
        full = torch.log_softmax(self(src, ids).float(), dim=-1)  # (B, T, V)
        state = self.start(src, ids.size(1))
        steps = [self.step(state, ids[:, t]) for t in range(ids.size(1))]  # T x (B, V)
        return float((torch.stack(steps, dim=1) - full).abs().max())

    @torch.no_grad()
    def padding_difference(self, ids: Tensor, n_pad: int = 3) -> float:
        src = self._probe_source(ids.size(0))
        padded = torch.cat([src, src.new_full((src.size(0), n_pad), PAD)], dim=1)
        return float((self(padded, ids) - self(src, ids)).abs().max())
