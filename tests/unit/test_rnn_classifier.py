"""The LSTM classifier with additive attention (Jain & Wallace's model): its attention is a
distribution over the real tokens, padding changes nothing, uniform and imposed attention do
what they say, and ``attnlab train --task classify --arch lstm-attention`` builds it."""

from __future__ import annotations

import pytest
import torch

from attnlab import hooks
from attnlab.config import ConfigError
from attnlab.models.declare import registered
from attnlab.models.rnn_classifier import LSTMClassifier, LSTMClassifierConfig
from attnlab.training.run import plan


def model(**kw) -> LSTMClassifier:
    torch.manual_seed(0)
    cfg = dict(vocab_size=20, d_embed=8, d_hidden=6, num_labels=3, block_size=16)
    return LSTMClassifier(LSTMClassifierConfig(**{**cfg, **kw})).eval()


@pytest.mark.parametrize("encoder", ["bilstm", "lstm", "mlp"])
def test_attention_is_a_distribution_over_the_real_tokens(encoder):
    m = model(encoder=encoder)
    ids = torch.tensor([[5, 6, 7, 8, 0, 0], [3, 4, 5, 6, 7, 8]])  # row 0 padded (pad_id 0)
    with hooks.record(m) as cache:
        logits = m(ids)
    a = cache["attn.weights"]  # (B, 1, 1, T)
    assert logits.shape == (2, 3) and a.shape == (2, 1, 1, 6)
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 1, 1))
    assert (a[0, 0, 0, 4:] == 0).all() and (a >= 0).all()
    c = cache["states"].shape[-1]
    assert c == (12 if encoder == "bilstm" else 6) == cache["attn.z"].shape[-1]


@pytest.mark.parametrize("encoder", ["bilstm", "lstm"])
def test_padding_on_the_right_changes_no_output(encoder):
    m = model(encoder=encoder)
    ids = torch.randint(1, 20, (3, 7), generator=torch.Generator().manual_seed(1))
    padded = torch.cat([ids, torch.zeros(3, 4, dtype=torch.long)], 1)
    torch.testing.assert_close(m(padded), m(ids), atol=1e-6, rtol=0)
    mask = torch.ones_like(padded)
    mask[:, 7:] = 0
    torch.testing.assert_close(m(padded, mask), m(ids), atol=1e-6, rtol=0)


def test_uniform_attention_weighs_every_real_token_the_same():
    m = model(attention="uniform")
    with hooks.record(m) as cache:
        m(torch.tensor([[4, 5, 6, 7, 0]]))
    torch.testing.assert_close(cache["attn.weights"][0, 0, 0], torch.tensor([0.25] * 4 + [0.0]))


def test_imposed_weights_replace_the_models_own_and_carry_a_gradient_to_nothing_else():
    m = model()
    ids = torch.tensor([[4, 5, 6, 7]])
    own = m.attention(ids)
    torch.testing.assert_close(own.sum(-1), torch.ones(1))
    onehot = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    with hooks.record(m) as cache:
        m(ids, weights=onehot)
    torch.testing.assert_close(cache["attn.weights"][0, 0, 0], onehot[0])
    # the logits are the classifier of the third token's state alone
    torch.testing.assert_close(m(ids, weights=onehot), m.classifier(cache["states"][0, 2])[None])


def test_the_kind_declares_its_attention_as_one_context_group():
    m = model()
    assert registered()["lstm-classifier"] is LSTMClassifier
    (group,) = m.head_groups()
    assert (group.kind, group.path, group.n_heads) == ("context", "attn", 1)
    assert m.predicts == "class" and not m.residual and m.kind == "lstm-classifier"
    assert "attn.weights" in m.hook_points and "additive" in m.describe()


def test_config_refuses_an_unknown_encoder_or_score():
    with pytest.raises(ConfigError, match="encoder"):
        LSTMClassifierConfig(encoder="gru")
    with pytest.raises(ConfigError, match="attention"):
        LSTMClassifierConfig(attention="dot")


def test_the_estimate_counts_the_parameters():
    for kw in (dict(), dict(encoder="lstm"), dict(encoder="mlp")):
        m = model(**kw)
        assert m.config.estimate_parameters() == sum(p.numel() for p in m.parameters())


def test_classify_plans_the_lstm_classifier_by_arch_and_score():
    p = plan({"task": "classify", "data": "x.tsv", "arch": "lstm-attention", "score": "uniform",
              "d_model": 16})  # fmt: skip
    cfg = p.options.model_config(30, num_labels=4)
    assert isinstance(cfg, LSTMClassifierConfig)
    assert (cfg.attention, cfg.d_hidden, cfg.num_labels) == ("uniform", 16, 4)


@pytest.mark.parametrize("given, needle", [
    ({"score": "uniform"}, "--score applies to --arch lstm-attention"),
    ({"arch": "lstm-attention", "n_head": 2}, "apply to --arch transformer only"),
    ({"arch": "lstm-attention", "score": "dot"}, "score"),
    ({"arch": "lstm"}, "not a text classifier"),
])  # fmt: skip
def test_classify_refuses_options_the_architecture_does_not_have(given, needle):
    with pytest.raises(ConfigError, match=needle):
        plan({"task": "classify", "data": "x.tsv", **given})
