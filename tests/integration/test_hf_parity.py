"""Parity with Hugging Face transformers (randomly initialised reference models, no network).

GPT-2 and BERT logits and hidden states agree to 1e-4 in float32 on padded batches, our
recorded attention weights equal HF's output_attentions, and GPT-2 export round-trips exactly.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from attnlab.interop import bert, gpt2, hf  # noqa: E402
from attnlab.models.gpt import GPT, GPTConfig  # noqa: E402
from attnlab.run import load_run  # noqa: E402
from attnlab.rundir import RunError, save_model  # noqa: E402

TOL = 1e-4

GPT2_SIZES = [  # n_layer, n_head, n_embd, vocab, n_positions, activation, tie
    (1, 1, 8, 50, 16, "gelu_new", True),
    (2, 4, 32, 101, 40, "gelu_new", True),
    (3, 3, 48, 257, 24, "gelu", False),
    (2, 2, 16, 50257, 20, "gelu_pytorch_tanh", True),
]
BERT_SIZES = [  # n_layer, n_head, hidden, vocab, intermediate, act, eps, type_vocab
    (1, 1, 8, 40, 16, "gelu", 1e-12, 2),
    (2, 4, 32, 97, 80, "gelu", 1e-12, 2),
    (3, 3, 48, 211, 64, "gelu_new", 1e-5, 1),
    (2, 2, 24, 30522, 50, "relu", 1e-6, 3),
]


def padded_batch(vocab: int, T: int, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (4, T) and a mask with random lengths (one row full), right or left padded."""
    ids = torch.randint(vocab, (4, T))
    lengths = torch.randint(1, T + 1, (4,))
    lengths[0] = T
    pos = torch.arange(T)[None]
    mask = (pos >= T - lengths[:, None]) if left else (pos < lengths[:, None])
    return ids, mask.long()


def gpt2_reference(tmp_path, size):
    n_layer, n_head, n_embd, vocab, n_pos, act, tie = size
    cfg = transformers.GPT2Config(
        vocab_size=vocab,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_positions=n_pos,
        activation_function=act,
        tie_word_embeddings=tie,
        attn_implementation="eager",
    )
    ref = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # non-trivial LayerNorms and biases, so every tensor is tested
        for name, p in ref.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    ref.save_pretrained(tmp_path)
    return ref


def bert_reference(tmp_path, size, cls=None):
    n_layer, n_head, hidden, vocab, inter, act, eps, types = size
    cfg = transformers.BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=n_layer,
        num_attention_heads=n_head,
        intermediate_size=inter,
        hidden_act=act,
        layer_norm_eps=eps,
        type_vocab_size=types,
        max_position_embeddings=32,
        num_labels=3,
        attn_implementation="eager",
    )
    ref = (cls or transformers.BertModel)(cfg).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    ref.save_pretrained(tmp_path)
    return ref


def maxdiff(a, b, keep=None):
    d = (a - b).abs()
    return float((d[keep] if keep is not None else d).max().detach())


# ---------------------------------------------------------------------------------------------
# GPT-2
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("left", [False, True], ids=["right-pad", "left-pad"])
@pytest.mark.parametrize("size", GPT2_SIZES, ids=lambda s: f"L{s[0]}H{s[1]}C{s[2]}V{s[3]}")
def test_gpt2_logits_hidden_states_and_attention_match(tmp_path, size, left):
    ref = gpt2_reference(tmp_path, size)
    ours = gpt2.load_gpt2(tmp_path)
    T = size[4] - 3
    ids, mask = padded_batch(size[3], T, left)
    keep = mask.bool()  # padded query positions carry no meaning in either model
    with torch.no_grad():
        out = ref(
            input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True
        )
        logits, acts = ours(ids, attention_mask=mask, record=True)
    assert maxdiff(out.logits, logits, keep) <= TOL
    n = size[0]
    assert maxdiff(out.hidden_states[0], acts["blocks.0.resid_pre"], keep) <= TOL
    for i in range(n - 1):
        assert maxdiff(out.hidden_states[i + 1], acts[f"blocks.{i}.resid_post"], keep) <= TOL
    assert maxdiff(out.hidden_states[n], acts["ln_f"], keep) <= TOL  # HF's last one is after ln_f
    for i in range(n):
        ours_w, ref_w = acts[f"blocks.{i}.attn.weights"], out.attentions[i]  # (B, H, T, S)
        rows = keep[:, None, :, None].expand_as(ref_w)
        assert maxdiff(ref_w, ours_w, rows) <= 1e-6
    # and without recording (the fused attention path)
    with torch.no_grad():
        assert maxdiff(out.logits, ours(ids, attention_mask=mask), keep) <= TOL


@pytest.mark.parametrize("size", GPT2_SIZES[:3], ids=lambda s: f"L{s[0]}H{s[1]}C{s[2]}")
def test_gpt2_greedy_generation_matches_with_cache(tmp_path, size):
    ref = gpt2_reference(tmp_path, size)
    ours = gpt2.load_gpt2(tmp_path)
    prompt = torch.randint(size[3], (1, 4))
    steps = 6
    with torch.no_grad():
        want = ref.generate(prompt, max_new_tokens=steps, do_sample=False, pad_token_id=0)
        cache, ids, x = ours.new_cache(1), prompt, prompt
        for _ in range(steps):
            nxt = ours(x, cache=cache)[:, -1].argmax(-1, keepdim=True)
            ids, x = torch.cat([ids, nxt], 1), nxt
    assert torch.equal(ids, want)


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("shape", [(1, 2, 16, 37, 12), (2, 4, 32, 300, 40), (3, 3, 24, 65, 20)])
def test_export_round_trip_is_bit_exact(tmp_path, shape, tie):
    n_layer, n_head, d_model, vocab, block = shape
    config = GPTConfig(
        vocab_size=vocab,
        n_layer=n_layer,
        n_head=n_head,
        d_model=d_model,
        block_size=block,
        activation="gelu_tanh",
        tie_weights=tie,
        dropout=0.0,
    )
    model = GPT(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln" in name:
                p.add_(0.1 * torch.randn_like(p))
    save_model(tmp_path / "run", model)
    gpt2.export_gpt2(tmp_path / "run", tmp_path / "hf")
    assert (
        json.loads((tmp_path / "hf" / "config.json").read_text())["attnlab"]["model_type"] == "gpt"
    )
    ref = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    ids, mask = padded_batch(vocab, block - 1)
    with torch.no_grad():
        assert (
            maxdiff(
                ref(input_ids=ids, attention_mask=mask).logits,
                model(ids, attention_mask=mask),
                mask.bool(),
            )
            <= TOL
        )
    ref.save_pretrained(tmp_path / "hf2")  # attnlab -> HF -> (HF's own writer) -> attnlab
    for src in ("hf", "hf2"):
        back = gpt2.load_gpt2(tmp_path / src)
        assert back.config == config
        sd, sd2 = model.state_dict(), back.state_dict()
        assert sd.keys() == sd2.keys()
        assert all(torch.equal(sd[k], sd2[k]) for k in sd), src


def test_export_refuses_what_gpt2_cannot_express(tmp_path):
    save_model(tmp_path / "run", GPT(GPTConfig(vocab_size=20, n_layer=1, d_model=16, pos="rotary")))
    with pytest.raises(RunError, match="rotary"):
        gpt2.export_gpt2(tmp_path / "run", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


# ---------------------------------------------------------------------------------------------
# BERT
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", BERT_SIZES, ids=lambda s: f"L{s[0]}H{s[1]}C{s[2]}V{s[3]}-{s[5]}")
def test_bert_hidden_states_pooler_and_attention_match(tmp_path, size):
    ref = bert_reference(tmp_path, size)
    ours = bert.load_bert(tmp_path)
    assert ours.config.pooler and ours.config.ln_eps == size[6]
    ids, mask = padded_batch(size[3], 17)
    types = torch.randint(size[7], ids.shape)
    keep = mask.bool()
    with torch.no_grad():
        out = ref(
            input_ids=ids,
            attention_mask=mask,
            token_type_ids=types,
            output_hidden_states=True,
            output_attentions=True,
        )
        hidden, acts = ours(ids, attention_mask=mask, token_type_ids=types, record=True)
    assert maxdiff(out.last_hidden_state, hidden, keep) <= TOL
    assert maxdiff(out.pooler_output, ours.pooled(hidden)) <= TOL
    assert maxdiff(out.hidden_states[0], acts["blocks.0.resid_pre"], keep) <= TOL
    for i in range(size[0]):
        assert maxdiff(out.hidden_states[i + 1], acts[f"blocks.{i}.resid_post"], keep) <= TOL
        w = acts[f"blocks.{i}.attn.weights"]
        assert maxdiff(out.attentions[i], w) <= 1e-6  # every row: pad queries attend too
        assert torch.all(w[~keep[:, None, None, :].expand_as(w)] == 0)
    with torch.no_grad():  # fused path
        assert maxdiff(out.last_hidden_state, ours(ids, mask, types), keep) <= TOL


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("size", BERT_SIZES[:3], ids=lambda s: f"L{s[0]}H{s[1]}C{s[2]}")
def test_bert_masked_lm_logits_match(tmp_path, size, tie):
    ref = transformers.BertForMaskedLM(
        transformers.BertConfig(
            vocab_size=size[3],
            hidden_size=size[2],
            num_hidden_layers=size[0],
            num_attention_heads=size[1],
            intermediate_size=size[4],
            hidden_act=size[5],
            layer_norm_eps=size[6],
            type_vocab_size=size[7],
            max_position_embeddings=32,
            tie_word_embeddings=tie,
            attn_implementation="eager",
        )
    ).eval()
    with torch.no_grad():
        ref.cls.predictions.bias.add_(torch.randn_like(ref.cls.predictions.bias))
    ref.save_pretrained(tmp_path)
    ours = bert.load_bert(tmp_path)
    assert ours.config.mlm_head and not ours.config.pooler and ours.config.tie_weights == tie
    ids, mask = padded_batch(size[3], 12)
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
        got = ours.mlm_logits(ids, mask)
    assert maxdiff(want, got, mask.bool()) <= TOL


def test_bert_sequence_classification_logits_match(tmp_path):
    ref = bert_reference(tmp_path, BERT_SIZES[1], cls=transformers.BertForSequenceClassification)
    ours = bert.load_bert(tmp_path)
    assert ours.config.num_labels == 3
    ids, mask = padded_batch(BERT_SIZES[1][3], 10)
    with torch.no_grad():
        assert (
            maxdiff(ref(input_ids=ids, attention_mask=mask).logits, ours.classify(ids, mask)) <= TOL
        )


def test_imported_bert_run_round_trips_through_a_run_directory(tmp_path):
    bert_reference(tmp_path / "hf", BERT_SIZES[1], cls=transformers.BertForMaskedLM)
    hf.import_hf(tmp_path / "hf", tmp_path / "run")
    model, _ = load_run(tmp_path / "run")
    direct = bert.load_bert(tmp_path / "hf")
    ids = torch.randint(BERT_SIZES[1][3], (2, 9))
    assert torch.equal(model.mlm_logits(ids), direct.mlm_logits(ids))
    source = json.loads((tmp_path / "run" / "config.json").read_text())["source"]
    assert source["hf_model_type"] == "bert" and len(source["weights_sha256"]) == 64


# ---------------------------------------------------------------------------------------------
# The key map refuses what it cannot account for
# ---------------------------------------------------------------------------------------------


def _rewrite_weights(d, change):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(d / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize(
    "damage,match",
    [
        (lambda t: t.pop("transformer.h.0.mlp.c_fc.weight"), "missing tensor"),
        (
            lambda t: t.__setitem__("transformer.h.0.extra.weight", torch.zeros(2)),
            "unexpected tensor",
        ),
        (lambda t: t.__setitem__("transformer.h.0.attn.c_proj.weight", torch.zeros(3, 3)), "shape"),
    ],
)
def test_gpt2_key_map_asserts_counts_and_shapes(tmp_path, damage, match):
    gpt2_reference(tmp_path, GPT2_SIZES[1])
    _rewrite_weights(tmp_path, damage)
    with pytest.raises(RunError, match=match):
        gpt2.load_gpt2(tmp_path)


def test_pickle_only_directory_is_refused_without_unpickling(tmp_path):
    gpt2_reference(tmp_path, GPT2_SIZES[0])
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"not even a pickle")
    with pytest.raises(RunError, match="never unpickles"):
        hf.load_hf(tmp_path)


def test_unsupported_model_type_is_refused(tmp_path):
    bert_reference(tmp_path, BERT_SIZES[0])
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["model_type"] = "falcon"  # a family attnlab does not import
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(RunError, match="not supported"):
        hf.load_hf(tmp_path)


# ---------------------------------------------------------------------------------------------
# Tokenizers: the same ids as transformers' own tokenizers
# ---------------------------------------------------------------------------------------------

TEXTS = ["The bank of the river.", "Hello, world! Ünïcödé and   spaces", "unaffable running runner"]


def test_bert_vocab_txt_tokenizer_matches_transformers(tmp_path):
    words = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "the",
        "bank",
        "of",
        "river",
        ".",
        ",",
        "!",
        "hello",
        "world",
        "run",
        "##ning",
        "##ner",
        "un",
        "##aff",
        "##able",
        "and",
        "spaces",
    ]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    ours, source = hf.load_hf_tokenizer(tmp_path)
    assert source == "vocab.txt"
    ref = transformers.BertTokenizer(vocab=str(tmp_path / "vocab.txt"), do_lower_case=True)
    for t in TEXTS:
        assert ours.encode(t) == ref(t)["input_ids"]  # [CLS] ... [SEP] added by default
        assert (
            ours.encode(t, add_special_tokens=False)
            == ref(t, add_special_tokens=False)["input_ids"]
        )


def test_gpt2_vocab_and_merges_tokenizer_matches_transformers(tmp_path):
    from attnlab.tokenizers import train_bpe

    trained = train_bpe(TEXTS * 20, vocab_size=300)
    trained.tok.model.save(str(tmp_path))  # vocab.json + merges.txt, GPT-2's files
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    ours, source = hf.load_hf_tokenizer(tmp_path)
    assert source == "vocab.json + merges.txt"
    ref = transformers.GPT2Tokenizer(
        vocab=str(tmp_path / "vocab.json"), merges=str(tmp_path / "merges.txt")
    )
    for t in TEXTS:
        assert ours.encode(t) == ref(t)["input_ids"] == trained.encode(t)
        assert ours.decode(ours.encode(t)) == t
