"""The BERT-style encoder: shapes, bidirectionality, padding, heads, masking, run directories."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.config import ConfigError
from attnlab.data.batches import pad_batch
from attnlab.embeddings import sentence_embeddings
from attnlab.models.encoder import IGNORE_INDEX, Encoder, EncoderConfig, mask_tokens
from attnlab.run import load_run
from attnlab.rundir import save_model
from attnlab.tokenizers import build_tokenizer
from attnlab.training import TrainConfig, lr_at


def build_encoder_tokenizer(kind, texts, vocab_size=512):
    return build_tokenizer(kind, texts, vocab_size, encoder=True)


SIZES = [
    dict(n_layer=1, n_head=1, d_model=8, vocab_size=13, block_size=12),
    dict(n_layer=2, n_head=4, d_model=32, vocab_size=50, block_size=20, norm_first=True),
    dict(
        n_layer=3,
        n_head=3,
        d_model=24,
        vocab_size=97,
        block_size=16,
        activation="gelu_tanh",
        type_vocab_size=0,
    ),
]


def tiny(**kw) -> Encoder:
    cfg = dict(n_layer=2, n_head=2, d_model=16, vocab_size=30, block_size=16, dropout=0.0)
    cfg.update(kw)
    return Encoder(EncoderConfig(**cfg)).eval()


@pytest.mark.parametrize(
    "bad",
    [
        dict(d_model=30, n_head=4),
        dict(activation="swish"),
        dict(pad_id=99),
        dict(n_layer=0),
        dict(ln_eps=0.0),
        dict(pos="rotary"),
    ],
)
def test_config_rejects_inconsistent_values(bad):
    with pytest.raises(ConfigError):
        EncoderConfig(vocab_size=50, **bad)


def test_config_round_trips_through_json():
    c = EncoderConfig(
        vocab_size=77, n_layer=3, pooler=True, num_labels=5, mlm_head=True, ln_eps=1e-7
    )
    assert EncoderConfig.from_json(c.to_json()) == c


@pytest.mark.parametrize("size", SIZES)
def test_forward_returns_hidden_states_and_records_attention(size):
    m = tiny(**size)
    B, T = 3, size["block_size"] - 2
    ids = torch.randint(size["vocab_size"], (B, T))
    h, acts = m(ids, record=True)
    assert h.shape == (B, T, size["d_model"])
    for i in range(size["n_layer"]):
        w = acts[f"blocks.{i}.attn.weights"]
        assert w.shape == (B, size["n_head"], T, T)
        torch.testing.assert_close(w.sum(-1), torch.ones(B, size["n_head"], T))
    torch.testing.assert_close(m(ids), h, atol=1e-5, rtol=0)  # fused path == recorded path


def test_attention_is_bidirectional():
    """Changing the last token changes the first position's state (no causal mask)."""
    m = tiny()
    ids = torch.randint(30, (4, 10))
    other = ids.clone()
    other[:, -1] = (other[:, -1] + 1) % 30
    assert (m(ids)[:, 0] - m(other)[:, 0]).abs().amax(-1).min() > 1e-6
    _, acts = m(ids, record=True)
    w = acts["blocks.0.attn.weights"]
    assert (w.triu(1) > 0).any()  # queries attend to later keys


@pytest.mark.parametrize("norm_first", [False, True])
def test_padding_does_not_change_real_tokens(norm_first):
    """Appending padding of any content, masked out, leaves every real token's state alone."""
    m = tiny(norm_first=norm_first)
    lengths = torch.randint(3, 9, (5,))
    seqs = [torch.randint(5, 30, (int(n),)).tolist() for n in lengths]
    ids, mask = pad_batch(seqs, pad_id=0)
    ids = torch.where(mask.bool(), ids, torch.randint(30, ids.shape))  # garbage in the padding
    h, acts = m(ids, attention_mask=mask, record=True)
    for i, s in enumerate(seqs):
        alone = m(torch.tensor([s]))[0]
        torch.testing.assert_close(h[i, : len(s)], alone, atol=1e-5, rtol=0)
    w = acts["blocks.1.attn.weights"]  # (B, H, T, S)
    assert torch.all(w.masked_select(~mask.bool()[:, None, None, :].expand_as(w)) == 0)


def test_token_types_change_the_output():
    m = tiny(type_vocab_size=2)
    ids = torch.randint(30, (2, 6))
    types = torch.zeros_like(ids)
    types[:, 3:] = 1
    assert not torch.allclose(m(ids), m(ids, token_type_ids=types))


def test_heads_shapes_and_tied_decoder():
    m = tiny(mlm_head=True, pooler=True, num_labels=3)
    assert m.mlm.decoder.weight is m.tok_embed.weight
    ids = torch.randint(30, (2, 7))
    assert m.mlm_logits(ids).shape == (2, 7, 30)
    assert m.classify(ids).shape == (2, 3)
    with pytest.raises(ValueError, match="classification head"):
        tiny().classify(ids)
    with pytest.raises(ValueError, match="masked-LM head"):
        tiny().mlm_logits(ids)


def test_pre_norm_adds_a_final_layernorm_post_norm_does_not():
    assert isinstance(tiny(norm_first=True).ln_f, torch.nn.LayerNorm)
    assert isinstance(tiny(norm_first=False).ln_f, torch.nn.Identity)


def test_too_long_input_is_refused():
    with pytest.raises(ValueError, match="block_size"):
        tiny(block_size=8)(torch.zeros(1, 9, dtype=torch.long))


def test_run_directory_round_trip_keeps_heads_and_outputs(tmp_path):
    tok = build_encoder_tokenizer("char", ["abc de"])
    m = tiny(vocab_size=tok.vocab_size, mlm_head=True, pooler=True, num_labels=4, tie_weights=True)
    save_model(tmp_path, m, tok, extra={"task": "mlm"})
    stored = json.loads((tmp_path / "config.json").read_text())
    assert stored["model_type"] == "encoder"
    m2, tok2 = load_run(tmp_path)
    ids = torch.randint(tok.vocab_size, (2, 9))
    assert torch.equal(m.mlm_logits(ids), m2.mlm_logits(ids))
    assert torch.equal(m.classify(ids), m2.classify(ids))
    assert m2.mlm.decoder.weight is m2.tok_embed.weight
    assert tok2.encode("abc") == tok.encode("abc")


def test_mask_tokens_follows_bert_80_10_10():
    g = torch.Generator().manual_seed(int(torch.randint(1 << 30, ())))
    ids = torch.randint(5, 1000, (64, 512), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    inputs, labels = mask_tokens(
        ids, mask_id=4, vocab_size=1000, special_ids=[0, 1, 2, 3, 4], generator=g
    )
    sel = labels != IGNORE_INDEX
    assert not sel[:, 0].any() and not sel[:, -1].any()  # specials are never chosen
    assert torch.equal(labels[sel], ids[sel])
    assert torch.equal(inputs[~sel], ids[~sel])  # unselected tokens are untouched
    frac = sel[:, 1:-1].float().mean().item()
    assert abs(frac - 0.15) < 0.01
    n = sel.sum().item()
    masked = (inputs[sel] == 4).sum().item() / n
    kept = (inputs[sel] == ids[sel]).sum().item() / n
    assert abs(masked - 0.8) < 0.02
    assert abs(kept - 0.1) < 0.02  # (a random draw equal to the original counts as kept: 1/1000)
    assert abs(1 - masked - kept - 0.1) < 0.02


def test_mlm_loss_has_a_gradient_even_when_nothing_is_selected():
    m = tiny(mlm_head=True)
    ids = torch.randint(30, (2, 5))
    loss = m.mlm_loss(ids, torch.full_like(ids, IGNORE_INDEX))
    loss.backward()
    assert loss.item() == 0.0
    labels = ids.clone()
    m.zero_grad()
    m.mlm_loss(ids, labels).backward()
    assert m.tok_embed.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", ["char", "word", "bpe", "wordpiece"])
def test_encoder_tokenizers_frame_text_with_cls_and_sep(kind):
    texts = ["The bank of the river.", "A river bank is not a money bank!"] * 5
    tok = build_encoder_tokenizer(kind, texts, vocab_size=300)
    assert [tok.special_tokens[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [
        0,
        1,
        2,
        3,
        4,
    ]
    ids = tok.encode("the river bank")
    assert ids[0] == 2 and ids[-1] == 3
    assert 2 not in tok.encode("the river bank", add_special_tokens=False)
    assert tok.tokens("the river")[0] == "[CLS]"
    if kind in ("char", "bpe"):  # lossless tokenizers
        assert tok.decode(tok.encode("A bank.", add_special_tokens=False)) == "A bank."


def test_mean_pooling_ignores_padding():
    m = tiny()
    tok = build_encoder_tokenizer("char", ["abcdefgh "])
    emb = sentence_embeddings(m, tok, ["abc", "abcdefgh abc"])
    alone = sentence_embeddings(m, tok, ["abc"])
    torch.testing.assert_close(emb[0], alone[0], atol=1e-5, rtol=0)
    cls = sentence_embeddings(m, tok, ["abc"], pool="cls", normalize=True)
    torch.testing.assert_close(cls.norm(dim=-1), torch.ones(1))


def test_learning_rate_warms_up_then_decays_to_min():
    # the encoder tasks train with the shared Trainer's schedule: peak lr at step warmup_iters
    s = TrainConfig(max_iters=200, lr=1e-3, min_lr=1e-5, warmup_iters=20)
    lrs = [lr_at(i, s) for i in range(200)]
    assert all(a < b for a, b in zip(lrs[:21], lrs[1:21]))
    assert lrs[20] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[20:], lrs[21:]))
    assert lr_at(500, s) == 1e-5


def test_conformance_check_runs_padding_invariance_on_the_encoder():
    from attnlab.inspect.check import check

    model = Encoder(EncoderConfig(vocab_size=40, block_size=32, n_layer=2, n_head=2, d_model=16))
    report = check(model)
    by_name = {r.name: r for r in report.results}
    pad = by_name["padding invariance"]
    assert pad.passed is True and pad.diff <= 1e-4
    assert by_name["future leak"].passed is None  # bidirectional: not applicable
