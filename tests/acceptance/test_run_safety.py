"""A run directory is untrusted input, and one process writes it at a time (issue 16, item 3).

- Loading reads the safetensors header first and checks it against config.json and the
  tokenizer before anything is allocated; then the model is built on the meta device and the
  weights assigned: every model type loads bit-identically, at the cost of one copy.
- Edited run directories (sizes blown up, layers added, vocabulary changed, tensors added,
  files truncated, headers lying) are refused through the real CLI in one line, quickly, and
  the refusing process never grows by more than the weights' size: for every kind of run
  (GPT, masked LM, classifier, Transformer and LSTM encoder-decoders, ViT, imported GPT-2),
  by the verb that reads it and by train --resume.
- the writer lock (``attnlab.files.FileLock``, held by a ``RunDir``): training.train takes it
  for every task before anything else; a second writer is refused naming the first; readers
  never take it; kill -9 frees it at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import mmap
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnlab import rundir
from attnlab.data.images import ImageTokenizer
from attnlab.files import FileLock, atomic_write_text
from attnlab.run import load_run
from attnlab.rundir import RunDir, RunError, save_model
from attnlab.safetensors_io import load_tensors, read_header
from attnlab.tokenizers import CharTokenizer, PairTokenizer
from attnlab.training import run as training
from cli_helpers import SRC, run_cli
from fault_cli import command
from forked_cli import watch
from lm_helpers import TEXT, TINY_TRAIN, train_losses
from task_helpers import TASKS, given, train_args, write_task_data

ENV = {**os.environ, "PYTHONPATH": str(SRC)}  # for `python -c` children: this checkout first

# ---------------------------------------------------------------------------------------------
# every model type loads bit-identically: meta build + assigned weights
# ---------------------------------------------------------------------------------------------

# (model_type, config) for every kind of run, with the parts loading must get right: tied and
# untied heads, shared embeddings, computed position tables (sinusoidal, rotary), LSTMs.
VARIANTS = {
    "gpt tied learned": ("gpt", dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, d_model=8)),
    "gpt untied rotary": ("gpt", dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, d_model=8,
                                      pos="rotary", tie_weights=False)),
    "gpt sinusoidal post-norm": ("gpt", dict(vocab_size=11, block_size=8, n_layer=1, n_head=2,
                                             d_model=8, pos="sinusoidal", norm_first=False)),
    "encoder with every head": ("encoder", dict(vocab_size=11, block_size=8, n_layer=2, n_head=2,
                                                d_model=8, mlm_head=True, pooler=True,
                                                num_labels=3)),
    "encoder sinusoidal untied": ("encoder", dict(vocab_size=11, block_size=8, n_layer=1,
                                                  n_head=2, d_model=8, pos="sinusoidal",
                                                  mlm_head=True, tie_weights=False,
                                                  type_vocab_size=0)),
    "seq2seq": ("seq2seq", dict(src_vocab_size=9, tgt_vocab_size=7, max_len=8,
                                n_encoder_layers=1, n_decoder_layers=2, n_head=2, d_model=8)),
    "seq2seq shared embeddings": ("seq2seq", dict(src_vocab_size=9, tgt_vocab_size=9, max_len=8,
                                                  n_encoder_layers=1, n_decoder_layers=1,
                                                  n_head=2, d_model=8, share_embeddings=True,
                                                  pos="learned", norm_first=True)),
    "seq2seq untied": ("seq2seq", dict(src_vocab_size=9, tgt_vocab_size=7, max_len=8,
                                       n_encoder_layers=1, n_decoder_layers=1, n_head=2,
                                       d_model=8, tie_weights=False)),
    "lstm": ("rnn", dict(src_vocab_size=9, tgt_vocab_size=7, d_embed=4, d_hidden=6,
                         attention="none", n_layer=2)),
    "lstm additive attention": ("rnn", dict(src_vocab_size=9, tgt_vocab_size=7, d_embed=4,
                                            d_hidden=6, attention="additive")),
    "lstm general attention": ("rnn", dict(src_vocab_size=9, tgt_vocab_size=7, d_embed=4,
                                           d_hidden=6, attention="general")),
    "lstm classifier": ("lstm-classifier", dict(vocab_size=11, d_embed=4, d_hidden=6,
                                                num_labels=3, block_size=8)),
    "mlp classifier uniform": ("lstm-classifier", dict(vocab_size=11, d_embed=4, d_hidden=6,
                                                       encoder="mlp", attention="uniform")),
    "vit": ("vit", dict(image_size=4, patch_size=2, channels=3, n_classes=3, n_layer=2,
                        n_head=2, d_model=8)),
    "t5 tied": ("t5", dict(vocab_size=11, max_len=8, n_encoder_layers=2, n_decoder_layers=1,
                           n_head=2, d_model=8, d_kv=3, d_ff=12, num_buckets=4, max_distance=8)),
    "t5 v1.1 untied gated": ("t5", dict(vocab_size=11, max_len=8, n_encoder_layers=1,
                                        n_decoder_layers=2, n_head=2, d_model=8, d_kv=4, d_ff=12,
                                        num_buckets=4, max_distance=8, ffn="gated",
                                        activation="gelu_new", tie_weights=False,
                                        scale_output=False)),
}  # fmt: skip


def chars(n: int) -> CharTokenizer:
    """A character tokenizer of exactly ``n`` tokens."""
    return CharTokenizer.from_text("".join(chr(0x4E00 + i) for i in range(n)))


def tokenizer_for(model):
    """The tokenizer a real run of ``model`` would carry: the same vocabulary."""
    c = model.config
    if model.model_type in ("gpt", "encoder", "lstm-classifier"):
        return chars(c.vocab_size)
    if model.model_type in ("seq2seq", "rnn"):
        return PairTokenizer(chars(c.src_vocab_size - 3), chars(c.tgt_vocab_size - 3))
    if model.model_type == "t5":  # <pad>, </s>, <unk>, then one id per character
        return type(model).example_tokenizer(
            "".join(chr(0x61 + i) for i in range(c.vocab_size - 3))
        )
    classes = [f"class{i}" for i in range(c.n_classes)]
    return ImageTokenizer("digits", classes, c.image_size, c.channels, seed=0, val_fraction=0.1)


def outputs(model, seed: int = 0) -> list[torch.Tensor]:
    """Everything the model computes from one random input, in eval mode."""
    g = torch.Generator().manual_seed(seed)
    c = model.config
    with torch.no_grad():
        if model.model_type in ("gpt", "lstm-classifier"):
            return [model(torch.randint(c.vocab_size, (2, 7), generator=g))]
        if model.model_type == "encoder":
            ids = torch.randint(c.vocab_size, (2, 7), generator=g)
            outs = [model(ids)]
            outs += [model.mlm_logits(ids)] if c.mlm_head else []
            return outs + ([model.classify(ids)] if c.num_labels else [])
        if model.model_type in ("seq2seq", "rnn"):
            src = torch.randint(3, c.src_vocab_size, (2, 6), generator=g)
            tgt = torch.randint(3, c.tgt_vocab_size, (2, 5), generator=g)
            return [model(src, tgt)]
        if model.model_type == "t5":  # one vocabulary for both sides
            src = torch.randint(2, c.vocab_size, (2, 6), generator=g)
            tgt = torch.randint(2, c.vocab_size, (2, 5), generator=g)
            return [model(src, tgt)]
        return [model(torch.rand(2, c.channels, c.image_size, c.image_size, generator=g))]


def tied_groups(model) -> set[frozenset[str]]:
    """Names that are one and the same parameter."""
    groups: dict[int, set[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), set()).add(name)
    return {frozenset(g) for g in groups.values() if len(g) > 1}


def test_every_model_type_has_variants_and_tokenizer_rules():
    from attnlab.models.declare import registered

    assert {t for t, _ in VARIANTS.values()} == set(registered())
    assert all(cls.tokenizer_fields for cls in registered().values())


@pytest.mark.parametrize("variant", VARIANTS)
def test_saved_and_loaded_models_are_bit_identical(tmp_path, variant):
    model_type, config = VARIANTS[variant]
    cls = rundir.model_class(model_type)
    torch.manual_seed(3)
    model = cls(cls.config_class(**config)).eval()
    save_model(tmp_path, model, tokenizer_for(model))
    loaded, tok = load_run(tmp_path)
    assert type(loaded) is cls and not loaded.training
    assert tok.vocab_size == tokenizer_for(model).vocab_size
    before, after = model.state_dict(), loaded.state_dict()
    assert list(before) == list(after)
    for name in before:
        assert torch.equal(before[name], after[name]), name
    computed = dict(model.named_buffers())  # the tables not in the file: recomputed exactly
    assert set(computed) == set(dict(loaded.named_buffers()))
    for name, b in loaded.named_buffers():
        assert b.device.type == "cpu" and torch.equal(b, computed[name]), name
    assert tied_groups(loaded) == tied_groups(model)  # re-tied, not two copies
    for a, b in zip(outputs(model), outputs(loaded)):
        assert torch.equal(a, b)


def test_a_loaded_model_trains_without_touching_its_file(tmp_path):
    """The weights are mapped copy-on-write: updating them in place (an optimizer step) never
    writes to model.safetensors, and the run still loads as it was."""
    model_type, config = VARIANTS["gpt untied rotary"]
    cls = rundir.model_class(model_type)
    model = cls(cls.config_class(**config))
    save_model(tmp_path, model, tokenizer_for(model))
    digest = hashlib.sha256((tmp_path / "model.safetensors").read_bytes()).hexdigest()
    loaded, _ = load_run(tmp_path)
    loaded.train()
    ids = torch.randint(11, (2, 8))
    loaded(ids).logsumexp(-1).mean().backward()
    with torch.no_grad():  # a gradient step, in place, as every optimizer takes one
        for p in loaded.parameters():
            p.sub_(0.1 * p.grad)
    assert not torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    assert hashlib.sha256((tmp_path / "model.safetensors").read_bytes()).hexdigest() == digest
    again, _ = load_run(tmp_path)
    assert torch.equal(again.lm_head.weight, model.lm_head.weight)


def test_load_tensors_matches_safetensors_for_every_dtype_and_shape(tmp_path):
    g = torch.Generator().manual_seed(0)
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]  # fmt: skip
    for trial in range(20):
        tensors = {}
        for i in range(int(torch.randint(1, 8, (), generator=g))):
            shape = tuple(int(s) for s in torch.randint(0, 5, (int(torch.randint(0, 4, ())),)))
            dtype = dtypes[int(torch.randint(len(dtypes), (), generator=g))]
            tensors[f"t{i}"] = (torch.randn(shape, generator=g) * 50).to(dtype)
        path = tmp_path / f"{trial}.safetensors"
        save_file(tensors, str(path), metadata={"step": str(trial)})
        header = read_header(path)
        assert header.metadata == {"step": str(trial)}
        reference = load_file(str(path))
        for mapped in (False, True):
            got = load_tensors(path, mmap=mapped)
            assert set(got) == set(reference) == set(header.tensors)
            for k, t in reference.items():
                assert got[k].dtype == t.dtype == header.tensors[k].dtype
                assert tuple(got[k].shape) == tuple(t.shape) == header.tensors[k].shape
                assert torch.equal(got[k], t), k


# ---------------------------------------------------------------------------------------------
# headers that lie: refused from the header alone
# ---------------------------------------------------------------------------------------------


def raw_safetensors(path: Path, header: dict, data: bytes, claimed: int | None = None) -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if claimed is None else claimed) + text + data)
    return path


F32 = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
BAD_HEADERS = {
    "length past the file": ({"w": F32}, bytes(16), 10**6, "more than the file"),
    "huge length": ({"w": F32}, bytes(16), 2**62, "more than 16,777,216 bytes"),
    "truncated data": ({"w": F32}, bytes(10), None, "truncated"),
    "huge shape": ({"w": {**F32, "shape": [2**40, 2**40]}}, bytes(16), None, "needs"),
    "huge shape and offsets": (
        {"w": {"dtype": "F32", "shape": [2**40, 2**20], "data_offsets": [0, 2**62]}},
        bytes(16),
        None,
        "truncated",
    ),  # fmt: skip
    "overlap": ({"a": F32, "b": {**F32, "data_offsets": [8, 24]}}, bytes(24), None, "overlaps"),
    "gap": ({"a": {**F32, "data_offsets": [4, 20]}}, bytes(20), None, "gap"),
    "bytes after the data": ({"w": F32}, bytes(20), None, "4 bytes after the last tensor"),
    "unknown dtype": ({"w": {**F32, "dtype": "F128"}}, bytes(16), None, "unknown dtype"),
    "negative size": ({"w": {**F32, "shape": [-2, -8]}}, bytes(16), None, "not a list of sizes"),
    "offsets backwards": ({"w": {**F32, "data_offsets": [16, 0]}}, bytes(16), None, "[start, end]"),
    "not an object": ([1, 2], b"", None, "not a JSON object"),
}


@pytest.mark.parametrize("case", BAD_HEADERS)
def test_a_lying_header_is_refused_before_any_data_is_read(tmp_path, case):
    header, data, claimed, needle = BAD_HEADERS[case]
    path = raw_safetensors(tmp_path / "model.safetensors", header, data, claimed)
    with pytest.raises(RunError) as e:
        read_header(path)
    assert str(e.value).startswith(f"{path}: not a valid safetensors file (")
    assert needle in str(e.value)
    with pytest.raises(RunError):
        load_tensors(path)


def test_a_duplicate_tensor_name_is_refused(tmp_path):
    path = tmp_path / "dup.safetensors"
    text = b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
    text += b'"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}'
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(8))
    with pytest.raises(RunError, match="'w' appears twice"):
        read_header(path)


# ---------------------------------------------------------------------------------------------
# config.json and tokenizer files that disagree with the weights: refused in-process
# ---------------------------------------------------------------------------------------------


def saved(tmp_path, variant: str) -> Path:
    model_type, config = VARIANTS[variant]
    cls = rundir.model_class(model_type)
    model = cls(cls.config_class(**config))
    save_model(tmp_path / "run", model, tokenizer_for(model))
    return tmp_path / "run"


def edit_json(path: Path, edit) -> None:
    obj = json.loads(path.read_text())
    edit(obj)
    path.write_text(json.dumps(obj))


def test_layer_counts_past_the_file_are_refused_before_building(tmp_path):
    run = saved(tmp_path, "gpt tied learned")
    edit_json(run / "config.json", lambda c: c["config"].update(n_layer=10**9))
    start = time.perf_counter()
    with pytest.raises(RunError, match=r"n_layer = 1,000,000,000 implies 16,000,000,004 tensors"):
        load_run(run)
    assert time.perf_counter() - start < 2  # never builds a billion layers, even on meta


@pytest.mark.parametrize(
    "variant, field",
    [("gpt tied learned", "n_layer"), ("encoder with every head", "n_layer"),
     ("seq2seq", "n_decoder_layers"), ("lstm", "n_layer"), ("vit", "n_layer")],
)  # fmt: skip
def test_added_layers_are_refused_for_every_model_type(tmp_path, variant, field):
    """One layer more: the model is built (on meta) to name the first missing tensor; a
    thousand times more: refused from the tensor count alone, before building."""
    run = saved(tmp_path, variant)
    n = VARIANTS[variant][1][field]
    edit_json(run / "config.json", lambda c: c["config"].update({field: n + 1}))
    with pytest.raises(RunError, match=r"model.safetensors: does not match config.json: missing"):
        load_run(run)
    edit_json(run / "config.json", lambda c: c["config"].update({field: n * 1000}))
    with pytest.raises(RunError, match=rf"config.json: {field} = {n * 1000:,} implies "):
        load_run(run)


def test_computed_tables_larger_than_the_weights_are_refused(tmp_path):
    """block_size is in no tensor of a rotary GPT; its cos/sin tables would still be built."""
    run = saved(tmp_path, "gpt untied rotary")
    edit_json(run / "config.json", lambda c: c["config"].update(block_size=10**9))
    with pytest.raises(RunError, match=r"computes 16.0 GB of tables \(such as blocks.0"):
        load_run(run)


def test_a_size_past_int64_is_refused(tmp_path):
    run = saved(tmp_path, "gpt tied learned")
    edit_json(run / "config.json", lambda c: c["config"].update(d_model=2**62, n_head=1))
    with pytest.raises(RunError, match="config.json"):
        load_run(run)


TOKENIZER_EDITS = {
    "gpt: a token added": ("gpt tied learned", "tokenizer.json", +1, "vocab_size is 12"),
    "gpt: a token removed": ("gpt tied learned", "tokenizer.json", -1, "vocab_size is 10"),
    "encoder: a token added": ("encoder with every head", "tokenizer.json", +1, "vocab_size"),
    "seq2seq source": ("seq2seq", "tokenizer.json", +2, "src_vocab_size is 11"),
    "seq2seq target": ("seq2seq", "target_tokenizer.json", -1, "tgt_vocab_size is 6"),
    "lstm target": ("lstm", "target_tokenizer.json", +1, "tgt_vocab_size is 8"),
    "vit: a class added": ("vit", "tokenizer.json", +1, "vocab_size is 4"),
}


@pytest.mark.parametrize("case", TOKENIZER_EDITS)
def test_a_tokenizer_that_disagrees_with_the_config_is_refused(tmp_path, case):
    variant, name, change, needle = TOKENIZER_EDITS[case]
    run = saved(tmp_path, variant)

    def edit(tok):
        body = tok["attnlab"]
        key = "classes" if body["type"] == "image" else "vocab"
        body[key] = body[key] + ["extra", "more"][:change] if change > 0 else body[key][:change]

    edit_json(run / name, edit)
    with pytest.raises(RunError) as e:
        load_run(run)
    assert str(e.value).startswith(f"{run / name}: does not match config.json: ")
    assert needle in str(e.value)


def test_a_vit_tokenizer_for_other_images_is_refused(tmp_path):
    run = saved(tmp_path, "vit")
    edit_json(run / "tokenizer.json", lambda t: t["attnlab"].update(image_size=8))
    with pytest.raises(RunError, match="image_size is 8, config.json's image_size is 4"):
        load_run(run)


def test_an_encoder_decoder_without_its_target_tokenizer_is_refused(tmp_path):
    run = saved(tmp_path, "seq2seq")
    (run / "target_tokenizer.json").unlink()
    with pytest.raises(RunError, match="no target_tokenizer.json, which a seq2seq run needs"):
        load_run(run)


def test_an_imported_run_may_have_a_padded_vocabulary_but_no_unknown_ids(tmp_path):
    """As import-hf accepts: a Hugging Face model's vocabulary may be larger than its
    tokenizer's, never smaller."""
    run = saved(tmp_path, "encoder with every head")
    edit_json(run / "config.json", lambda c: c.update(source={"format": "huggingface"}))
    edit_json(
        run / "tokenizer.json", lambda t: t["attnlab"].update(vocab=t["attnlab"]["vocab"][:-2])
    )
    assert load_run(run)[1].vocab_size == 9
    edit_json(run / "tokenizer.json", lambda t: t["attnlab"]["vocab"].extend(["x", "y", "z"]))
    with pytest.raises(RunError, match="vocab_size is 12, config.json's vocab_size is 11"):
        load_run(run)


# ---------------------------------------------------------------------------------------------
# the real CLI: every edited run refused in one line, quickly, without growing
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def baby(tmp_path_factory) -> Path:
    """An untrained baby GPT run (4 layers, d_model 128: 3.2 MB of weights; 34 characters)
    and the text it reads."""
    from attnlab.models.gpt import GPT, GPTConfig

    d = tmp_path_factory.mktemp("baby")
    (d / "text.txt").write_text(TEXT, encoding="utf-8")
    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=4, n_head=4, d_model=128))
    save_model(d / "run", model, tok)
    return d


def _set(**sizes):
    return lambda run: edit_json(run / "config.json", lambda c: c["config"].update(sizes))


def _scale_width(run: Path) -> None:
    edit_json(run / "config.json", lambda c: c["config"].update(d_model=128 * 512))


def _rewrite_weights(edit):
    def spoil(run: Path) -> None:
        path = run / "model.safetensors"
        tensors = load_file(str(path))
        save_file(edit(tensors), str(path), metadata={"format": "pt"})

    return spoil


def _truncate(run: Path) -> None:
    path = run / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])


def _claim_huge_shape(run: Path) -> None:
    """Rewrite the header so that tok_embed.weight claims (2^31, 2^31): 16 EiB."""
    path = run / "model.safetensors"
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    header["tok_embed.weight"]["shape"] = [2**31, 2**31]
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])


def _add_a_token(run: Path) -> None:
    edit_json(run / "tokenizer.json", lambda t: t["attnlab"]["vocab"].append("\u00e9"))


# name -> (spoil the run, what the one line says)
EDITS = {
    "d_model x512": (_scale_width, "tok_embed.weight has shape (34, 128), config.json implies "
                                   "(34, 65536)"),
    "n_layer 4 -> 64": (_set(n_layer=64), "config.json: n_layer = 64 implies 1,028 tensors, "
                                          "but model.safetensors holds 68"),
    "d_model x512 and 64 layers": (_set(d_model=65536, n_layer=64), "n_layer = 64 implies"),
    "n_layer 4 -> 10^6": (_set(n_layer=10**6), "n_layer = 1,000,000 implies 16,000,004 tensors"),
    "vocab changed in config.json": (_set(vocab_size=35), "has shape (34, 128), config.json "
                                                          "implies (35, 128)"),
    "vocab changed in tokenizer.json": (_add_a_token, "the tokenizer's vocab_size is 35, "
                                                      "config.json's vocab_size is 34"),
    "an extra tensor": (_rewrite_weights(lambda t: {**t, "blocks.4.ln1.weight": torch.ones(128)}),
                        "unexpected tensor 'blocks.4.ln1.weight'"),
    "a truncated file": (_truncate, "not a valid safetensors file (truncated"),
    "a header claiming a huge shape": (_claim_huge_shape, "tok_embed.weight' of shape "
                                                          "(2147483648, 2147483648)"),
}  # fmt: skip

VERBS = {
    "generate": ["generate", "run", "--prompt", "All", "--max-new-tokens", "5", "--device", "cpu"],
    "eval": ["eval", "run", "--data", "text.txt", "--device", "cpu"],
    "trace": ["trace", "run", "All:"],
}
# A refused process may grow past one that fails at once (no such run) by the weights' size at
# most, plus this for reading config.json and the tokenizer and building the meta model. Growth
# is the peak of anonymous memory (see forked_cli.watch), not peak RSS, which also counts how
# much of torch's own libraries the page cache lets a process map.
MARGIN_KB = 16 * 1024
FLOORS: dict[str, subprocess.CompletedProcess] = {}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="RssAnon is Linux's")
def test_the_memory_watch_sees_an_allocation_that_was_freed_before_exit():
    """The measure the tests below trust: a child that touches 64 MB and frees it before it
    exits has a peak at least that much above one that does not."""
    peaks = []
    for mb in (0, 64):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            # Fresh pages from the kernel, written so they are resident. Not a bytearray: in a
            # long-lived test worker, malloc serves 64 MB from freed heap the parent already had
            # resident, and a copy-on-write page was already counted in the child's RssAnon, so
            # the peak never moved (CI saw both peaks at 719836 KB).
            # Private, not mmap's default MAP_SHARED: shared anonymous pages count as RssShmem.
            block = None
            if mb:
                block = mmap.mmap(-1, mb << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                for _ in range(mb):
                    block.write(b"\x01" * (1 << 20))  # 1 MB at a time: no 64 MB temporary
            time.sleep(0.3)  # held long enough for a sample on a loaded machine
            if block is not None:
                block.close()
            time.sleep(0.05)
            os._exit(0)
        status, _, peak = watch(pid)
        assert os.waitstatus_to_exitcode(status) == 0
        peaks.append(peak)
    assert peaks[1] - peaks[0] >= 60 * 1024, peaks


@pytest.mark.slow
@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("edit", EDITS)
def test_an_edited_run_is_refused_in_one_line_quickly_and_small(cli, baby, tmp_path, edit, verb):
    spoil, needle = EDITS[edit]
    shutil.copytree(baby / "run", tmp_path / "run")
    shutil.copy(baby / "text.txt", tmp_path / "text.txt")
    weights_kb = (tmp_path / "run" / "model.safetensors").stat().st_size // 1024
    if verb not in FLOORS:  # the same verb on no run at all: what the process costs anyway
        FLOORS[verb] = cli(*[a.replace("run", "missing") for a in VERBS[verb]], cwd=tmp_path)
        assert FLOORS[verb].returncode == 2 and "no such run directory" in FLOORS[verb].stderr
    floor = FLOORS[verb]
    spoil(tmp_path / "run")
    start = time.perf_counter()
    r = cli(*VERBS[verb], cwd=tmp_path)
    seconds = time.perf_counter() - start
    lines = r.stderr.splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("attnlab: error: run/"), r.stderr
    assert needle in lines[0], lines[0]
    grew_kb = r.peak_anon_kb - floor.peak_anon_kb
    assert grew_kb < weights_kb + MARGIN_KB, (grew_kb, weights_kb)
    assert seconds < 30, seconds  # a warm interpreter: import of attnlab, then the checks
    print(
        f"{edit:32} {verb:9} rc 2  {seconds:5.2f} s  peak anon {r.peak_anon_kb / 1024:6.1f} MB "
        f"(+{grew_kb / 1024:.1f} MB over a missing run; weights {weights_kb / 1024:.1f} MB)"
    )


@pytest.mark.slow
def test_the_intact_run_loads_through_the_same_verbs(cli, baby, tmp_path):
    """The control for the test above: the same commands on the unedited copy succeed."""
    shutil.copytree(baby / "run", tmp_path / "run")
    shutil.copy(baby / "text.txt", tmp_path / "text.txt")
    for verb, args in VERBS.items():
        r = cli(*args, cwd=tmp_path)
        assert r.returncode == 0, (verb, r.stderr)


def upward(config: dict, width: int = 4096, layers: int | None = 64) -> dict:
    """A model config edited upward: every width (d_model, an LSTM's d_hidden) times ``width``,
    every layer count set to ``layers`` (None: left as it is)."""
    edited = {k: v * width for k, v in config.items() if k in ("d_model", "d_hidden")}
    if layers is not None:
        edited.update({k: layers for k, v in config.items() if "layer" in k and type(v) is int})
    return {**config, **edited}


def _edit_config(edit):
    return lambda run: edit_json(run / "config.json", lambda c: c.update(config=edit(c["config"])))


def _add_a_layer(config: dict) -> dict:
    field = sorted(k for k in config if "layer" in k)[0]  # seq2seq: n_decoder_layers
    return {**config, field: config[field] + 1}


def _add_a_token_or_class(run: Path) -> None:
    def edit(t: dict) -> None:
        if "model" in t:  # a Hugging Face tokenizers file (the encoder tasks' WordPiece)
            t["model"]["vocab"]["[NEW]"] = len(t["model"]["vocab"])
        elif t["attnlab"]["type"] == "image":
            t["attnlab"]["classes"].append("new")
        else:
            t["attnlab"]["vocab"].append("\u00e9")

    edit_json(run / "tokenizer.json", edit)


# name -> (spoil the run, what the one line says), for every kind of run
KIND_EDITS = {
    "64 layers, width x4096": (_edit_config(upward), "implies"),
    "width x4096": (_edit_config(lambda c: upward(c, layers=None)), "config.json implies"),
    "a layer added": (_edit_config(_add_a_layer), "does not match config.json: missing tensor"),
    "vocab changed": (_add_a_token_or_class, "does not match config.json: the tokenizer's"),
}
# kind -> the verb that reads it (run directory "run", its data in ".."); "imported" is the lm
# run exported to Hugging Face's GPT-2 format and imported back
KIND_VERBS = {
    "lm": ["generate", "run", "--prompt", "All", "--max-new-tokens", "3", "--device", "cpu"],
    "mlm": ["embed", "run", "speak"],
    "classify": ["embed", "run", "good day"],
    "transformer": ["eval", "run"],
    "lstm-attention": ["eval", "run"],
    "vit": ["classify", "run", "test:0"],
    "imported": ["generate", "run", "--prompt", "All", "--max-new-tokens", "3", "--device", "cpu"],
}


@pytest.fixture(scope="module")
def kinds(cli, tmp_path_factory) -> Path:
    """One real run of every kind, trained 2 steps (tiny), and an imported GPT."""
    d = write_task_data(tmp_path_factory.mktemp("kinds"))
    for task_id in TASKS:
        args = train_args(task_id, d, d / task_id, "--max-iters", "2", "--eval-interval", "2")
        r = cli(*args, cwd=d)
        assert r.returncode == 0, r.stderr
    assert cli("export-hf", d / "lm", d / "hf", cwd=d).returncode == 0
    r = cli("import-hf", d / "hf", "--out", d / "imported", cwd=d)
    assert r.returncode == 0, r.stderr
    return d


def resume_args(kind: str, data: Path) -> list[str]:
    spec = TASKS[kind][1]
    return ["train", "--data", spec if ":" in spec or spec == "digits" else str(data / spec),
            "--out", "run", "--resume", "--quiet"]  # fmt: skip


# (kind, edit, by its reader verb or by train --resume): every edit through the reader, two
# through train --resume (which reads the run by the same check_run), none for an imported run
KIND_CASES = [pytest.param(kind, edit, reader, id=f"{kind}-{edit}-{'read' if reader else 'resume'}")
              for kind in KIND_VERBS for edit in KIND_EDITS for reader in (True, False)
              if reader or (kind != "imported" and edit in ("64 layers, width x4096", "vocab changed"))]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("kind, edit, reader", KIND_CASES)
def test_an_edited_run_of_every_kind_is_refused(cli, kinds, tmp_path, kind, edit, reader):
    """GPT, masked LM and classifier encoders, Transformer and LSTM encoder-decoders, ViT and
    an imported GPT-2: sizes edited upward, a layer added or the vocabulary changed is refused
    in one line with exit 2, by the verb that reads the run and by train --resume, within
    seconds and without growing past the size of the weights."""
    spoil, needle = KIND_EDITS[edit]
    shutil.copytree(kinds / kind, tmp_path / "run")
    args = KIND_VERBS[kind] if reader else resume_args(kind, kinds)
    weights_kb = (tmp_path / "run" / "model.safetensors").stat().st_size // 1024
    if args[0] not in FLOORS:  # the same verb on no run at all: what the process costs anyway
        FLOORS[args[0]] = cli(*["missing" if a == "run" else a for a in args], cwd=tmp_path)
        assert FLOORS[args[0]].returncode == 2, FLOORS[args[0]].stderr
    spoil(tmp_path / "run")
    start = time.perf_counter()
    r = cli(*args, cwd=tmp_path)
    seconds = time.perf_counter() - start
    lines = r.stderr.splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("attnlab: error: run/"), r.stderr
    assert needle in lines[0], lines[0]
    grew_kb = r.peak_anon_kb - FLOORS[args[0]].peak_anon_kb
    assert grew_kb < weights_kb + MARGIN_KB, (grew_kb, weights_kb)
    assert seconds < 30, seconds
    print(f"{kind:14} {edit:22} {args[0]:9} rc 2 {seconds:5.2f} s  peak anon "
          f"{r.peak_anon_kb / 1024:6.1f} MB (+{grew_kb / 1024:.1f} MB): {lines[0][16:100]}")  # fmt: skip


@pytest.mark.slow
def test_every_kind_of_intact_run_loads_through_the_same_verbs(cli, kinds, tmp_path):
    """The control for the test above; and readers take no lock: each verb reads its run
    while a writer holds it."""
    for kind, args in KIND_VERBS.items():
        shutil.copytree(kinds / kind, tmp_path / kind / "run")
        fd = flock(tmp_path / kind / "run")
        try:
            r = cli(*args, cwd=tmp_path / kind)
        finally:
            os.close(fd)
        assert r.returncode == 0, (kind, r.stderr)


# ---------------------------------------------------------------------------------------------
# loading costs one copy of the weights
# ---------------------------------------------------------------------------------------------

LOAD_AND_MEASURE = textwrap.dedent("""
    import json, re, sys, torch
    from attnlab.run import load_run
    def status(key):  # kB
        return int(re.search(key + r":\\s+(\\d+)", open("/proc/self/status").read())[1])
    from attnlab.models.gpt import GPT, GPTConfig
    warm = GPT(GPTConfig(vocab_size=16, n_layer=1, n_head=8, d_model=512)).eval()
    with torch.no_grad():  # the one-time costs of a first forward pass, before measuring
        warm(torch.zeros(1, 8, dtype=torch.long))
    del warm
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from the current resident set
    before = status("VmRSS")
    model, tok = load_run(sys.argv[1])
    with torch.no_grad():
        model(torch.zeros(1, 8, dtype=torch.long))  # every weight is read
    print(json.dumps({"before": before * 1024, "peak": status("VmHWM") * 1024}))
""")


@pytest.mark.slow
def test_loading_costs_one_copy_of_the_weights(tmp_path):
    from attnlab.models.gpt import GPT, GPTConfig

    tok = chars(4096)
    model = GPT(GPTConfig(vocab_size=4096, n_layer=4, n_head=8, d_model=512, block_size=64))
    save_model(tmp_path / "run", model, tok)
    del model
    weights = (tmp_path / "run" / "model.safetensors").stat().st_size
    assert weights > 50e6
    r = subprocess.run([sys.executable, "-c", LOAD_AND_MEASURE, str(tmp_path / "run")],
                       env={**ENV, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    grew = m["peak"] - m["before"]
    print(
        f"weights {weights / 1e6:.1f} MB: loading + one forward grew the peak RSS by "
        f"{grew / 1e6:.1f} MB ({grew / weights:.2f}x)"
    )
    # building, then copying the weights in, took 2.0x; 1 MB masks in the finiteness check left
    # 8-22 MB of heap behind (1.23-1.53x). Now 1.13x: the rest is code pages of a first call
    assert grew < 1.3 * weights


# ---------------------------------------------------------------------------------------------
# the writer lock
# ---------------------------------------------------------------------------------------------


def flock(run_dir: Path) -> int | None:
    """Try to take the flock of ``run_dir`` as another writer would (its own descriptor, so
    even in this process it conflicts with FileLock's): the descriptor, or None if held."""
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def snapshot(root: Path) -> dict[str, str]:
    return {str(p): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}  # fmt: skip


def test_a_second_writer_is_refused_naming_the_first(tmp_path):
    run = saved(tmp_path, "gpt tied learned")
    fd = flock(run)  # the first writer: this process, under another descriptor
    try:
        before = snapshot(tmp_path)
        with pytest.raises(RunError) as e, FileLock(run):
            pass
        load_run(run)  # readers take no lock
    finally:
        os.close(fd)
    message = str(e.value)
    assert message.startswith(f"{run}: another process is writing this run directory (pid ")
    assert f"(pid {os.getpid()}: " in message and ", running since 20" in message
    assert snapshot(tmp_path) == before  # the lock is on the directory: nothing is created
    with FileLock(run):  # closing the holder's descriptor released it
        assert flock(run) is None


def test_taking_the_lock_changes_nothing_in_an_existing_run(tmp_path):
    run = saved(tmp_path, "gpt tied learned")
    before = snapshot(tmp_path)
    with FileLock(run):
        assert flock(run) is None  # held from entry
        assert snapshot(tmp_path) == before
    assert snapshot(tmp_path) == before
    os.close(flock(run))  # and free after


def test_a_new_run_is_locked_when_it_is_created(tmp_path):
    """Entering creates nothing; ``RunDir.create`` makes the directory and takes its lock
    before its first file. Writes elsewhere know nothing of the lock (it is no global)."""
    run = tmp_path / "new"
    with RunDir(run) as run_dir:
        assert not run.exists()
        atomic_write_text(tmp_path / "elsewhere.txt", "not the run's")
        run_dir.create()
        assert flock(run) is None
        assert list(run.iterdir()) == []  # its proof of writability removed
        atomic_write_text(run / "a.txt", "first")
        assert flock(run) is None
    os.close(flock(run))


def test_a_refused_create_writes_nothing(tmp_path):
    run = tmp_path / "new"
    run.mkdir()
    with RunDir(run / "sub") as run_dir:
        (run / "sub").mkdir()
        fd = flock(run / "sub")  # another writer got there between our entry and create
        try:
            with pytest.raises(RunError, match="another process is writing"):
                run_dir.create()
        finally:
            os.close(fd)
    assert list((run / "sub").iterdir()) == []


def test_one_lock_object_nests_and_two_conflict(tmp_path):
    """Entering a lock this object holds is a no-op (the outer block keeps it); a second
    object on the same directory, even in this process, is a second writer."""
    lock = FileLock(tmp_path)
    with lock:
        with lock:
            assert lock.held
        assert lock.held and flock(tmp_path) is None
        with pytest.raises(RunError, match="another process is writing"), FileLock(tmp_path):
            pass
    assert not lock.held
    os.close(flock(tmp_path))


@pytest.mark.parametrize("resume", [False, True], ids=["new run", "--resume"])
@pytest.mark.parametrize("task_id", TASKS)
def test_every_task_is_refused_while_another_process_writes_its_run(tmp_path, task_id, resume):
    """training.train, the one way into training, takes the lock before anything of the task:
    a second writer is refused naming the first, and the directory stays as it was."""
    write_task_data(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("the user's")
    before = snapshot(run)
    p = training.plan(given(task_id, tmp_path, run, *(["--resume"] if resume else [])))
    fd = flock(run)
    try:
        with pytest.raises(RunError) as e:
            training.train(p)
    finally:
        os.close(fd)
    assert str(e.value).startswith(
        f"{run}: another process is writing this run directory (pid {os.getpid()}: "
    )
    assert snapshot(run) == before


def test_train_resume_refuses_an_edited_run_before_building_it(tmp_path):
    """Every model type: config.json edited to 64 layers of width x4096 is refused from the
    header by train --resume (which once built what config.json said), and the lock dies
    with the refusal."""
    for variant in ("gpt tied learned", "encoder with every head", "seq2seq", "lstm", "vit"):
        run = saved(tmp_path / variant.replace(" ", "-"), variant)
        edit_json(run / "config.json", lambda c: c.update(config=upward(c["config"])))
        p = training.plan({"out": str(run), "resume": True, "data": "x", "quiet": True})
        with pytest.raises(RunError, match=r"config.json: n_\w+ = 64.* implies"):
            training.train(p)
        os.close(flock(run))


@pytest.mark.slow
@pytest.mark.parametrize("task_id", TASKS)
def test_every_task_trains_holding_the_lock(tmp_path, task_id, monkeypatch):
    """From its first file (the tokenizer) to its last checkpoint, a run of any task is
    written under its lock; train() releases it when it returns."""
    write_task_data(tmp_path)
    run = tmp_path / "run"
    held = []

    def checking(write):
        def checked(*args, **kwargs):
            fd = flock(run)
            held.append(fd is None)
            if fd is not None:
                os.close(fd)
            return write(*args, **kwargs)

        return checked

    for name in ("write_tokenizer", "save_checkpoint", "save_best", "append_metrics"):
        monkeypatch.setattr(RunDir, name, checking(getattr(RunDir, name)))
    more = ("--max-iters", "2", "--eval-interval", "1", "--checkpoint-seconds", "0")
    training.train(training.plan(given(task_id, tmp_path, run, *more)))
    assert len(held) >= 4 and all(held), held
    os.close(flock(run))


def test_import_hf_is_refused_while_another_process_writes_its_run(tmp_path):
    from attnlab.interop.gpt2 import export_gpt2
    from attnlab.interop.hf import import_hf

    export_gpt2(saved(tmp_path, "gpt tied learned"), tmp_path / "hf")
    out = tmp_path / "out"
    out.mkdir()
    fd = flock(out)
    try:
        with pytest.raises(RunError, match="another process is writing this run directory"):
            import_hf(tmp_path / "hf", out)
    finally:
        os.close(fd)
    assert list(out.iterdir()) == []
    import_hf(tmp_path / "hf", out)
    assert load_run(out)[0].config.n_layer == 2


def test_a_tuned_lens_is_not_saved_into_a_run_being_trained(tmp_path):
    """lens --train-tuned writes into the run directory: it takes the lock too, since the
    weights it was fitted on are being replaced."""
    from attnlab.interventions.lens import TunedLens

    run = saved(tmp_path, "gpt tied learned")
    lens = TunedLens({"blocks.0.hook_resid_post": torch.eye(8)}, {"blocks.0.hook_resid_post": torch.zeros(8)}, {})  # fmt: skip
    before = snapshot(run)
    fd = flock(run)
    try:
        with pytest.raises(RunError, match="another process is writing this run directory"):
            lens.save(run)
    finally:
        os.close(fd)
    assert snapshot(run) == before
    assert all(p.is_file() for p in lens.save(run))


KILLED_HOLDER = textwrap.dedent("""
    import os, signal, sys
    from attnlab.files import FileLock
    with FileLock(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.slow
def test_kill_9_frees_the_lock_at_once(tmp_path):
    r = subprocess.run([sys.executable, "-c", KILLED_HOLDER, str(tmp_path)], env=ENV,
                       timeout=120)  # fmt: skip
    assert r.returncode == -signal.SIGKILL
    with FileLock(tmp_path):
        atomic_write_text(tmp_path / "note.txt", "mine")
    assert (tmp_path / "note.txt").read_text() == "mine"


@pytest.mark.slow
def test_two_trains_one_run_then_kill_9_and_resume(tmp_path):
    """The acceptance line: while one `train` writes a run, a second `train` into it exits 2
    within seconds naming the first; after kill -9 of the first, --resume works at once."""
    (tmp_path / "corpus.txt").write_text(TEXT, encoding="utf-8")
    args = ["train", "--data", "corpus.txt", "--out", "run", *TINY_TRAIN, "--eval-interval", "2"]
    first = subprocess.Popen(command("step-delay:0.2", *args, "--max-iters", "1000"),
                             cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.time() + 120
        while not (tmp_path / "run" / "trainer_state.json").exists():  # a checkpoint is written
            assert time.time() < deadline and first.poll() is None
            time.sleep(0.1)
        for extra in (["--resume"], []):
            start = time.perf_counter()
            r = run_cli(*args, "--max-iters", "1000", *extra, cwd=tmp_path, timeout=120)
            seconds = time.perf_counter() - start
            lines = r.stderr.splitlines()
            assert r.returncode == 2 and len(lines) == 1, r.stderr
            assert "another process is writing this run directory" in lines[0]
            # (the first train runs through the tests' fault_cli.py, not `python -m attnlab`)
            assert f"pid {first.pid}: " in lines[0]
            assert "train --data corpus.txt --out run" in lines[0]
            assert seconds < 30
            print(
                f"second train {' '.join(extra) or '(no --resume)'}: exit 2 in {seconds:.1f} s:"
                f" {lines[0]}"
            )
        r = run_cli("generate", "run", "--max-new-tokens", "3", cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr  # a reader, while the writer writes
        assert first.poll() is None
        first.send_signal(signal.SIGKILL)
        first.wait()
        start = time.perf_counter()
        step = json.loads((tmp_path / "run" / "trainer_state.json").read_text())["step"]
        r = run_cli(*args, "--max-iters", str(step + 4), "--resume", cwd=tmp_path, timeout=300)
        assert r.returncode == 0, r.stderr
        resumed = int(re.search(r"resumed from the checkpoint of step (\d+)", r.stderr)[1])
        assert step <= resumed <= step + 2  # the last checkpoint, or one committed as it died
        assert max(train_losses(tmp_path / "run")) == step + 4
        print(f"--resume after kill -9: exit 0 in {time.perf_counter() - start:.1f} s")
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mapped"])
def test_a_file_replaced_after_its_header_was_checked_is_not_read(tmp_path, mmap):
    """A writer may replace model.safetensors between a reader's check and its read (a new
    checkpoint whose header is longer): the read notices instead of slicing the new
    file at the old offsets, and load_run checks again."""
    path = tmp_path / "w.safetensors"
    save_file({"a": torch.ones(3), "b": torch.zeros(5)}, str(path), metadata={"step": "9"})
    old = read_header(path)
    save_file({"a": torch.ones(3), "b": torch.zeros(5)}, str(path), metadata={"step": "1" * 20})
    assert read_header(path).data_start != old.data_start
    with pytest.raises(rundir.FileChangedError, match="replaced while it was being read"):
        load_tensors(path, mmap=mmap, header=old)
    assert torch.equal(load_tensors(path, mmap=mmap)["a"], torch.ones(3))
