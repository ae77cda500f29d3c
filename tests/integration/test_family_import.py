"""import-hf on the decoder families, end to end: tokenizers (byte-level BPE, and the
SentencePiece-derived kind with byte fallback), sharded half-precision weights, every refusal
as one line and exit 2, and the look-inside verbs on an imported Llama and Gemma 2."""

from __future__ import annotations

import json
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

from attnlab.cli import main  # noqa: E402
from attnlab.interop.hf import load_hf, load_hf_tokenizer  # noqa: E402
from attnlab.run import load_run  # noqa: E402
from conformance_helpers import conformance  # noqa: E402

TEXT = "the cat sat on the mat. the dog ate the cake; a cat and a dog. " * 4
SIZE = dict(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            bos_token_id=None, eos_token_id=None, pad_token_id=None, initializer_range=0.2)  # fmt: skip


def byte_level_bpe() -> Tokenizer:
    """GPT-2 / Llama 3 / Qwen style: bytes mapped to printable characters, then BPE merges."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=290, initial_alphabet=alphabet))
    return tok


def sentencepiece_bpe() -> Tokenizer:
    """Llama 2 / Gemma style: spaces become "▁", unknown characters fall back to <0xNN> bytes."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in ["▁", *"abcdehmnostg.;", "▁t", "he", "▁the", "at", "▁c", "▁cat"]:
        vocab[piece] = len(vocab)
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("a", "t"), ("▁", "c"), ("▁c", "at")]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])  # fmt: skip
    return tok


def save_family(d, cls_name="LlamaConfig", tokenizer=None, dtype=None, shard=None, **fields):
    cfg = getattr(transformers, cls_name)(**{**SIZE, **fields}, attn_implementation="eager")
    model_cls = cls_name.replace("TextConfig", "Config").replace("Config", "ForCausalLM")
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(d, **({"max_shard_size": shard} if shard else {}))
    (tokenizer or byte_level_bpe()).save(str(d / "tokenizer.json"))
    return model


def attnlab(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()  # what came before (transformers' progress bars) is not the CLI's
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("make", [byte_level_bpe, sentencepiece_bpe])
def test_the_imported_tokenizer_gives_the_same_ids_and_text(tmp_path, make):
    save_family(tmp_path, tokenizer=make())
    ours, source = load_hf_tokenizer(tmp_path)
    theirs = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in ("the cat sat", "héllo, wörld ☃", " two  spaces"):
        assert ours.encode(text) == theirs.encode(text).ids, text
        assert ours.decode(ours.encode(text)) == theirs.decode(theirs.encode(text).ids)
    assert source == "tokenizer.json"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sharded_half_precision_weights_import(tmp_path, dtype):
    """float16 weights are computed in float32; bfloat16 ones stay bfloat16 (the run is the
    file's size) and compute what transformers computes from them in bfloat16, its default.
    (Before the real-size work bfloat16 was converted to float32 too: twice the memory.)"""
    save_family(tmp_path, dtype=dtype, shard="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    model, tokenizer, provenance = load_hf(tmp_path)
    assert len(provenance["source"]["weights"]) > 1  # several shards
    kept = dtype if dtype == torch.bfloat16 else torch.float32
    assert all(p.dtype == kept for p in model.parameters())
    ids = torch.tensor([tokenizer.encode("the cat sat on the mat")])
    load = transformers.AutoModelForCausalLM.from_pretrained
    with torch.no_grad():  # float32 from the same rounded weights: both sides' reference
        exact = load(tmp_path, dtype=torch.float32, attn_implementation="eager")(ids).logits
        got = model(ids).float()
        if kept == torch.float32:
            assert (got - exact).abs().max().item() < 1e-5
        else:  # as close to it as transformers' own bfloat16 computation, give or take
            theirs = load(tmp_path, dtype=kept, attn_implementation="eager")(ids).logits.float()
            err, their_err = (got - exact).abs().max(), (theirs - exact).abs().max()
            assert err <= 2 * their_err + 2**-8 * exact.abs().max(), (err, their_err)


def test_bfloat16_run_is_the_size_of_its_file_and_float32_on_request(tmp_path, capsys):
    """import-hf of bfloat16 weights writes a bfloat16 run ("dtype" in config.json) that loads
    as bfloat16, generates, and passes attnlab check at its precision; --dtype float32 gives
    the float32 run of before, whose logits the bfloat16 run's follow to bfloat16 rounding."""
    src = tmp_path / "hf"
    save_family(src, cls_name="Qwen2Config", dtype=torch.bfloat16, tie_word_embeddings=True)
    half, full = tmp_path / "half", tmp_path / "full"
    assert attnlab(capsys, "import-hf", src, "--out", half)[0] == 0
    assert attnlab(capsys, "import-hf", src, "--out", full, "--dtype", "float32")[0] == 0
    size = lambda d: (d / "model.safetensors").stat().st_size  # noqa: E731
    hf_bytes = sum(f.stat().st_size for f in src.glob("*.safetensors"))
    assert size(half) <= hf_bytes * 1.01 and size(full) >= 1.9 * hf_bytes
    assert json.loads((half / "config.json").read_text())["dtype"] == "bfloat16"
    assert "dtype" not in json.loads((full / "config.json").read_text())
    a, b = load_run(half), load_run(full)
    assert {p.dtype for p in a.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in b.model.parameters()} == {torch.float32}
    ids = torch.tensor([a.tokenizer.encode("the cat sat on the mat")])
    with torch.no_grad():
        want = b.model(ids)
        assert (a.model(ids).float() - want).abs().max() < 4 * 2**-8 * want.abs().max()
    code, out, _ = attnlab(capsys, "generate", half, "--prompt", "the cat", "--max-new-tokens",
                           "8", "--temperature", "0")  # fmt: skip
    assert code == 0 and out.strip()
    code, out, _ = attnlab(capsys, "check", half)
    assert code == 0, out
    assert attnlab(capsys, "export-hf", half, tmp_path / "out")[0] == 0  # bfloat16 as it came
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"
    assert size(tmp_path / "out") <= hf_bytes * 1.01


def test_a_run_of_an_unknown_dtype_is_refused(tmp_path, capsys):
    save_family(tmp_path / "hf", dtype=torch.bfloat16)
    assert attnlab(capsys, "import-hf", tmp_path / "hf", "--out", tmp_path / "run")[0] == 0
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    (tmp_path / "run" / "config.json").write_text(json.dumps({**cfg, "dtype": "int8"}))
    code, out, err = attnlab(capsys, "predict", tmp_path / "run", "the cat")
    assert code == 2 and not out
    assert "dtype 'int8' is not one attnlab runs hold (float32, bfloat16)" in err
    assert len(err.strip().splitlines()) == 1


def _drop(d, what):
    if what == "config.json":
        (d / "config.json").unlink()
    elif what == "weights":
        (d / "model.safetensors").unlink()
    elif what == "pickles only":
        (d / "model.safetensors").rename(d / "pytorch_model.bin")
    elif what == "tokenizer.json":
        (d / "tokenizer.json").unlink()
    else:  # a feature in config.json
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(what)
        (d / "config.json").write_text(json.dumps(cfg))


REFUSALS = [
    ("config.json", "no config.json"),
    ("weights", "no model.safetensors"),
    ("pickles only", "never unpickles"),
    ("tokenizer.json", "no tokenizer.json"),
    ({"num_local_experts": 8}, "mixture-of-experts"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
     "rope scaling type 'yarn'"),
    ({"model_type": "gemma3_text", "use_bidirectional_attention": True}, "bidirectional"),
    ({"layer_types": ["chunked_attention"] * 2}, "layer type 'chunked_attention'"),
    ({"hidden_act": "gelu_fast"}, "activation 'gelu_fast'"),
    ({"num_key_value_heads": 3}, "n_kv_heads"),
]  # fmt: skip


@pytest.mark.parametrize("what,says", REFUSALS, ids=[str(w)[:30] for w, _ in REFUSALS])
def test_an_incomplete_or_unsupported_directory_is_refused_in_one_line(
    capsys, tmp_path, what, says
):
    d = tmp_path / "hf"
    save_family(d)
    _drop(d, what)
    code, out, err = attnlab(capsys, "import-hf", d, "--out", tmp_path / "run")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and says in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


# every decoder family import-hf reads, each with the pieces that set it apart
FAMILY_PIECES = {
    "LlamaConfig": {},
    "MistralConfig": {"sliding_window": 4},
    "Qwen2Config": {"attention_bias": True},
    "Qwen3Config": {"head_dim": 8},
    "GemmaConfig": {"head_dim": 8},
    # a cap that bends the logits (they are about 1)
    "Gemma2Config": {"head_dim": 8, "sliding_window": 4, "final_logit_softcapping": 1.0},
    "Gemma3TextConfig": {"head_dim": 8, "sliding_window": 4,
                         "layer_types": ["sliding_attention", "full_attention"]},
    "GPTNeoXConfig": {"rotary_pct": 0.5, "num_key_value_heads": 4},
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(FAMILY_PIECES))
def imported(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    save_family(d, request.param, **FAMILY_PIECES[request.param])
    run = tmp_path_factory.mktemp("run") / "run"
    assert main(["import-hf", str(d), "--out", str(run)]) == 0
    return run


def test_the_look_inside_verbs_run_on_an_imported_decoder(capsys, imported, tmp_path):
    text = "the cat sat on the mat"
    (tmp_path / "eval.txt").write_text(TEXT)
    for args in (["predict", imported, text], ["eval", imported, "--data", tmp_path / "eval.txt"],
                 ["similarity", imported, text], ["influence", imported, text],
                 ["explore", imported, text, "--html", tmp_path / "x.html"], ["check", imported],
                 ["ablate", imported, text, "--head", "1.3"], ["heads", imported],
                 ["heads", imported, "--importance", "--data", tmp_path / "eval.txt"],
                 *(["attribute", imported, text, "--method", m] for m in ("rollout", "flow")),
                 *(["attribute", imported, text, "--method", m, "--target", " mat"]
                   for m in ("grad", "ig")),["trace", imported, text], ["attention", imported, text, "--layer", "1"],
                 ["lens", imported, text], ["attribute", imported, text, "--method", "dla", "--target", " mat"],
                 ["patch", imported, "--clean", "the cat sat", "--corrupt", "the dog sat",
                  "--target", " on"],
                 ["generate", imported, "--prompt", "the", "--max-new-tokens", "8"]):  # fmt: skip
        code, out, err = attnlab(capsys, *args)
        assert code == 0 and out.strip(), (args[0], err[-2000:])


def test_an_imported_run_loads_with_its_pieces(imported):
    model, tokenizer = load_run(imported)
    c = model.config
    if c.parallel:  # GPT-NeoX: layer norms, a plain MLP, every head its own K/V
        assert c.norm == "layer" and c.ffn != "gated" and c.n_kv_heads in (None, c.n_head)
    else:
        assert c.norm.startswith("rms") and c.ffn == "gated" and c.n_kv_heads == 2
    assert tokenizer.vocab_size <= c.vocab_size


def test_the_conformance_identities_hold_on_an_imported_decoder(capsys, imported):
    """DLA's parts sum to the logit (RMS norms, four-norm blocks and the final softcap frozen);
    lens at the last layer gives the model's own prediction; patching the whole clean residual
    recovers 1."""
    text = "the cat sat on the mat"
    code, out, err = attnlab(capsys, "attribute", imported, text, "--method", "dla",
                             "--target", " mat", "--json")  # fmt: skip
    assert code == 0, err
    dla = json.loads(out)
    assert dla["error"] < 1e-6 * (1 + abs(dla["logit"])), dla["frozen"]
    assert abs(dla["logit"] - dla["logit_float32"]) < 1e-4
    code, out, err = attnlab(capsys, "patch", imported, "--clean", "the cat sat", "--corrupt",
                             "the dog sat", "--target", " on", "--json")  # fmt: skip
    assert code == 0, err
    patch = json.loads(out)
    last = max(r["layer"] for r in patch["results"])
    for r in patch["results"]:  # the final residual: the clean run's metric, exactly
        if r["layer"] == last:
            assert r["recovered"] == (1.0 if r["position"] == patch["position"] else 0.0)
    code, out, err = attnlab(capsys, "lens", imported, text, "--json")
    assert code == 0, err
    assert max(json.loads(out)["kl"][-1]) < 1e-4  # the last layer's lens is the model itself


def test_every_verb_and_identity_of_the_conformance_suite_holds(capsys, imported, tmp_path):
    (tmp_path / "eval.txt").write_text(TEXT)
    out = conformance(capsys, imported, data=tmp_path / "eval.txt")
    assert {"trace", "attention", "lens", "dla", "patch", "check", "eval"} <= set(out)


def test_attention_says_which_kv_head_a_query_head_shares(capsys, imported):
    if load_run(imported).model.config.parallel:
        pytest.skip("GPT-NeoX: every query head has its own K/V head")
    code, out, err = attnlab(capsys, "attention", imported, "the cat sat", "--layer", "1",
                             "--head", "3")  # fmt: skip
    assert code == 0, err
    assert "reads K/V head 1 of 2, shared by query heads 2..3" in " ".join(out.split())
    code, out, err = attnlab(capsys, "attention", imported, "the cat sat", "--head", "1", "--json")
    got = json.loads(out)
    assert (got["kv_head"], got["n_kv_heads"]) == (0, 2)


def test_the_trace_says_what_each_new_step_is(capsys, imported):
    code, out, err = attnlab(capsys, "trace", imported, "the cat sat on the mat", "--head", "3")
    out = " ".join(out.split())
    if load_run(imported).model.config.parallel:  # GPT-NeoX: its own steps
        assert code == 0 and "rotated by position" in out and "parallel" in out, out
        return
    assert code == 0 and "RMS norm before attention" in out and "rotated by position" in out
    assert "K/V head 1, shared" in out and "query heads 2..3 all read K/V head 1" in out
    if "softcap" in out:  # Gemma 2: its scale, softcap and window
        assert "scaled by 0.0625" in out and "sliding window of 4" in out
    assert "feed-forward: gate x up" in out and "final RMS norm" in out


def test_import_hf_help_names_every_model_type_it_reads():
    """The help names every family and every model_type the families' modules register, in
    their order (GPT-2 and BERT first, as the help always listed them)."""
    from attnlab.cli import build_parser, verbs
    from attnlab.interop import hf

    types = list(hf.loaders())
    assert types[:4] == ["gpt2", "bert", "llama", "mistral"] and {"t5", "vit"} <= set(types)
    parser = build_parser()
    p = verbs(parser)["import-hf"]
    assert "model_type: " + ", ".join(types) + "." in " ".join(p.description.split())
    listed = " ".join(p.format_help().split())  # the verb list points here, to stay short
    assert all(f.label in listed for f in hf.families().values())
