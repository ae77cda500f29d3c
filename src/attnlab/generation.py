"""Decoding, one token at a time, for every generative model: sampling, greedy, beam search.

It speaks one protocol, ``attnlab.decoding.Decoder``, which every model that decodes declares
(``ModelKind.decoded_by``: a GPT's ``GPTDecoder``, an encoder-decoder's ``SourceDecoder``), and
never asks which kind of model it holds:
    dec   = decoder_for(model)
    state = dec.start(x, max_len)       # x: a prompt (B, T0), or a source (B, S) to encode
    logp  = dec.step(state, dec.first_tokens(x))   # tokens (B,) -> next-token log-probs (B, V)
    dec.reorder(state, index)           # keep / duplicate batch rows (beam search)
The decoder says what its first step feeds (a GPT: its prompt's last token, the rest of the
prompt going through in the same pass; an encoder-decoder: its start id, <bos>), the id that
ends a row (an encoder-decoder's <eos>; a GPT has none, and runs to the length it is given),
the ids it never produces (an encoder-decoder's <pad> and <bos>), and how text becomes its
input and its output becomes text.

Sampling turns each step's log-probabilities (B, V) into a next token:
    repetition penalty  (CTRL) a token already in the sequence has its log-probability
                        multiplied by p (log-probabilities are <= 0, so p > 1 lowers it)
    temperature         logp / T; T = 0 means greedy (argmax)
    top-k               keep the k largest
    top-p (nucleus)     keep the smallest set of tokens whose probabilities sum to >= p
    sample              from the softmax of what is left
(A log-probability is its logit minus a per-row constant, so temperature, top-k and top-p do
exactly what they do to logits.)

Beam search keeps the ``beam`` best partial outputs by total log-probability; a finished one
is ranked by  log p(y | x) / lp(y),  lp(y) = ((5 + |y|) / 6) ** alpha  (Wu et al., 2016, |y|
counting <eos>), so alpha > 0 stops the search from preferring short outputs. With beam = 1 it
makes exactly the greedy choices. A GPT has no <eos>: its hypotheses all run to ``max_len``.

Past the block: window policies of a GPT
----------------------------------------
A GPT has positions for ``block_size`` tokens. With c tokens so far (prompt included) and
c > block_size, the next token is predicted from a window, by one of four policies:

slide (the default)  nanoGPT's: the context is the last block_size tokens, ids[c - block : c],
    at positions 0 .. block - 1, recomputed in one pass at every step (with ``logits_to_keep``
    = 1). Exact, and as costly per token as a forward pass over a whole block. No cache can
    help: when the window slides by one token every kept token moves one position (learned and
    sinusoidal positions are added to its embedding), and, from the second layer on, its key
    and value were computed while it attended to the token that has just left the window (so
    even rotary keys, whose scores depend only on relative distance, are stale).
shift                llama.cpp's context shift, recomputed: the context is ids[s : c], where s
    is the smallest multiple of h = block // 2 that leaves at most block tokens,
    s = h * ceil(max(0, c - block) / h). Each token is predicted exactly as a fresh forward
    pass over that context would predict it. When s moves (every h tokens) the window's h + 1
    tokens are prefilled into the KV cache in one pass; in between, each token costs one
    position. The context holds between block - h + 1 and block tokens.
ring                 rotary positions only: sliding-window attention. Every position attends to
    itself and the block - 1 positions before it, in every layer, and its keys and values are
    computed once, when it is fed: the KV cache is a ring of block slots in which a new
    position overwrites the oldest. Equivalently, one forward pass over the whole sequence
    with the causal mask narrowed to a band of width block, and rotary angles taken at
    absolute positions (only differences, all < block, matter; the cache moves every position
    down by h whenever the next would leave the rotary table, which changes no score). Within
    the block it is slide. Past it, it APPROXIMATES slide: at the first layer the next token's
    attention is the same, but from the second layer on a kept token's key and value are the
    ones computed when it was fed, when it attended to tokens that have since left the window
    (its receptive field reaches n_layer * (block - 1) tokens back), where slide recomputes
    them from the window alone. One position per token, whatever the length. Learned and
    sinusoidal positions are refused: a kept token's position would have to change.
sinks (``"sinks"``, or ``"sinks:K"``; K = 4 by default) rotary positions only: StreamingLLM's
    cache (Xiao et al. 2023), ring's with the first K tokens kept for good beside a ring of the
    last w = block - K (``attnlab.attention.SinkKVCache``). Its definition: in every layer,
    position t attends to positions 0 .. K-1 and t - w + 1 .. t, each key and value computed
    once, when fed; a window key at its true distance t - j, sink i at distance
    min(t, block - 1) - i (positions as the cache holds them: the sinks just before the
    window, so that no distance exceeds the block). With one layer that is exactly a fresh
    pass over the first K tokens and the last w. One position per token; learned and
    sinusoidal positions are refused, as for ring.
Within the block all four are the KV cache, and equal to a forward pass over the prompt and
every token since. Without the cache (``use_cache=False``) slide and shift recompute their
window at every step; ring and sinks need the cache. A GPT's steps run ``attnlab.decoding.FastForward``:
forward's math without its per-module overhead, which is about half a one-token step's cost;
it steps aside for ``forward`` whenever something would see the difference (a recording or an
edit, hooks, training mode, a module kind it does not restate).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from attnlab.decoding import WINDOWS, Decoder, decoder_for
from attnlab.modes import evaluating
from attnlab.tokenizers import PAD  # what pad_ids pads sources with

__all__ = ["WINDOWS", "decoder_for", "SamplingConfig", "generate", "generate_ids", "greedy", "beam_search",
           "beam_generate", "translate", "next_token_logprobs", "Hypothesis", "Sample",
           "length_penalty", "pad_ids"]  # fmt: skip


@dataclasses.dataclass
class SamplingConfig:
    """How ``generate`` samples; these defaults are the ``attnlab generate`` verb's and
    ``Run.generate``'s too (the CLI reads them from here)."""

    max_new_tokens: int | None = 200  # None: an encoder-decoder's default (2 * source + 10)
    temperature: float = 0.8
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        if self.max_new_tokens is not None and self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k <= 0:
            raise ValueError(f"top_k must be positive, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be positive, got {self.repetition_penalty}")


def apply_repetition_penalty(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """CTRL: a seen token's score is divided by p if positive, multiplied by p if not.
    logits (B, V); seen (B, V) bool: tokens already in each sequence."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set every logit outside the top-k / top-p set to -inf. logits (B, V)."""
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1) the k-th largest
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # probability mass of the tokens ranked higher
        drop_sorted = before >= top_p  # the first token is never dropped
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_token(
    logp: Tensor, cfg: SamplingConfig, seen: Tensor | None, generator: torch.Generator | None
) -> Tensor:
    """(B, V) log-probabilities of the next token -> (B,) token ids."""
    if seen is not None:
        logp = apply_repetition_penalty(logp, seen, cfg.repetition_penalty)
    if cfg.temperature == 0:
        return logp.argmax(dim=-1)
    logp = filter_logits(logp / cfg.temperature, cfg.top_k, cfg.top_p)
    probs = torch.softmax(logp, dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


# ---------------------------------------------------------------------------------------------
# The protocol, for any model
# ---------------------------------------------------------------------------------------------


def decoding(fn: Callable) -> Callable:
    """Run ``fn(model, ...)`` in eval mode without autograd (torch.inference_mode), and hand
    the model back in the mode it came in (sampling an example mid-training leaves it
    training)."""

    @functools.wraps(fn)
    def run(model: nn.Module, *args, **kwargs):
        with evaluating(model), torch.inference_mode():
            return fn(model, *args, **kwargs)

    return run


def begin(
    dec: Decoder, x: Tensor, max_len: int, window: str = "slide", use_cache: bool = True
) -> tuple[object, Tensor]:
    """The decoder's ``start`` on ``x`` (B, T) (which refuses a window it cannot read), and the
    tokens (B,) its first step feeds."""
    return dec.start(x, max_len, window=window, use_cache=use_cache), dec.first_tokens(x)


@decoding
def next_token_logprobs(model: nn.Module, x: Tensor, window: str = "slide") -> Tensor:
    """The protocol's first step alone: log p(next token | prompt) for a GPT's prompts
    ``x`` (B, T) (past block_size, read through ``window``), or log p(first output token |
    source) for an encoder-decoder's sources (B, S), the ids its decoder never emits excluded.
    -> (B, V)."""
    x = x.to(next(model.parameters()).device)
    dec = decoder_for(model)
    state, tokens = begin(dec, x, 1, window)
    return dec.forbid(dec.step(state, tokens))  # (B, V)


def pad_ids(seqs: list[list[int]], pad: int = PAD, device=None) -> Tensor:
    """Right-pad lists of ids into a (B, L) tensor."""
    L = max(1, max((len(s) for s in seqs), default=1))
    out = torch.full((len(seqs), L), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out.to(device) if device is not None else out


def default_max_len(model, src_len: int, max_len: int | None = None) -> int:
    """Longest output tried: ``max_len`` or twice the source plus 10, within the positions its
    decoder may fill (a Transformer's ``config.max_len`` holds <bos> too)."""
    return decoder_for(model).default_length(src_len, max_len)


@decoding
def generate_ids(
    model: nn.Module,
    prompt: Tensor,
    cfg: SamplingConfig,
    use_cache: bool = True,
    on_step: Callable[[Tensor], bool] | None = None,
    window: str = "slide",
) -> Tensor:
    """Sample up to ``cfg.max_new_tokens`` tokens after ``prompt`` (B, T0) (an encoder-decoder:
    from the source (B, S)); returns the new ids (B, n_new). A row that has produced its
    decoder's end id (an encoder-decoder's <eos>) gets its pad id after it, and decoding stops
    when every row has.

    ``on_step(tokens (B,))`` is called after every step; returning True stops early (stop
    strings are checked there). Rows of a batch are independent but share the prompt length.
    """
    device = next(model.parameters()).device
    x = prompt.to(device)
    B = x.size(0)
    dec = decoder_for(model)
    steps = dec.length(x.size(1), cfg.max_new_tokens)
    state, tokens = begin(dec, x, max(steps, 1), window, use_cache)
    generator = None
    if cfg.seed is not None:
        generator = torch.Generator(device=device).manual_seed(cfg.seed)
    seen = None
    if cfg.repetition_penalty != 1.0:
        seen = torch.zeros(B, dec.vocab_size, dtype=torch.bool, device=device)
        if dec.continues_prompt:  # the prompt's tokens are already in the sequence
            seen.scatter_(1, x, True)
    end = dec.end_id  # None: every row runs to ``steps``
    done = torch.zeros(B, dtype=torch.bool, device=device)
    out = torch.full((B, steps), dec.pad_id, dtype=torch.long, device=device)  # (B, steps)
    n = 0
    while n < steps:
        logp = dec.forbid(dec.step(state, tokens))  # (B, V)
        tokens = next_token(logp, cfg, seen, generator)  # (B,)
        if end is not None:
            tokens = tokens.masked_fill(done, dec.pad_id)
            done |= tokens == end
        out[:, n] = tokens
        n += 1
        if seen is not None:
            seen.scatter_(1, tokens[:, None], True)
        if on_step is not None and on_step(tokens):
            break
        if end is not None and bool(done.all()):
            break
    return out[:, :n]


@torch.inference_mode()
def greedy(
    model, src: Tensor, max_len: int | None = None, *, window: str = "slide"
) -> list[list[int]]:
    """Pick the most probable token at every step, for a batch ``src`` (B, S) (a GPT: a prompt).

    Returns each row's output ids without <eos> (stopped at <eos> or after ``max_len`` tokens).
    """
    max_len = default_max_len(model, src.size(1), max_len)
    ids = generate_ids(model, src, SamplingConfig(max_len, temperature=0.0), window=window)
    end = decoder_for(model).end_id  # None (a GPT): the rows run to max_len
    return [row[: row.index(end)] if end in row else row for row in ids.tolist()]


@dataclasses.dataclass
class Hypothesis:
    tokens: list[int]  # output ids, without <eos>
    logprob: float  # log p(tokens, <eos> | source); a GPT's: log p(tokens | prompt)
    score: float  # logprob / lp(length)
    finished: bool


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's lp = ((5 + length) / 6) ** alpha; alpha = 0 ranks by plain log-probability."""
    return ((5 + length) / 6) ** alpha


@decoding
def beam_search(
    model,
    src: Tensor,
    beam: int = 4,
    alpha: float = 0.6,
    max_len: int | None = None,
    *,
    window: str = "slide",
    use_cache: bool = True,
) -> list[Hypothesis]:
    """Beam search for ONE source (1, S) (a GPT: one prompt). Returns up to ``beam``
    hypotheses, best first.

    At each step every live hypothesis is extended by every token; the best 2 * beam extensions
    are read in order: one ending in <eos> is set aside as finished, the others refill the beam.
    The search stops when ``beam`` hypotheses have finished, or after ``max_len`` tokens.
    """
    if src.size(0) != 1:
        raise ValueError("beam_search decodes one source at a time: src must be (1, S)")
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    dec = decoder_for(model)
    max_len = dec.default_length(src.size(1), max_len)
    state, last = begin(dec, src, max_len + 1, window, use_cache)
    alive: list[list[int]] = [[]]
    scores = torch.zeros(1, device=src.device)  # (K,) total log-probabilities of the live beams
    finished: list[Hypothesis] = []
    for step in range(max_len):
        logp = dec.forbid(dec.step(state, last))  # (K, V)
        V = logp.size(-1)
        total = (scores[:, None] + logp).view(-1)  # (K * V,)
        top_scores, top_idx = total.topk(min(2 * beam, int(torch.isfinite(total).sum())))
        origins, new_alive, new_scores, new_last = [], [], [], []
        for s, idx in zip(top_scores.tolist(), top_idx.tolist()):
            k, tok = divmod(idx, V)
            if tok == dec.end_id:  # never, for a decoder with no end id (a GPT)
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
            dec.reorder(state, torch.tensor(origins, dtype=torch.long, device=src.device))
    else:  # ran out of length: the live beams count, unfinished
        for toks, s in zip(alive, scores.tolist()):
            finished.append(Hypothesis(toks, s, s / length_penalty(len(toks), alpha), False))
    finished.sort(key=lambda h: h.score, reverse=True)
    return finished[:beam]


def translate(model, tokenizer, texts: list[str], beam: int = 1, alpha: float = 0.6,
              max_len: int | None = None) -> list[str]:  # fmt: skip
    """Source texts -> translations, greedy (beam = 1, batched) or by beam search."""
    if beam > 1:
        return [row[0].text for row in beam_generate(model, tokenizer, texts, beam, alpha, max_len)]
    device, dec = next(model.parameters()).device, decoder_for(model)
    srcs = [dec.encode(tokenizer, t) for t in texts]
    outs = greedy(model, pad_ids(srcs, device=device), max_len)
    return [dec.decode(tokenizer, o) for o in outs]


# ---------------------------------------------------------------------------------------------
# Text in, text out
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Sample:
    prompt: str
    text: str  # the continuation (an encoder-decoder: the output), cut before any stop string
    ids: list[int]
    stopped: bool = False


def generate(
    model: nn.Module,
    tokenizer,
    prompts: Sequence[str] | str,
    cfg: SamplingConfig | None = None,
    *,
    stop: Sequence[str] = (),
    num_samples: int = 1,
    use_cache: bool = True,
    stream: Callable[[str], None] | None = None,
    window: str = "slide",
) -> list[Sample]:
    """Continue each prompt ``num_samples`` times (an encoder-decoder: sample outputs for each
    source text). Prompts of equal token length are decoded together as one batch.
    ``stream(text)`` receives the continuation of a single sequence piece by piece as it is
    produced (only when exactly one sequence is generated).
    """
    cfg = cfg or SamplingConfig()
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    dec = decoder_for(model)
    encoded = [dec.encode(tokenizer, p) for p in prompts]
    decode, end = functools.partial(dec.decode, tokenizer), dec.end_id
    jobs = [(i, s) for i in range(len(prompts)) for s in range(num_samples)]
    results: dict[tuple[int, int], Sample] = {}
    by_length: dict[int, list[tuple[int, int]]] = {}
    for job in jobs:
        by_length.setdefault(len(encoded[job[0]]), []).append(job)
    single = len(jobs) == 1
    for group in by_length.values():
        prompt = torch.tensor([encoded[i] for i, _ in group], dtype=torch.long)  # (B, T0)
        watch = _StopWatch(decode, len(group), stop, stream if single else None, end)
        generate_ids(model, prompt, cfg, use_cache=use_cache, on_step=watch, window=window)
        for b, (i, s) in enumerate(group):
            text, stopped = watch.finish(b)
            results[(i, s)] = Sample(prompts[i], text, watch.gen[b], stopped=stopped)
    return [results[j] for j in jobs]


def beam_generate(
    model: nn.Module,
    tokenizer,
    prompts: Sequence[str],
    beam: int = 4,
    alpha: float = 0.6,
    max_new_tokens: int | None = None,
    *,
    n_best: int = 1,
    window: str = "slide",
    use_cache: bool = True,
) -> list[list[Sample]]:
    """Beam search from each prompt (an encoder-decoder: from each source text), one prompt
    at a time: its ``n_best`` hypotheses, best first, as Samples (``text`` the continuation, or
    the output). ``max_new_tokens`` None: an encoder-decoder's default; a GPT needs one."""
    dec = decoder_for(model)
    dec.length(1, max_new_tokens, "beam-search")  # a decoder with no end id needs a length
    device = next(model.parameters()).device
    out = []
    for p in prompts:
        x = torch.tensor([dec.encode(tokenizer, p)], dtype=torch.long, device=device)  # (1, T)
        hyps = beam_search(model, x, beam, alpha, max_new_tokens, window=window,
                           use_cache=use_cache)  # fmt: skip
        out.append([Sample(p, dec.decode(tokenizer, h.tokens), h.tokens) for h in hyps[:n_best]])
    return out


class _StopWatch:
    """Collects each row's new tokens, ends a row at ``end`` (<eos>) or at its first stop
    string, and streams the text of a lone row as it grows (holding back what may still turn
    into a stop string, or a character whose bytes are not all there yet)."""

    def __init__(
        self,
        decode: Callable[[list[int]], str],
        B: int,
        stop: Sequence[str],
        stream: Callable[[str], None] | None,
        end: int | None = None,
    ):
        self.decode, self.stop, self.stream, self.end = decode, [s for s in stop if s], stream, end
        self.done = [False] * B
        self.gen: list[list[int]] = [[] for _ in range(B)]
        self.printed = 0
        self.hold = max((len(s) for s in self.stop), default=1) - 1

    def _cut(self, text: str) -> int:
        return min((text.find(s) for s in self.stop if s in text), default=-1)

    def __call__(self, tok: Tensor) -> bool:
        for b, t in enumerate(tok.tolist()):
            if self.done[b]:
                continue
            if t == self.end:
                self.done[b] = True
                continue
            self.gen[b].append(t)
            if not self.stop and self.stream is None:
                continue
            text = self.decode(self.gen[b])
            cut = self._cut(text)
            self.done[b] = cut >= 0
            if self.stream is not None:
                upto = cut if cut >= 0 else len(text.rstrip("\ufffd")) - self.hold
                self._emit(text, upto)
        return all(self.done)

    def _emit(self, text: str, upto: int) -> None:
        if upto > self.printed:
            self.stream(text[self.printed : upto])
            self.printed = upto

    def finish(self, b: int) -> tuple[str, bool]:
        text = self.decode(self.gen[b])
        cut = self._cut(text)
        text = text[:cut] if cut >= 0 else text
        if self.stream is not None:
            self._emit(text, len(text))
        return text, cut >= 0
