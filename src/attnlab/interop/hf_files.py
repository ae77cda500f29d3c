"""Reading a Hugging Face model directory, and filling a model through a key map.

A directory holds config.json and model.safetensors (or shards listed in
model.safetensors.index.json). Only safetensors are read: a directory offering only pickles
(pytorch_model.bin, *.pt) is refused, never unpickled. Weights move through an explicit key
map, one row per attnlab tensor: (our name, HF name, how). Every HF tensor must be used exactly
once (known buffers and tied copies are named and skipped), every attnlab tensor filled exactly
once, and every shape must agree; anything else is a RunError. Each family's key map lives
in its own module (``hf`` for GPT-2 and BERT, ``decoders`` for Llama, Qwen, Gemma, NeoX).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from attnlab.files import RunError
from attnlab.rundir import assign_weights, read_json_object
from attnlab.safetensors_io import PICKLE_SUFFIXES, load_tensors

KeyMap = list[tuple[str, str, str]]  # (attnlab name, HF name, how)


# ---------------------------------------------------------------------------------------------
# Reading a Hugging Face directory
# ---------------------------------------------------------------------------------------------


def read_hf_config(hf_dir: str | Path) -> dict:
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise RunError(f"{hf_dir}: not a directory (expected a Hugging Face model directory)")
    path = hf_dir / "config.json"
    if not path.is_file():
        raise RunError(f"{hf_dir}: no config.json, so this is not a Hugging Face model directory")
    cfg = read_json_object(path)
    return cfg


def weight_files(hf_dir: str | Path) -> list[Path]:
    """The safetensors files of a directory; pickles alone are refused."""
    hf_dir = Path(hf_dir)
    single = hf_dir / "model.safetensors"
    index = hf_dir / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            shards = sorted(
                set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
            )
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise RunError(f"{index}: not a valid safetensors index ({e})") from None
        return [hf_dir / s for s in shards]
    pickles = sorted(p.name for p in hf_dir.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        raise RunError(
            f"{hf_dir}: only pickle weights ({pickles[0]}); attnlab never unpickles. "
            "Convert them to model.safetensors first"
        )
    raise RunError(f"{hf_dir}: no model.safetensors")


def read_hf_weights(hf_dir: str | Path, mmap: bool = False) -> dict[str, Tensor]:
    """Every tensor of the directory's safetensors files (``mmap``: memory-mapped, read when
    used); a name in two shards is refused."""
    tensors: dict[str, Tensor] = {}
    for f in weight_files(hf_dir):
        part = load_tensors(f, mmap=mmap)
        twice = sorted(set(part) & set(tensors))
        if twice:
            raise RunError(f"{f}: tensor {twice[0]!r} is also in another shard")
        tensors.update(part)
    return tensors


# ---------------------------------------------------------------------------------------------
# Applying a key map
# ---------------------------------------------------------------------------------------------


def convert(how: str, t: Tensor) -> Tensor:
    """One HF tensor -> one attnlab tensor (``how`` a name below, or a function of it)."""
    if callable(how):
        return how(t)
    if how == "copy":
        return t
    if how == "conv1d":  # Conv1D (in, out) -> Linear (out, in)
        return t.t()
    if how == "conv2d_flatten":  # a patch Conv2d (d, C, P, P) -> the Linear (d, C*P*P) (ViT)
        return t.reshape(t.size(0), -1)
    if how.startswith("conv1d_"):  # c_attn (C, 3C): q | k | v side by side, then transpose
        return t.chunk(3, dim=-1)["qkv".index(how[-1])].t()
    if how.startswith("qkv_bias_"):  # c_attn bias (3C,): q | k | v
        return t.chunk(3)["qkv".index(how[-1])]
    raise ValueError(f"unknown conversion {how!r}")


def apply_key_map(
    model: torch.nn.Module, tensors: dict[str, Tensor], key_map: KeyMap, skip: set[str], source: str
) -> None:
    """Fill ``model`` from ``tensors`` through ``key_map``, asserting counts and shapes. A
    model built on the meta device is given the tensors themselves (``assign_weights``), in
    the model's dtype: a tensor of that dtype stays memory-mapped, another is converted (a
    float16 file into a float32 model; a bfloat16 one stays bfloat16 where the loader built
    the model in it, as ``decoders.load_decoder`` does)."""
    ours = {k: v for k, v in model.state_dict().items() if k not in _tied_names(model)}
    mapped = {o for o, _, _ in key_map}
    if mapped != set(ours):
        missing = sorted(set(ours) - mapped) or sorted(mapped - set(ours))
        raise RunError(f"{source}: key map and model disagree on {missing[0]!r}")
    used = {h for _, h, _ in key_map}
    absent = sorted(used - set(tensors))
    if absent:
        raise RunError(
            f"{source}: missing tensor {absent[0]!r}"
            + (f" and {len(absent) - 1} more" if len(absent) > 1 else "")
        )
    unused = sorted(set(tensors) - used - skip)
    if unused:
        raise RunError(
            f"{source}: unexpected tensor {unused[0]!r} (a model variant attnlab does not build)"
        )
    new = {}
    for o, h, how in key_map:
        t = convert(how, tensors[h])
        if tuple(t.shape) != tuple(ours[o].shape):
            raise RunError(
                f"{source}: {h} gives {o} the shape {tuple(t.shape)}, "
                f"config.json implies {tuple(ours[o].shape)}"
            )
        new[o] = t.to(ours[o].dtype).contiguous()
    assert len(new) == len(ours) == len(key_map), "every attnlab tensor is filled exactly once"
    if any(p.is_meta for p in model.parameters()):
        assign_weights(model, new)
    else:
        model.load_state_dict(new, strict=False)  # tied copies follow their source


def _tied_names(model) -> tuple[str, ...]:
    return model.tied_now
