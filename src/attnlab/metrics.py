"""A task's figures: what each is called (``Metric``), and the scores computed here from
counts (no metric library) that ``attnlab eval`` reports besides the loss.

A ``Metric`` is a figure a task reports at each evaluation, with its words, unit and
direction: the Trainer keeps the best checkpoint by the task's declared best metric, and the
progress lines, metrics.jsonl and loss.png name each figure as the task does (a language model
reports perplexity and bits per character; a classifier, accuracy; an encoder-decoder, exact
match).

Classification, from the confusion matrix ``C`` (rows = true class, columns = predicted):
    accuracy       trace(C) / sum(C)
    precision_k    C[k, k] / sum_i C[i, k]   (of what was called k, how much was k; 0 if none)
    recall_k       C[k, k] / sum_j C[k, j]   (of what was k, how much was found; 0 if none)
    F1_k           2 P R / (P + R)           (0 when P + R = 0)
    macro average  the unweighted mean over classes

Translation (corpus level: statistics are summed over sentences, then combined once):
    BLEU   Papineni et al. (2002): the geometric mean of the clipped n-gram precisions
           p_1..p_4 times the brevity penalty BP = min(1, exp(1 - r / c)), r the reference
           length and c the output length in words; 100 x. Words come from the mteval-v13a
           tokenizer rules (punctuation split off; '.', ',' and '-' stay inside numbers). An
           order with matches = 0 gets p_n = 1 / (2^k total_n), k counting such orders (the
           NIST "exp" smoothing, SacreBLEU's default), so one missing 4-gram does not zero a
           corpus; an order with no n-grams at all, or no match of any order, gives 0.
    chrF   Popovic (2015): character n-grams of n = 1..6 with whitespace removed; precision
           and recall are averaged over the orders both sides have, then
           F_beta = (1 + b^2) P R / (b^2 P + R) with b = 2 (recall weighs more); 100 x.

In-context learning, on sequences r r (a random r, then r again):
    half losses   the next-token loss on the first half (nothing in the context gives r[1:]
                  away) and on the repeated half (an induction head can copy r)
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------
# Metric: a figure with its words, unit and direction
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str  # its key in metrics.jsonl, e.g. "val_exact"
    label: str  # its words in logs and plots, e.g. "exact match"
    unit: str = ""  # e.g. "nats/token", "bits/char"; "%" shows a fraction as a percentage
    higher_is_better: bool = False

    def format(self, value: float) -> str:
        if self.unit == "%":
            return f"{100 * value:.1f}%"
        return f"{value:.4f}"

    def better(self, a: float, b: float | None) -> bool:
        """Is ``a`` better than ``b`` (None: nothing yet)?"""
        if b is None:
            return True
        return a > b if self.higher_is_better else a < b


def val_loss_metric(loss_unit: str) -> Metric:
    return Metric("val_loss", "val loss", loss_unit)


# ---------------------------------------------------------------------------------------------
# Classification
# ---------------------------------------------------------------------------------------------


def confusion_matrix(true: Sequence[int], pred: Sequence[int], n_classes: int) -> np.ndarray:
    """(n_classes, n_classes) counts: entry [i, j] = examples of class i predicted as j."""
    if len(true) != len(pred):
        raise ValueError(f"{len(true)} true labels but {len(pred)} predictions")
    m = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(m, (np.asarray(true, dtype=np.int64), np.asarray(pred, dtype=np.int64)), 1)
    return m


def per_class(confusion: np.ndarray) -> dict[str, np.ndarray]:
    """Precision, recall, F1 and support (true count) of every class, from a confusion matrix."""
    c = np.asarray(confusion, dtype=np.float64)
    hit = np.diag(c)
    called, actual = c.sum(0), c.sum(1)  # predicted as k, truly k
    precision = np.divide(hit, called, out=np.zeros_like(hit), where=called > 0)
    recall = np.divide(hit, actual, out=np.zeros_like(hit), where=actual > 0)
    both = precision + recall
    f1 = np.divide(2 * precision * recall, both, out=np.zeros_like(hit), where=both > 0)
    return {"precision": precision, "recall": recall, "f1": f1, "support": actual.astype(np.int64)}


def accuracy(confusion: np.ndarray) -> float:
    total = int(np.sum(confusion))
    return float(np.trace(confusion)) / total if total else 0.0


def classification_report(confusion: np.ndarray, classes: Sequence[str]) -> dict:
    """Accuracy, macro P/R/F1 and the per-class table (JSON-ready) of a confusion matrix."""
    pc = per_class(confusion)
    return {
        "accuracy": accuracy(confusion),
        "macro_precision": float(pc["precision"].mean()),
        "macro_recall": float(pc["recall"].mean()),
        "macro_f1": float(pc["f1"].mean()),
        "examples": int(np.sum(confusion)),
        "per_class": [
            {
                "label": str(k),
                "precision": float(p),
                "recall": float(r),
                "f1": float(f),
                "support": int(s),
            }
            for k, p, r, f, s in zip(
                classes, pc["precision"], pc["recall"], pc["f1"], pc["support"]
            )
        ],  # fmt: skip
        "confusion": np.asarray(confusion).tolist(),
        "classes": [str(k) for k in classes],
    }


# ---------------------------------------------------------------------------------------------
# BLEU
# ---------------------------------------------------------------------------------------------

_PUNCT = re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])")  # every ASCII symbol except ' , - .
_DOT_AFTER = re.compile(r"([^0-9])([\.,])")
_DOT_BEFORE = re.compile(r"([\.,])([^0-9])")
_DASH = re.compile(r"([0-9])(-)")


def bleu_words(text: str) -> list[str]:
    """The mteval-v13a word split: symbols become words; '.' and ',' too unless inside a number;
    '-' after a digit too (so '2026-11-21' is five words)."""
    t = _PUNCT.sub(r" \1 ", " " + text.strip() + " ")
    t = _DOT_AFTER.sub(r"\1 \2 ", t)
    t = _DOT_BEFORE.sub(r" \1 \2", t)
    t = _DASH.sub(r"\1 \2 ", t)
    return t.split()


def _ngrams(words: Sequence[str], n: int) -> Counter:
    return Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def bleu_statistics(hypothesis: str, reference: str, max_n: int = 4) -> list[int]:
    """[output length, reference length, matches_1..max_n, totals_1..max_n] of one sentence."""
    h, r = bleu_words(hypothesis), bleu_words(reference)
    matches, totals = [], []
    for n in range(1, max_n + 1):
        hn, rn = _ngrams(h, n), _ngrams(r, n)
        matches.append(sum(min(c, rn[g]) for g, c in hn.items()))  # clipped by the reference
        totals.append(sum(hn.values()))
    return [len(h), len(r), *matches, *totals]


def bleu_from_statistics(stats: Sequence[int], max_n: int = 4) -> dict:
    """Corpus BLEU (0..100), its precisions (%) and brevity penalty from summed statistics."""
    c, r = stats[0], stats[1]
    matches, totals = list(stats[2 : 2 + max_n]), list(stats[2 + max_n : 2 + 2 * max_n])
    bp = 1.0 if c >= r else (math.exp(1 - r / c) if c > 0 else 0.0)
    precisions = [0.0] * max_n
    if any(matches):
        halves = 1.0
        for n in range(max_n):
            if totals[n] == 0:
                break  # no n-grams of this order at all: its precision stays 0
            if matches[n] == 0:
                halves *= 2
                precisions[n] = 100.0 / (halves * totals[n])
            else:
                precisions[n] = 100.0 * matches[n] / totals[n]
    if all(p > 0 for p in precisions):
        score = bp * math.exp(sum(math.log(p) for p in precisions) / max_n)
    else:
        score = 0.0
    return {"bleu": score, "precisions": precisions, "brevity_penalty": bp,
            "output_words": c, "reference_words": r}  # fmt: skip


def bleu(hypotheses: Sequence[str], references: Sequence[str], max_n: int = 4) -> dict:
    """Corpus BLEU of ``hypotheses`` against one reference each (see the module docstring)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} outputs but {len(references)} references")
    total = [0] * (2 + 2 * max_n)
    for h, r in zip(hypotheses, references):
        for i, v in enumerate(bleu_statistics(h, r, max_n)):
            total[i] += v
    return bleu_from_statistics(total, max_n)


# ---------------------------------------------------------------------------------------------
# chrF
# ---------------------------------------------------------------------------------------------


def _char_ngrams(text: str, n: int) -> Counter:
    return Counter(text[i : i + n] for i in range(len(text) - n + 1))


def chrf_statistics(hypothesis: str, reference: str, max_n: int = 6) -> list[int]:
    """[output n-grams, reference n-grams, common n-grams] for n = 1..max_n, flattened."""
    h, r = re.sub(r"\s+", "", hypothesis), re.sub(r"\s+", "", reference)
    out = []
    for n in range(1, max_n + 1):
        hn, rn = _char_ngrams(h, n), _char_ngrams(r, n)
        out += [sum(hn.values()), sum(rn.values()), sum((hn & rn).values())]
    return out


def chrf_from_statistics(stats: Sequence[int], max_n: int = 6, beta: float = 2.0) -> float:
    precision = recall = 0.0
    orders = 0
    for n in range(max_n):
        hyp, ref, common = stats[3 * n : 3 * n + 3]
        if hyp > 0 and ref > 0:
            precision += common / hyp
            recall += common / ref
            orders += 1
    if orders == 0:
        return 0.0
    precision, recall = precision / orders, recall / orders
    if precision + recall == 0:
        return 0.0
    b2 = beta * beta
    return 100.0 * (1 + b2) * precision * recall / (b2 * precision + recall)


def chrf(hypotheses: Sequence[str], references: Sequence[str], max_n: int = 6,
         beta: float = 2.0) -> float:  # fmt: skip
    """Corpus chrF (0..100) of ``hypotheses`` against one reference each."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} outputs but {len(references)} references")
    total = [0] * (3 * max_n)
    for h, r in zip(hypotheses, references):
        for i, v in enumerate(chrf_statistics(h, r, max_n)):
            total[i] += v
    return chrf_from_statistics(total, max_n, beta)


# ---------------------------------------------------------------------------------------------
# In-context learning
# ---------------------------------------------------------------------------------------------


def half_losses(logits: torch.Tensor, x: torch.Tensor) -> tuple[float, float]:
    """Next-token loss (nats) on the first half of r r (predicting r[1:], which nothing in the
    context gives away) and on the repeated half (predicting r again, which an induction head
    can copy): logits (B, 2P, V), x (B, 2P)."""
    P = x.size(1) // 2
    nll = F.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), x[:, 1:], reduction="none"
    )  # (B, 2P - 1): position t predicts x[t + 1]
    return float(nll[:, : P - 1].mean()), float(nll[:, P - 1 :].mean())


def icl_positions(T: int) -> tuple[int, int]:
    """The (early, late) token positions, counted from 1, that ``icl_score`` compares in a
    context of T tokens: the last token, and the one a tenth of the way in, at least the 2nd
    (Olsson et al. 2022 compare the 50th and the 500th of 512)."""
    return max(2, -(-T // 10)), T


def icl_score(logits: torch.Tensor, x: torch.Tensor) -> tuple[float, int, int]:
    """Olsson et al. (2022)'s in-context learning score: the mean loss (nats) of predicting the
    late token minus that of the early one (``icl_positions``), over the rows of x (B, T) and
    the model's logits (B, T, V). Negative: the model predicts better later in its context.
    Returns (score, early, late)."""
    early, late = icl_positions(x.size(1))
    nll = F.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), x[:, 1:], reduction="none"
    )  # (B, T - 1): column t - 2 is the loss of the t-th token, predicted from the t - 1 before
    return float(nll[:, late - 2].mean() - nll[:, early - 2].mean()), early, late
