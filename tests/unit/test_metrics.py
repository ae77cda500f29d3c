"""attnlab.metrics: BLEU, chrF, the confusion matrix and per-class P/R/F1, from their definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.metrics import (
    accuracy,
    bleu,
    bleu_words,
    chrf,
    classification_report,
    confusion_matrix,
    per_class,
)

WORDS = ["the", "cat", "sat", "on", "a", "mat", ".", "dog", "ran", ",", "2026", "-", "11"]
sentences = st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join)


def test_bleu_of_a_hand_worked_example():
    # "a b c d" against "a b c e": p1 = 3/4, p2 = 2/3, p3 = 1/2, no 4-gram matches (1 in total,
    # the first zero order: p4 = 1 / (2 * 1)); same length, so BP = 1
    r = bleu(["a b c d"], ["a b c e"])
    assert r["brevity_penalty"] == 1.0
    assert r["precisions"] == pytest.approx([75.0, 200 / 3, 50.0, 50.0])
    assert r["bleu"] == pytest.approx(100 * (0.75 * (2 / 3) * 0.5 * 0.5) ** 0.25)


def test_bleu_brevity_penalty_is_exp_one_minus_r_over_c():
    ref = "one two three four five six seven eight"
    r = bleu(["one two three four"], [ref])  # every n-gram matches; 4 words for 8
    assert r["precisions"] == [100.0] * 4
    assert r["brevity_penalty"] == pytest.approx(math.exp(1 - 8 / 4))
    assert r["bleu"] == pytest.approx(100 * math.exp(1 - 8 / 4))


@given(st.lists(sentences, min_size=1, max_size=5))
@settings(max_examples=60, deadline=None)
def test_bleu_is_100_for_identical_text_and_0_without_a_shared_word(texts):
    has_4grams = any(len(bleu_words(t)) >= 4 for t in texts)
    assert bleu(texts, texts)["bleu"] == pytest.approx(100.0 if has_4grams else 0.0)
    other = ["zebra " * len(bleu_words(t)) for t in texts]
    assert bleu(other, texts)["bleu"] == 0.0


def test_bleu_is_corpus_level_not_a_mean_of_sentences():
    hyps, refs = ["a b c d e", "x"], ["a b c d e", "y"]
    # sentence 2 alone scores 0; the corpus pools its counts: 5/6 unigrams, 4/4 ... 2/2
    r = bleu(hyps, refs)
    assert r["precisions"][0] == pytest.approx(100 * 5 / 6) and 0 < r["bleu"] < 100


def test_bleu_words_follow_mteval_13a():
    assert bleu_words("2026-11-21") == ["2026", "-", "11", "-", "21"]
    assert bleu_words("Hello, world. 3.5 is 3,000!") == [
        "Hello", ",", "world", ".", "3.5", "is", "3,000", "!"]  # fmt: skip
    assert bleu_words("don't (say) a/b") == ["don't", "(", "say", ")", "a", "/", "b"]


def test_chrf_of_a_hand_worked_example():
    # "ab" vs "ac": unigrams 1 of 2 both ways, bigrams 0 of 1; n = 3..6 have none on either side
    # P = R = (1/2 + 0) / 2 = 1/4, F_2 = (1 + 4) P R / (4 P + R) = 1/4
    assert chrf(["ab"], ["ac"]) == pytest.approx(25.0)
    assert chrf(["a b"], ["ab"]) == pytest.approx(100.0)  # whitespace is not counted


@given(st.lists(sentences, min_size=1, max_size=4))
@settings(max_examples=60, deadline=None)
def test_chrf_bounds(texts):
    assert chrf(texts, texts) == pytest.approx(100.0)
    assert chrf(["#" * len(t) for t in texts], texts) == 0.0
    shuffled = [t[::-1] for t in texts]
    assert 0.0 <= chrf(shuffled, texts) <= 100.0


def test_chrf_weighs_recall_more_than_precision():
    short, long_ = chrf(["abcd"], ["abcdefgh"]), chrf(["abcdefgh"], ["abcd"])
    assert short < long_  # missing half of the reference costs more than adding as much


def test_confusion_and_per_class_scores_on_random_labels():
    rng = np.random.default_rng(0)
    for _ in range(20):
        k = int(rng.integers(2, 6))
        y, p = rng.integers(0, k, 50), rng.integers(0, k, 50)
        m = confusion_matrix(y.tolist(), p.tolist(), k)
        assert m.sum() == 50 and accuracy(m) == pytest.approx(float((y == p).mean()))
        pc = per_class(m)
        for c in range(k):
            tp = int(((y == c) & (p == c)).sum())
            called, actual = int((p == c).sum()), int((y == c).sum())
            prec = tp / called if called else 0.0
            rec = tp / actual if actual else 0.0
            f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
            assert (pc["precision"][c], pc["recall"][c], pc["f1"][c]) == pytest.approx(
                (prec, rec, f1)
            )
            assert pc["support"][c] == actual


def test_classification_report_names_classes_and_macro_averages():
    m = confusion_matrix([0, 0, 1, 1, 2], [0, 1, 1, 1, 0], 3)
    r = classification_report(m, ["a", "b", "c"])
    assert r["confusion"] == [[1, 1, 0], [0, 2, 0], [1, 0, 0]] and r["classes"] == ["a", "b", "c"]
    assert r["accuracy"] == pytest.approx(3 / 5)
    assert r["macro_f1"] == pytest.approx(np.mean([row["f1"] for row in r["per_class"]]))
    assert [row["support"] for row in r["per_class"]] == [2, 2, 1]


def test_lengths_must_agree():
    with pytest.raises(ValueError):
        bleu(["a"], ["a", "b"])
    with pytest.raises(ValueError):
        confusion_matrix([0], [0, 1], 2)
