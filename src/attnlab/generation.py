"""Sampling text from a language model, one token at a time.

Each step turns the last position's logits (B, V) into a next token:
    repetition penalty  (CTRL: a logit of a token already in the sequence is divided by p if
                         positive, multiplied by p if negative)
    temperature         logits / T; T = 0 means greedy (argmax)
    top-k               keep the k largest logits
    top-p (nucleus)     keep the smallest set of tokens whose probabilities sum to >= p
    sample              from softmax of what is left

With the KV cache (the default) the prompt is run once ("prefill") and every later step feeds
only the newest token: the keys and values of earlier positions are read from the cache.
Without it (``use_cache=False``) every step recomputes the whole context.

Once the context outgrows ``block_size``, both paths crop it to the last ``block_size`` tokens
and recompute all of them, every step: the cache cannot help there, for any position scheme.
When the window slides by one token, every kept token moves one position (learned and
sinusoidal positions are added to its embedding), and, from the second layer on, its key and
value were computed while attending to the token that has just dropped out of the window (so
even rotary keys, whose scores depend only on relative distance, are stale). Reusing them would
sample from a different distribution than the model defines; both paths give the same tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn


@dataclasses.dataclass
class SamplingConfig:
    max_new_tokens: int = 200
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        if self.max_new_tokens < 0:
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
    """logits (B, V); seen (B, V) bool: tokens already in each sequence."""
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
    logits: Tensor, cfg: SamplingConfig, seen: Tensor | None, generator: torch.Generator | None
) -> Tensor:
    """(B, V) logits of the last position -> (B,) next token ids."""
    logits = logits.float()
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, cfg.repetition_penalty)
    if cfg.temperature == 0:
        return logits.argmax(dim=-1)
    logits = filter_logits(logits / cfg.temperature, cfg.top_k, cfg.top_p)
    probs = torch.softmax(logits, dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate_ids(
    model: nn.Module,
    prompt: Tensor,
    cfg: SamplingConfig,
    use_cache: bool = True,
    on_step: Callable[[Tensor], bool] | None = None,
) -> Tensor:
    """Continue ``prompt`` (B, T0) by up to ``cfg.max_new_tokens``; returns (B, n_new) new ids.

    ``on_step(tokens (B,))`` is called after every step; returning True stops early (stop
    strings are checked there). Rows of a batch are independent but share the prompt length.
    """
    model.eval()
    block = model.config.block_size
    device = next(model.parameters()).device
    ids = prompt.to(device)  # (B, T) everything so far
    B = ids.size(0)
    generator = None
    if cfg.seed is not None:
        generator = torch.Generator(device=device).manual_seed(cfg.seed)
    seen = None
    if cfg.repetition_penalty != 1.0:
        seen = torch.zeros(B, model.config.vocab_size, dtype=torch.bool, device=device)
        seen.scatter_(1, ids, True)
    cache = model.new_cache(B, block) if use_cache else None
    new = []
    for step in range(cfg.max_new_tokens):
        if not use_cache or ids.size(1) > block:
            # the last block_size tokens, all recomputed (past block_size a cache cannot help)
            logits = model(ids[:, -block:], logits_to_keep=1)[:, -1]  # (B, V)
        elif step == 0:
            logits = model(ids, cache=cache, logits_to_keep=1)[:, -1]  # prefill the prompt
        else:
            logits = model(ids[:, -1:], cache=cache)[:, -1]  # feed only the newest token
        tok = next_token(logits, cfg, seen, generator)  # (B,)
        ids = torch.cat([ids, tok[:, None]], dim=1)
        new.append(tok)
        if seen is not None:
            seen.scatter_(1, tok[:, None], True)
        if on_step is not None and on_step(tok):
            break
    if not new:
        return torch.zeros(B, 0, dtype=torch.long, device=device)
    return torch.stack(new, dim=1)  # (B, n_new)


@dataclasses.dataclass
class Sample:
    prompt: str
    text: str  # the continuation only, cut before any stop string
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
) -> list[Sample]:
    """Continue each prompt ``num_samples`` times. Prompts of equal token length are decoded
    together as one batch. ``stream(text)`` receives the continuation of a single sequence
    piece by piece as it is produced (only when exactly one sequence is generated).
    """
    cfg = cfg or SamplingConfig()
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    encoded = [_encode_prompt(tokenizer, p) for p in prompts]
    jobs = [(i, s) for i in range(len(prompts)) for s in range(num_samples)]
    results: dict[tuple[int, int], Sample] = {}
    by_length: dict[int, list[tuple[int, int]]] = {}
    for job in jobs:
        by_length.setdefault(len(encoded[job[0]]), []).append(job)
    single = len(jobs) == 1
    for group in by_length.values():
        prompt = torch.tensor([encoded[i] for i, _ in group], dtype=torch.long)  # (B, T0)
        watch = _StopWatch(tokenizer, len(group), stop, stream if single else None)
        generate_ids(model, prompt, cfg, use_cache=use_cache, on_step=watch)
        for b, (i, s) in enumerate(group):
            text, stopped = watch.finish(b)
            results[(i, s)] = Sample(prompts[i], text, watch.gen[b], stopped=stopped)
    return [results[j] for j in jobs]


class _StopWatch:
    """Collects each row's new tokens, stops a row at its first stop string, and streams the
    text of a lone row as it grows (holding back what may still turn into a stop string, or a
    character whose bytes are not all there yet)."""

    def __init__(
        self, tokenizer, B: int, stop: Sequence[str], stream: Callable[[str], None] | None
    ):
        self.tokenizer, self.stop, self.stream = tokenizer, [s for s in stop if s], stream
        self.done = [False] * B
        self.gen: list[list[int]] = [[] for _ in range(B)]
        self.printed = 0
        self.hold = max((len(s) for s in self.stop), default=1) - 1

    def _cut(self, text: str) -> int:
        return min((text.find(s) for s in self.stop if s in text), default=-1)

    def __call__(self, tok: Tensor) -> bool:
        for b, done in enumerate(self.done):
            if done:
                continue
            self.gen[b].append(int(tok[b]))
            text = self.tokenizer.decode(self.gen[b])
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
        text = self.tokenizer.decode(self.gen[b])
        cut = self._cut(text)
        text = text[:cut] if cut >= 0 else text
        if self.stream is not None:
            self._emit(text, len(text))
        return text, cut >= 0


def _encode_prompt(tokenizer, prompt: str) -> list[int]:
    ids = tokenizer.encode(prompt)
    if not ids:  # an empty prompt: start from a newline if the vocabulary has one, else id 0
        try:
            ids = tokenizer.encode("\n")[:1]
        except ValueError:
            ids = []
    return ids or [0]
