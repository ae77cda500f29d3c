"""Clean/corrupt pairs and the metric a circuit is measured by.

A pair is two inputs of the same length that differ in a detail, and the output that tells
them apart: the clean input gives ``target``; the corrupt one should not. The metric, at one
output position of each pair (``Subject.metric_position``: the last, a masked LM's first
[MASK], a classifier's class, an encoder-decoder's first step whose output is the target), is

    logit-diff   logit(target) - logit(foil)          (every pair names a foil)
    logprob      log p(target) = log_softmax(logits)[target]

Pairs come from the command line, from a file (TSV: clean<TAB>corrupt<TAB>target[<TAB>foil],
one pair a line; blank lines and lines starting with # are skipped; the text is taken as it is,
spaces included), or are made: ``induction_pairs`` draws r r against r' r (random tokens
repeated, the first half changed), the known answer of an induction model.

``prepare_pairs`` makes them ready to run: each pair's clean and corrupt inputs (an
encoder-decoder's decoder reads the clean greedy translation in both), the target's and
foil's ids and the metric position, stacked into batches of pairs whose inputs have the same
shape (``Batch``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from attnlab.interventions.subjects import InterventionError, Subject

METRICS = ("logit-diff", "logprob")
METRIC_WORDS = {"logit-diff": "logit(target) - logit(foil)", "logprob": "log p(target)"}


@dataclass(frozen=True)
class Pair:
    clean: str
    corrupt: str
    target: str
    foil: str | None = None


@dataclass
class PromptSet:
    """The pairs a result was measured on, and how to say where they came from."""

    pairs: list[Pair]
    source: str  # "1 pair given", "FILE (12 pairs)", "induction: 32 pairs r r vs r' r, ..."

    def __len__(self) -> int:
        return len(self.pairs)


def read_pairs(path: str | Path) -> PromptSet:
    """The pairs of a TSV file (see the module doc); one clear line for a malformed one."""
    p = Path(path)
    pairs = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split("\t")
        if len(cells) not in (3, 4):
            raise InterventionError(f"{p} line {n}: expected clean<TAB>corrupt<TAB>target"
                                    f"[<TAB>foil], got {len(cells)} field"
                                    f"{'s' * (len(cells) != 1)}")  # fmt: skip
        if any(c == "" for c in cells):
            raise InterventionError(f"{p} line {n}: an empty field")
        pairs.append(Pair(*cells))
    if not pairs:
        raise InterventionError(f"{p} has no pairs (a line is clean<TAB>corrupt<TAB>target"
                                "[<TAB>foil])")  # fmt: skip
    return PromptSet(pairs, f"{p} ({len(pairs)} pair{'s' * (len(pairs) != 1)})")


def one_pair(clean: str, corrupt: str, target: str, foil: str | None = None) -> PromptSet:
    return PromptSet([Pair(clean, corrupt, target, foil)], f"one pair: {clean!r} vs {corrupt!r}")


def induction_pairs(subject: Subject, n: int = 32, half: int = 12, seed: int = 0) -> PromptSet:
    """``n`` pairs of ``half`` random tokens r, all different, repeated: clean r r and corrupt
    r' r, r' drawn from the tokens r does not use (so nothing in the corrupt input's first
    half repeats). The metric reads the last position, where an induction head predicts r[0]
    (target) from the clean input; the foil is r'[0]. The tokens are the vocabulary's own,
    written as text: the vocabulary must read each back as itself (a character vocabulary,
    as `attnlab train --task induction` makes)."""
    tok = subject.tokenizer
    vocab = getattr(subject.output_vocab, "vocab_size", 0)
    if subject.model.reads != "text" or subject.model.predicts != "next-token" or not vocab:
        raise InterventionError("the induction pairs are for a GPT (a next-token model reading "
                                "text); give --pairs FILE or --clean/--corrupt")  # fmt: skip
    if 2 * half > vocab:
        raise InterventionError(f"induction pairs of {half} tokens need 2 x {half} different "
                                f"tokens; the vocabulary has {vocab}")  # fmt: skip
    names = [tok.decode([i]) for i in range(vocab)]
    usable = [
        i for i, s in enumerate(names) if s and tok.encode(s, add_special_tokens=False) == [i]
    ]
    if len(usable) < 2 * half:
        raise InterventionError(f"the induction pairs need {2 * half} tokens that read back as "
                                f"themselves; this vocabulary has {len(usable)} (a character "
                                "vocabulary has them all): give --pairs FILE")  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        order = torch.randperm(len(usable), generator=g)[: 2 * half].tolist()
        r, r2 = [usable[i] for i in order[:half]], [usable[i] for i in order[half:]]
        text = lambda ids: "".join(names[i] for i in ids)  # noqa: E731
        pairs.append(Pair(text(r + r), text(r2 + r), names[r[0]], names[r2[0]]))
    return PromptSet(pairs, f"induction: {n} pairs r r vs r' r of {half} random tokens "
                            f"(seed {seed}; target r[0], foil r'[0])")  # fmt: skip


@dataclass
class Batch:
    """Pairs whose inputs have one shape, stacked: ``clean`` and ``corrupt`` are the forward
    pass's arguments (B, ...); ``target``, ``foil`` (or None) and ``position`` (B,) where the
    metric reads; ``index`` the pairs' places in their PromptSet."""

    index: list[int]
    clean: tuple
    corrupt: tuple
    target: Tensor
    foil: Tensor | None
    position: Tensor
    lengths: dict[str, int]  # positions of each stack's stream
    tokens: dict[str, list[str]] = field(default_factory=dict)  # the first pair's, per stack

    def __len__(self) -> int:
        return len(self.index)

    def repeat(self, k: int) -> Batch:
        """The batch k times over (rows k*B), for k interventions run side by side."""
        rep = lambda t: t.repeat(k, *([1] * (t.dim() - 1)))  # noqa: E731
        return Batch(self.index * k, tuple(map(rep, self.clean)), tuple(map(rep, self.corrupt)),
                     rep(self.target), None if self.foil is None else rep(self.foil),
                     rep(self.position), self.lengths, self.tokens)  # fmt: skip


def metric_values(logits: Tensor, batch: Batch, metric: str) -> Tensor:
    """(B,) the metric of each row of ``logits`` (B, T, V) at its pair's position."""
    rows = torch.arange(logits.size(0), device=logits.device)
    x = logits[rows, batch.position.to(logits.device)].double()  # (B, V)
    t = batch.target.to(logits.device)
    if metric == "logprob":
        return torch.log_softmax(x, dim=-1)[rows, t]
    return x[rows, t] - x[rows, batch.foil.to(logits.device)]


def prepare_pairs(subject: Subject, prompts: PromptSet, metric: str,
                  position: int | None = None) -> list[Batch]:  # fmt: skip
    """Every pair made ready to run (see the module doc), in batches of one input shape, in
    the order of their first pair. A pair whose clean and corrupt inputs differ in length,
    or whose target or foil is not one token (a class), is refused in one line naming it."""
    if metric not in METRICS:
        raise InterventionError(f"--metric must be one of {', '.join(METRICS)}, got {metric!r}")
    groups: dict[tuple, list] = {}
    many = len(prompts) > 1
    for n, pair in enumerate(prompts.pairs):
        where = f"pair {n + 1}: " if many else ""
        try:
            t = subject.token_id(pair.target)
            f = subject.token_id(pair.foil) if pair.foil is not None else None
        except InterventionError as e:
            raise InterventionError(f"{where}{e}") from None
        if metric == "logit-diff" and f is None:
            raise InterventionError(f"{where}the metric logit-diff needs a foil (the 4th field "
                                    "of a pair, --foil): or use --metric logprob")  # fmt: skip
        clean = subject.prepare(pair.clean)
        corrupt = subject.prepare(pair.corrupt, decoder_like=clean)
        shapes = tuple(tuple(a.shape) for a in clean.args)
        if shapes != tuple(tuple(a.shape) for a in corrupt.args):
            raise InterventionError(
                f"{where}clean has {len(clean.input_tokens)} tokens and corrupt "
                f"{len(corrupt.input_tokens)}: a pair's inputs must have the same length, so "
                "that they line up position by position"
            )
        pos = subject.metric_position(clean, position, t)
        groups.setdefault(shapes, []).append((n, clean, corrupt, t, f, pos))
    out = []
    for rows in groups.values():
        n, clean, corrupt, t, f, pos = zip(*rows)
        foil = torch.tensor(f) if metric == "logit-diff" else None
        lengths = {stack: len(toks) for stack, toks in clean[0].stack_tokens.items()}
        out.append(Batch(list(n), tuple(torch.cat(a) for a in zip(*(c.args for c in clean))),
                         tuple(torch.cat(a) for a in zip(*(c.args for c in corrupt))),
                         torch.tensor(t), foil, torch.tensor(pos), lengths,
                         dict(clean[0].stack_tokens)))  # fmt: skip
    return out
