"""Run directories: bit-exact round trip, and every way a run can be broken is a clear RunError."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from attnlab.models.gpt import GPT, GPTConfig
from attnlab.run import load_run
from attnlab.rundir import RunError, save_model
from attnlab.safetensors_io import save_tensors
from attnlab.tokenizers import CharTokenizer


@pytest.fixture
def run(tmp_path):
    model = GPT(GPTConfig(vocab_size=12, block_size=16, n_layer=2, n_head=2, d_model=16))
    tok = CharTokenizer.from_text("abcdefghijk ")
    save_model(tmp_path / "run", model, tok)
    return tmp_path / "run", model


def test_round_trip_is_bit_exact(run):
    path, model = run
    loaded, tok = load_run(path)
    for (k, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), k
    assert loaded.lm_head.weight is loaded.tok_embed.weight, "tied weights are re-tied"
    ids = torch.randint(0, 12, (2, 9))
    assert torch.equal(model.eval()(ids), loaded(ids))
    assert tok.decode(tok.encode("abc k")) == "abc k"


def test_no_temporary_files_are_left(run):
    path, _ = run
    assert sorted(p.name for p in path.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]


def test_missing_run_directory(tmp_path):
    with pytest.raises(RunError, match="no such run directory"):
        load_run(tmp_path / "nope")


def test_unknown_format_version(run):
    path, _ = run
    cfg = json.loads((path / "config.json").read_text())
    cfg["attnlab_format"] = 99
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(RunError, match="unknown attnlab_format 99"):
        load_run(path)
    del cfg["attnlab_format"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(RunError, match="no attnlab_format"):
        load_run(path)


def test_truncated_safetensors(run):
    path, _ = run
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(RunError, match="not a valid safetensors"):
        load_run(path)


def test_garbage_safetensors(run):
    path, _ = run
    (path / "model.safetensors").write_bytes(b"\x00" * 7)
    with pytest.raises(RunError, match="not a valid safetensors"):
        load_run(path)


def test_config_that_does_not_match_the_weights(run):
    path, _ = run
    cfg = json.loads((path / "config.json").read_text())
    cfg["config"]["d_model"] = 32
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(RunError, match="does not match config.json"):
        load_run(path)


def test_wrong_dtype_is_refused(run):
    path, model = run
    sd = {k: v.double() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_tensors(path / "model.safetensors", sd)
    with pytest.raises(RunError, match="dtype"):
        load_run(path)


def test_invalid_config_values(run):
    path, _ = run
    cfg = json.loads((path / "config.json").read_text())
    cfg["config"]["n_head"] = 3
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(RunError, match="divisible"):
        load_run(path)


@pytest.mark.parametrize("name", ["model.pt", "pytorch_model.bin"])
def test_pickles_are_refused_without_being_opened(tmp_path, name):
    class Boom:
        def __reduce__(self):
            return (exec, ("open('PWNED', 'w').write('x')",))

    d = tmp_path / "pickled"
    d.mkdir()
    (d / name).write_bytes(pickle.dumps(Boom()))
    with pytest.raises(RunError, match="pickle"):
        load_run(d)
    with pytest.raises(RunError, match="pickle"):
        load_run(d / name)
    assert not (tmp_path / "PWNED").exists() and not (d / "PWNED").exists()


# Every model type a run directory can hold: a tiny config with every optional part switched on.
TINY_CONFIGS = {
    "gpt": {"vocab_size": 11, "block_size": 8, "n_layer": 2, "n_head": 2, "d_model": 8},
    "encoder": {
        "vocab_size": 11,
        "block_size": 8,
        "n_layer": 2,
        "n_head": 2,
        "d_model": 8,
        "mlm_head": True,
        "pooler": True,
        "num_labels": 3,
    },  # fmt: skip
    "seq2seq": {
        "src_vocab_size": 9,
        "tgt_vocab_size": 7,
        "max_len": 8,
        "n_encoder_layers": 1,
        "n_decoder_layers": 1,
        "n_head": 2,
        "d_model": 8,
    },
    "rnn": {
        "src_vocab_size": 9,
        "tgt_vocab_size": 7,
        "d_embed": 4,
        "d_hidden": 6,
        "attention": "additive",
    },
    "vit": {
        "image_size": 4,
        "patch_size": 2,
        "channels": 3,
        "n_classes": 3,
        "n_layer": 2,
        "n_head": 2,
        "d_model": 8,
    },  # fmt: skip
}


def _model_type_or_skip(model_type: str):
    from attnlab.rundir import model_class

    cls = model_class(model_type)
    assert model_type in TINY_CONFIGS, f"add a tiny {model_type} config to TINY_CONFIGS"
    return cls


@pytest.mark.parametrize("model_type", ["gpt", "encoder", "seq2seq", "rnn", "vit"])
def test_loading_checks_every_tensor_name_shape_and_dtype(tmp_path, model_type):
    """Drop, reshape, retype or add any one tensor: load_model names it and refuses."""
    from safetensors.torch import load_file, save_file

    from attnlab.rundir import load_model

    cls = _model_type_or_skip(model_type)
    torch.manual_seed(0)
    model = cls(cls.config_class(**TINY_CONFIGS[model_type]))
    save_model(tmp_path, model)
    path = tmp_path / "model.safetensors"
    good = load_file(str(path))
    reloaded = load_model(tmp_path)
    for k, v in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[k], v), k

    def refused(tensors, needle):
        save_file(tensors, str(path))
        with pytest.raises(RunError) as e:
            load_model(tmp_path)
        assert needle in str(e.value) and str(path) in str(e.value)

    assert len(good) > 5
    for name, t in good.items():
        refused({k: v for k, v in good.items() if k != name}, f"missing tensor {name!r}")
        bigger = torch.zeros(t.shape[0] + 1, *t.shape[1:], dtype=t.dtype) if t.dim() else t[None]
        refused({**good, name: bigger}, f"{name} has shape {tuple(bigger.shape)}")
        if t.is_floating_point():
            refused({**good, name: t.double()}, f"{name} has dtype torch.float64")
    refused({**good, "blocks.9.attn.q.weight": torch.zeros(2)}, "unexpected tensor")
    save_file(good, str(path))
    load_model(tmp_path)  # the untouched file still loads
