"""Tiny runs of every kind for the workbench's tests, a workbench in a thread, and HTTP calls
to it over a real socket (urllib: what a browser's fetch sends, token and all)."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from attnlab.models.declare import registered
from conformance_helpers import build_run

# name -> (registered kind, its example config, the input typed)
KINDS = {
    "gpt": ("gpt", 0, "the bank of the river"),
    "encoder": ("encoder", 0, "the [MASK] of the river"),
    "seq2seq": ("seq2seq", 0, "bad cafe"),
    "lstm": ("rnn", 0, "bad cafe"),
    "vit": ("vit", 0, "test:0"),
}


def build_kind(name: str, root: Path) -> Path:
    """A random run of the kind ``name`` (KINDS) under ``root``."""
    kind, example, _ = KINDS[name]
    cls = registered()[kind]
    return build_run(cls, dict(cls.examples[example]), root / name)


def build_llama(root: Path) -> Path:
    """An imported Llama: transformers builds it from a config (random weights, fixed seed),
    saves it, and ``attnlab import-hf`` imports it (no download)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from attnlab.cli import main

    text = "the cat sat on the mat. the dog ate the cake; a cat and a dog. " * 4
    hf = root / "llama-hf"
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                   initializer_range=0.2, attn_implementation="eager")  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(hf)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=290, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))  # fmt: skip
    tok.save(str(hf / "tokenizer.json"))
    out = root / "llama"
    assert main(["import-hf", str(hf), "--out", str(out)]) == 0
    return out


def call(url: str, path: str, body=None, token: str | None = None, headers: dict | None = None,
         method: str | None = None, raw: bytes | None = None) -> tuple[int, dict]:  # fmt: skip
    """(status, JSON) of one request to the workbench at ``url`` (its base, no path)."""
    h = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        h["X-Attnlab-Token"] = token
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url + path, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def base(server) -> str:
    return f"http://127.0.0.1:{server.settings.port}"


def skip_without_chromium() -> None:
    """Skip the calling test module where no Chromium is installed."""
    if not (Path("/usr/bin/chromium").exists() or shutil.which("chromium")):
        pytest.skip("no chromium (make setup installs it: apt-get install chromium)",
                    allow_module_level=True)  # fmt: skip


def wait(b, cond, timeout: float = 120.0) -> None:
    """Poll ``cond()`` until it holds; past ``timeout`` seconds fail with the page's errors."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out; page errors: {b.errors()}")
