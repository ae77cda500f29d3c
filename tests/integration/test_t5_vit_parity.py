"""T5 and ViT imported from Hugging Face match transformers (issue 22, items 1 and 2).

Each test builds a tiny random model in transformers from a config, saves it, imports it with
attnlab, and compares float32 eager outputs: logits and hidden states within 1e-5, attention
weights within 1e-6, greedy decoding with the KV cache token for token. No download. The
refusals go through the CLI: one line, exit 2.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from attnlab.cli import main  # noqa: E402
from attnlab.generation import greedy  # noqa: E402
from attnlab.interop.hf import load_hf  # noqa: E402
from attnlab.run import load_run  # noqa: E402

TOL, ATTN_TOL = 1e-5, 1e-6


def _max_err(a, b) -> float:
    return (a.detach().float() - b.detach().float()).abs().max().item()


def attnlab(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(result) -> str:
    code, out, err = result
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnlab: error:"), err
    return lines[0]


# ---------------------------------------------------------------------------------------------
# T5
# ---------------------------------------------------------------------------------------------

T5_PIECES = ["▁the", "▁a", "▁cat", "▁dog", "▁sat", "▁on", "▁mat", "▁ran", "s", "▁"]
T5_PIECES += list("abcdefghijklmnopqrstuvwxyz")


def t5_tokenizer_json() -> str:
    """A small SentencePiece-style Unigram tokenizer, as T5's tokenizer.json is: <pad> 0,
    </s> 1, <unk> 2, Metaspace pieces, and </s> appended to every text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(p, -1.0 - 0.1 * i) for i, p in enumerate(T5_PIECES)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", 1)]
    )
    tok.add_special_tokens(["<pad>", "</s>", "<unk>"])
    return tok.to_str()


T5_SHAPES = {
    # the original T5: ReLU feed-forward, LM head tied to the shared embedding (output scaled)
    "t5": dict(feed_forward_proj="relu", tie_word_embeddings=True, num_layers=3,
               num_decoder_layers=2, num_heads=4, d_model=24, d_kv=8, d_ff=40),
    # v1.1 / flan: gated GELU, a separate LM head (no scale), heads narrower than d_model / H
    "t5-v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False, num_layers=2,
                    num_decoder_layers=2, num_heads=3, d_model=32, d_kv=6, d_ff=48),
    # v1.1 as transformers 5 saves it: scale_decoder_outputs false, no lm_head.weight in the
    # file (the head tied to the shared embedding, the output not scaled)
    "t5-v1.1-v5": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                       num_layers=2, num_decoder_layers=1, num_heads=2, d_model=16, d_kv=8,
                       d_ff=24),
}  # fmt: skip
OWN_HEAD = {"t5": False, "t5-v1.1": True, "t5-v1.1-v5": False}  # a separate lm_head.weight


# seeds whose greedy outputs vary (v1.1's: one row ends with </s> after 6 tokens); a random
# tied T5 mostly repeats one token, its input embedding dominating the tied readout
T5_SEEDS = {"t5": 0, "t5-v1.1": 1, "t5-v1.1-v5": 0}


def build_t5(tmp_path, shape: str):
    """A random T5ForConditionalGeneration saved with a tokenizer; (hf model, its dir)."""
    torch.manual_seed(T5_SEEDS[shape])
    kw = T5_SHAPES[shape]
    cfg = transformers.T5Config(vocab_size=48, relative_attention_num_buckets=8,
                                relative_attention_max_distance=12, dropout_rate=0.0,
                                decoder_start_token_id=0, attn_implementation="eager", **kw)  # fmt: skip
    m = transformers.T5ForConditionalGeneration(cfg).eval()
    d = tmp_path / shape
    m.save_pretrained(d)
    if OWN_HEAD[shape]:
        # transformers 5 always ties the head; give it one of its own, as v1.1 files have
        from safetensors.torch import load_file, save_file

        head = torch.nn.Parameter(torch.randn(cfg.vocab_size, cfg.d_model))
        m.lm_head.weight = head
        tensors = load_file(d / "model.safetensors")
        tensors["lm_head.weight"] = head.detach().clone()
        save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    (d / "tokenizer.json").write_text(t5_tokenizer_json(), encoding="utf-8")
    return m, d


def _t5_batch(vocab: int = 48):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, vocab, (3, 17), generator=g)
    src[:, -1] = 1  # </s>
    src[1, 11:] = 0  # padding in the source batch
    src[1, 10] = 1
    src[2, 5:] = 0
    src[2, 4] = 1
    tgt = torch.randint(3, vocab, (3, 14), generator=g)  # longer than max_distance
    tgt[:, 0] = 0  # the decoder starts from <pad>
    return src, tgt


@pytest.mark.parametrize("shape", sorted(T5_SHAPES))
def test_t5_matches_transformers(tmp_path, shape):
    hf, d = build_t5(tmp_path, shape)
    model, tokenizer, _ = load_hf(d)
    assert model.config.tie_weights == (not OWN_HEAD[shape])
    assert model.config.scale_output == T5_SHAPES[shape]["tie_word_embeddings"]
    src, tgt = _t5_batch()
    with torch.no_grad():
        out = hf(input_ids=src, attention_mask=(src != 0).long(), decoder_input_ids=tgt,
                 output_hidden_states=True, output_attentions=True)  # fmt: skip
        logits, acts = model(src, tgt, record=True)
    errs = {"logits": _max_err(logits, out.logits)}
    for stack, hidden in (("encoder", out.encoder_hidden_states),
                          ("decoder", out.decoder_hidden_states)):  # fmt: skip
        n = len(hidden) - 1  # HF: the input of each layer, then the output after the final norm
        for i in range(n):
            errs[f"{stack}.{i}"] = _max_err(acts[f"{stack}.blocks.{i}.resid_pre"], hidden[i])
        errs[f"{stack}.out"] = _max_err(acts[f"{stack}.out"], hidden[n])
    assert max(errs.values()) <= TOL, errs
    attn = {}
    for name, theirs in (("encoder.blocks.{}.attn", out.encoder_attentions),
                         ("decoder.blocks.{}.attn", out.decoder_attentions),
                         ("decoder.blocks.{}.cross", out.cross_attentions)):  # fmt: skip
        for i, w in enumerate(theirs):
            attn[name.format(i)] = _max_err(acts[name.format(i) + ".weights"], w)
    assert max(attn.values()) <= ATTN_TOL, attn


@pytest.mark.parametrize("shape", sorted(T5_SHAPES))
def test_t5_greedy_translation_with_the_cache_matches_generate(tmp_path, shape):
    hf, d = build_t5(tmp_path, shape)
    model, tokenizer, _ = load_hf(d)
    texts = ["the cat sat on the mat", "a dog ran", "cats"]
    ids = [tokenizer.encode(t) for t in texts]
    assert all(row[-1] == 1 for row in ids)  # the tokenizer appends </s>, as T5's does
    L = max(map(len, ids))
    src = torch.tensor([row + [0] * (L - len(row)) for row in ids])  # (B, S) padded
    ours = greedy(model, src, max_len=32)  # KV cache, stops at </s>
    with torch.no_grad():
        theirs = hf.generate(input_ids=src, attention_mask=(src != 0).long(), max_new_tokens=32,
                             do_sample=False, num_beams=1)  # fmt: skip
    for row, want in zip(ours, theirs.tolist()):
        want = want[1:]  # drop the decoder start (<pad>)
        want = want[: want.index(1)] if 1 in want else want
        assert row == want
        assert tokenizer.decode(row) == tokenizer.decode(want)  # the same translation


def test_t5_run_round_trips_through_import_hf_and_translates(capsys, tmp_path):
    hf, d = build_t5(tmp_path, "t5-v1.1")
    code, out, err = attnlab(capsys, "import-hf", d, "--out", tmp_path / "run")
    assert code == 0, err
    run = load_run(tmp_path / "run")
    src, tgt = _t5_batch()
    with torch.no_grad():
        want = hf(input_ids=src, attention_mask=(src != 0).long(), decoder_input_ids=tgt).logits
        assert _max_err(run.model(src, tgt), want) <= TOL
    # translate: the run's tokenizer reads T5's ids (start <pad>, end </s>)
    text = "the cat sat on the mat"
    code, out, err = attnlab(capsys, "translate", tmp_path / "run", text)
    assert code == 0, err
    ids = torch.tensor([run.tokenizer.encode_source(text)])
    with torch.no_grad():
        theirs = hf.generate(input_ids=ids, max_new_tokens=run.model.config.max_len - 1,
                             do_sample=False, num_beams=1)[0, 1:].tolist()  # fmt: skip
    assert out.strip() == run.tokenizer.decode_target(theirs).strip()


# ---------------------------------------------------------------------------------------------
# ViT
# ---------------------------------------------------------------------------------------------

VIT = dict(image_size=12, patch_size=4, num_channels=3, hidden_size=24, num_hidden_layers=2,
           num_attention_heads=4, intermediate_size=40, hidden_dropout_prob=0.0,
           attention_probs_dropout_prob=0.0, attn_implementation="eager")  # fmt: skip
PREPROCESSOR = {"do_resize": True, "size": {"height": 12, "width": 12}, "resample": 2,
                "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                "image_mean": [0.5, 0.4, 0.3], "image_std": [0.2, 0.25, 0.3],
                "image_processor_type": "ViTImageProcessor"}  # fmt: skip


def build_vit(tmp_path, arch: str, seed: int = 0):
    torch.manual_seed(seed)
    labels = {"id2label": {str(i): f"class{i}" for i in range(5)}} if "Classif" in arch else {}
    cfg = transformers.ViTConfig(**VIT, **labels)
    m = getattr(transformers, arch)(cfg).eval()
    with torch.no_grad():  # random [CLS] and positions (transformers starts them near zero),
        m.base_model.embeddings.cls_token.normal_()  # and queries and keys large enough for
        m.base_model.embeddings.position_embeddings.normal_(std=0.5)  # peaked attention
        for name, p in m.named_parameters():
            if name.endswith(("query.weight", "key.weight", "q_proj.weight", "k_proj.weight")):
                p.normal_(std=0.15)
    d = tmp_path / arch
    m.save_pretrained(d)
    (d / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR), encoding="utf-8")
    return m, d


@pytest.mark.parametrize("arch", ["ViTModel", "ViTForImageClassification"])
def test_vit_matches_transformers(tmp_path, arch):
    hf, d = build_vit(tmp_path, arch)
    model, tokenizer, _ = load_hf(d)
    images = torch.randn(3, 3, 12, 12)
    with torch.no_grad():
        out = hf(pixel_values=images, output_hidden_states=True, output_attentions=True)
        y, acts = model(images, record=True)
    errs = {f"hidden.{i}": _max_err(acts[f"blocks.{i}.resid_pre"], h)
            for i, h in enumerate(out.hidden_states[:-1])}  # fmt: skip
    errs["last"] = _max_err(acts[f"blocks.{len(out.hidden_states) - 2}.resid_post"],
                            out.hidden_states[-1])  # fmt: skip
    if arch == "ViTModel":
        errs["final norm"] = _max_err(acts["ln_f"], out.last_hidden_state)
        errs["pooler"] = _max_err(y, out.pooler_output)
    else:
        errs["logits"] = _max_err(y, out.logits)
        assert tokenizer.classes == [f"class{i}" for i in range(5)]
    assert max(errs.values()) <= TOL, errs
    attn = {i: _max_err(acts[f"blocks.{i}.attn.weights"], w) for i, w in enumerate(out.attentions)}
    assert max(attn.values()) <= ATTN_TOL, attn


def test_vit_preprocessing_matches_the_image_processor(tmp_path):
    from PIL import Image

    hf, d = build_vit(tmp_path, "ViTForImageClassification")
    _, tokenizer, _ = load_hf(d)
    rng = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (29, 23, 3), generator=rng, dtype=torch.uint8).numpy()
    Image.fromarray(pixels).save(tmp_path / "img.png")
    ours = tokenizer.image(str(tmp_path / "img.png"))  # (3, 12, 12): resized, rescaled, normalised
    try:
        processor = transformers.AutoImageProcessor.from_pretrained(d, backend="pil")
    except Exception:  # an older transformers: the slow processor is the PIL one
        processor = transformers.ViTImageProcessor.from_pretrained(d)
    theirs = processor(images=Image.fromarray(pixels), return_tensors="pt")["pixel_values"][0]
    assert ours.shape == theirs.shape == (3, 12, 12)
    assert _max_err(ours, theirs) <= 1e-6


def test_vit_run_classifies_an_image_file_like_transformers(capsys, tmp_path):
    from PIL import Image

    hf, d = build_vit(tmp_path, "ViTForImageClassification")
    code, out, err = attnlab(capsys, "import-hf", d, "--out", tmp_path / "run")
    assert code == 0, err
    run = load_run(tmp_path / "run")
    pixels = torch.randint(0, 256, (16, 16, 3), generator=torch.Generator().manual_seed(1),
                           dtype=torch.uint8).numpy()  # fmt: skip
    Image.fromarray(pixels).save(tmp_path / "img.png")
    image = run.tokenizer.image(str(tmp_path / "img.png"))
    with torch.no_grad():
        assert _max_err(run.model(image[None]), hf(pixel_values=image[None]).logits) <= TOL


def test_heads_scores_an_imported_vit_on_images_of_its_own_shape(capsys, tmp_path):
    """An imported ViT has no data of its own: heads must not probe it with the digits its
    task would default to (8x8 grayscale against a 12x12 RGB model crashed), but with images
    of the model's shape, and say so."""
    _, d = build_vit(tmp_path, "ViTForImageClassification")
    assert attnlab(capsys, "import-hf", d, "--out", tmp_path / "run")[0] == 0
    code, out, err = attnlab(capsys, "heads", tmp_path / "run", "--json", "--all")
    assert code == 0, err
    report = json.loads(out)
    assert len(report["heads"]) == VIT["num_hidden_layers"] * VIT["num_attention_heads"]
    assert any("random inputs of the model's shape" in n for n in report["notes"])
    assert any("imported from" in n for n in report["notes"])


@pytest.mark.parametrize("family", ["t5", "vit"])
def test_every_verb_and_identity_of_the_conformance_suite_holds_on_an_import(capsys, tmp_path,
                                                                             family):  # fmt: skip
    from conformance_helpers import conformance

    _, d = (build_t5(tmp_path, "t5") if family == "t5"
            else build_vit(tmp_path, "ViTForImageClassification"))  # fmt: skip
    assert main(["import-hf", str(d), "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()  # the import's own lines
    inputs = None
    if family == "vit":  # image files: an imported ViT has no test split of its own
        from PIL import Image

        g = torch.Generator().manual_seed(3)
        inputs = tuple(str(tmp_path / f"{name}.png") for name in ("clean", "corrupt"))
        for path in inputs:
            pixels = torch.randint(0, 256, (12, 12, 3), generator=g, dtype=torch.uint8)
            Image.fromarray(pixels.numpy()).save(path)
    out = conformance(capsys, tmp_path / "run", inputs=inputs)
    assert {"trace", "attention", "patch", "check"} <= set(out)


# ---------------------------------------------------------------------------------------------
# Refusals: one line, exit 2, nothing written
# ---------------------------------------------------------------------------------------------


def _refused(capsys, tmp_path, d, *words):
    out_dir = tmp_path / "refused"
    capsys.readouterr()  # what building the model printed (transformers' progress bars)
    line = one_error_line(attnlab(capsys, "import-hf", d, "--out", out_dir))
    assert all(w in line for w in words), line
    assert not (out_dir / "config.json").exists()


@pytest.mark.parametrize("family", ["t5", "vit"])
@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "reader"])
def test_a_directory_missing_a_file_is_refused(capsys, tmp_path, family, missing):
    _, d = build_t5(tmp_path, "t5") if family == "t5" else build_vit(tmp_path, "ViTModel")
    if missing == "reader":
        missing = "tokenizer.json" if family == "t5" else "preprocessor_config.json"
    (d / missing).unlink()
    _refused(capsys, tmp_path, d, missing)


@pytest.mark.parametrize("family", ["t5", "vit"])
def test_pickles_only_are_refused(capsys, tmp_path, family):
    _, d = build_t5(tmp_path, "t5") if family == "t5" else build_vit(tmp_path, "ViTModel")
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    _refused(capsys, tmp_path, d, "pickle")


@pytest.mark.parametrize(
    "family, key, value",
    [("t5", "feed_forward_proj", "gated-swish"), ("t5", "is_decoder", True),
     ("vit", "qkv_bias", False), ("vit", "image_size", [12, 16])],
)  # fmt: skip
def test_a_feature_attnlab_lacks_is_refused_by_name(capsys, tmp_path, family, key, value):
    _, d = build_t5(tmp_path, "t5") if family == "t5" else build_vit(tmp_path, "ViTModel")
    cfg = json.loads((d / "config.json").read_text())
    cfg[key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    _refused(capsys, tmp_path, d, key)


def test_sharded_bfloat16_weights_import(tmp_path):
    """Several safetensors files (model.safetensors.index.json) in bfloat16: the imported model
    computes in float32 what transformers computes from the same (bfloat16-rounded) weights."""
    hf, d = build_t5(tmp_path, "t5")
    hf.to(torch.bfloat16).save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    (tmp_path / "sharded" / "tokenizer.json").write_text(t5_tokenizer_json(), encoding="utf-8")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    model, _, provenance = load_hf(tmp_path / "sharded")
    assert len(provenance["source"]["weights"]) > 1
    src, tgt = _t5_batch()
    with torch.no_grad():
        want = hf.float()(input_ids=src, attention_mask=(src != 0).long(), decoder_input_ids=tgt)
        assert _max_err(model(src, tgt), want.logits) <= TOL


def test_predict_on_a_vit_without_classifier_is_refused(capsys, tmp_path):
    from PIL import Image

    _, d = build_vit(tmp_path, "ViTModel")
    assert attnlab(capsys, "import-hf", d, "--out", tmp_path / "run")[0] == 0
    Image.new("RGB", (12, 12)).save(tmp_path / "img.png")
    assert "no classifier" in one_error_line(
        attnlab(capsys, "predict", tmp_path / "run", tmp_path / "img.png")
    )


def test_t5_scores_pairs_with_its_own_ids_like_transformers_loss(tmp_path):
    """eval's teacher-forced loss frames each target as T5 does: <pad> y in, y </s> out."""
    from attnlab.tasks.seq2seq import score_pairs

    hf, d = build_t5(tmp_path, "t5-v1.1")
    model, tokenizer, _ = load_hf(d)
    pairs = [("the cat sat", "a dog"), ("a mat", "the cat ran")]
    ours = score_pairs(model, tokenizer, pairs)
    total = n = 0.0
    for s, t in pairs:
        labels = torch.tensor([tokenizer.encode_target(t) + [1]])
        with torch.no_grad():
            out = hf(input_ids=torch.tensor([tokenizer.encode_source(s)]), labels=labels)
        total, n = total + out.loss.item() * labels.numel(), n + labels.numel()
    assert abs(ours["loss"] - total / n) <= 1e-5


def test_t5_trace_shows_the_relative_bias_and_unscaled_scores(capsys, tmp_path):
    _, d = build_t5(tmp_path, "t5-v1.1")
    assert attnlab(capsys, "import-hf", d, "--out", tmp_path / "run")[0] == 0
    code, out, err = attnlab(capsys, "trace", tmp_path / "run", "the cat sat")
    assert code == 0, err
    assert "relative position bias" in out and "not scaled" in out
    assert "scaled by 1/sqrt" not in out and "sinusoid" not in out
