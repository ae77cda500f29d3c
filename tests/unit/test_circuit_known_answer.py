"""A known answer for the circuit tools: a two-layer attention-only GPT whose weights are set by
hand to be an induction circuit, so that which edges carry the behaviour, which heads compose
and why the induction head attends where it does are known before anything is measured.

The stream has four orthogonal subspaces of V = 6 channels each (C = 24): the token (one-hot),
the position (one-hot, learned positions), the previous token (written by head 0.0) and the
output (written by head 1.0, the only one the unembedding reads). RMSNorm with unit gains only
rescales one-hot sums, so every head sees clean one-hot codes:

    0.0  previous-token head   query: position t, key: position t - 1; value: the token,
                               written to the previous-token subspace
    1.0  induction head        query: the current token; key: the previous-token subspace, so
                               it attends to the position after an earlier copy of the current
                               token; value: the token, written to the output subspace
    0.1, 1.1                   distractors: small random weights

On r r (r = 3 different tokens) the last position's r[2] finds position 3, whose previous token
is r[2], and predicts r[0]; on r' r nothing matches, 1.0 averages every token's value, and the
target r[0] and the foil r'[0] tie. So the whole gap runs through three edges: the embedding
into 0.0's values (which token came before), 0.0 into 1.0's keys (K-composition), and 1.0 to
the logits. One more edge carries part of it, known too: the embedding into 1.0's values (on
r' r, with r's tokens in the first half, 1.0's uniform average holds r[0] twice and r'[0] not
at all: about a third of the gap). Nothing else carries more than noise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnlab.interventions.circuits import find_circuit
from attnlab.interventions.edges import Circuits, Edges, score_batch
from attnlab.interventions.pairs import induction_pairs, prepare_pairs
from attnlab.interventions.subjects import Subject
from attnlab.interventions.weights import composition_scores
from attnlab.interventions.why import split_score
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.tokenizers import CharTokenizer

V = 6  # tokens, positions, and each subspace's width
TOK, POS, PREV, OUT = 0, V, 2 * V, 3 * V  # where each subspace starts in the stream
D = 8  # head width
CIRCUIT = {"embed -> 0.0.v", "0.0 -> 1.0.k", "1.0 -> logits"}


def induction_by_hand() -> Subject:
    tok = CharTokenizer.from_text("abcdef")
    cfg = GPTConfig(vocab_size=V, block_size=V, n_layer=2, n_head=2, d_model=4 * V, head_dim=D,
                    mlp=False, norm="rms", bias=False, tie_weights=False, pos="learned")  # fmt: skip
    model = GPT(cfg).eval()
    g = torch.Generator().manual_seed(0)
    c0 = math.sqrt(4 * V / 2)  # RMSNorm of two one-hots: each becomes sqrt(C / 2)
    c1 = math.sqrt(4 * V / 3)  # of three (token, position, previous token)
    with torch.no_grad():
        for p in model.parameters():  # the distractors' weights, then the circuit's set over
            p.copy_(0.01 * torch.randn(p.shape, generator=g))
        for n in ("blocks.0.ln1", "blocks.1.ln1", "ln_f"):
            model.get_submodule(n).weight.fill_(1.0)
        model.tok_embed.weight.zero_()
        model.tok_embed.weight[:, TOK : TOK + V] = torch.eye(V)
        model.pos_embed.weight.zero_()
        model.pos_embed.weight[:, POS : POS + V] = torch.eye(V)
        a0, a1 = model.blocks[0].attn, model.blocks[1].attn
        for w in (a0.q_proj, a0.k_proj, a0.v_proj, a1.q_proj, a1.k_proj, a1.v_proj):
            w.weight[:D].zero_()  # head 0 of each layer: rows 0..D-1
        for w in (a0.out_proj, a1.out_proj):
            w.weight[:, :D].zero_()
        beta0 = math.sqrt(10 * math.sqrt(D)) / c0  # a score of 10 where t' = t - 1
        for t in range(1, V):
            a0.q_proj.weight[t - 1, POS + t] = beta0
        for t in range(V):
            a0.k_proj.weight[t, POS + t] = beta0
            a0.v_proj.weight[t, TOK + t] = 1.0
            a0.out_proj.weight[PREV + t, t] = 1.0 / c0  # a unit one-hot of the previous token
        beta1 = math.sqrt(10 * math.sqrt(D)) / c1  # a score of 10 where the tokens match
        for v in range(V):
            a1.q_proj.weight[v, TOK + v] = beta1
            a1.k_proj.weight[v, PREV + v] = beta1
            a1.v_proj.weight[v, TOK + v] = 1.0
            a1.out_proj.weight[OUT + v, v] = 1.0 / c1
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, OUT:] = 4.0 * torch.eye(V)
    return Subject(model, tok)


@pytest.fixture(scope="module")
def subject():
    return induction_by_hand()


@pytest.fixture(scope="module")
def prompts(subject):
    return induction_pairs(subject, n=8, half=3, seed=0)


def test_the_hand_built_model_does_induction_and_the_corrupt_pairs_tie(subject, prompts):
    (batch,) = prepare_pairs(subject, prompts, "logit-diff")
    circ = Circuits(subject)
    clean = circ.record(batch.clean, batch, "logit-diff").metric
    corrupt = circ.record(batch.corrupt, batch, "logit-diff").metric
    assert float(clean.min()) > 5.0  # r[0] predicted after r r
    assert float(corrupt.abs().max()) < 0.5  # r[0] and r'[0] tie after r' r


@pytest.mark.parametrize("method,steps", [("exact", 1), ("eap", 1), ("eap-ig", 5)])
def test_every_method_ranks_the_three_circuit_edges_first(subject, prompts, method, steps):
    (batch,) = prepare_pairs(subject, prompts, "logit-diff")
    circ = Circuits(subject)
    edges = Edges(circ.graph, batch.lengths)
    s = score_batch(circ, batch, edges, "logit-diff", method, steps=steps)
    mean = s.scores.mean(0).numpy()
    top = np.argsort(-np.abs(mean))[:3]
    assert {edges.label(u) for u in top} == CIRCUIT, [edges.label(u) for u in top]
    assert (mean[top] > 0).all()  # each moves the metric toward the clean run's
    fourth = np.argsort(-np.abs(mean))[3]
    assert edges.label(fourth) == "embed -> 1.0.v" and 0 < mean[fourth] < 0.5 * mean[top].min()
    gap = float((s.clean.metric - s.corrupt.metric).mean())
    rest = np.sort(np.abs(mean))[::-1][4]
    assert rest < 0.02 * gap, rest  # the other edges: noise from the distractors
    if method == "exact":  # each of the three alone restores the gap
        assert (mean[top] > 0.95 * gap).all(), (mean[top], gap)


def test_the_three_edges_recover_the_gap_and_random_three_do_not(subject, prompts):
    r = find_circuit(subject, prompts, method="eap-ig", steps=5, k=3, random_sets=20,
                     resamples=100, curve_points=4)  # fmt: skip
    assert {r.labels[u] for u in r.circuit} == CIRCUIT
    assert r.chosen.faithfulness > 0.95 and r.chosen.lo > 0.9
    assert r.chosen.random_mean < 0.1


def test_the_top_k_composition_pair_is_the_previous_token_head_into_the_induction_head(subject):
    d = composition_scores(subject)
    top = max(d["pairs"], key=lambda p: p["k"])
    assert (top["from"], top["to"]) == ("0.0", "1.0")
    others = [p["k"] for p in d["pairs"] if p is not top]
    assert top["k"] > 1.5 * max(others)  # and by a margin, not by chance
    assert top["k"] > 1.5 * d["baseline"]["k"]


def test_why_the_induction_head_attends_there_is_the_token_against_the_previous_token(subject):
    """At r r's last position (r[2]) head 1.0 attends to position 3, whose previous token is
    r[2]: the score is the query's token (the embedding) against the key's previous token
    (head 0.0's output), and that one term is nearly all of it."""
    ids = torch.tensor([subject.tokenizer.encode("abcabc")])
    got = split_score(subject, (ids,), "blocks.1.attn.head0", 5, 3)
    assert got.error < 1e-5 * (1 + abs(got.score))
    i, j = divmod(int(got.table.abs().argmax()), got.table.size(1))
    assert (got.query_terms[i], got.key_terms[j]) == ("embed", "0.0")
    assert float(got.table[i, j]) > 0.9 * got.score > 5.0
