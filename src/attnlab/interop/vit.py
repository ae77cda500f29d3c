"""Hugging Face ViT in: ``ViTModel`` (with its pooler) and ``ViTForImageClassification``.

config.json -> ``ViTConfig``; the weights through an explicit key map; preprocessor_config.json
-> the run's ``ImageTokenizer`` with a ``Preprocess`` (resize, rescale, normalise), so a look
verb given an image file sees the pixels transformers' image processor would give the model.

Hugging Face's names: ``embeddings.cls_token`` (1, 1, C), ``embeddings.position_embeddings``
(1, N + 1, C) ([CLS] first), ``embeddings.patch_embeddings.projection`` (a Conv2d with kernel
and stride P), then per layer ``layernorm_before``, ``attention.attention.{query,key,value}``,
``attention.output.dense``, ``layernorm_after``, ``intermediate.dense``, ``output.dense``, and
the final ``layernorm``, ``pooler.dense`` (ViTModel) or ``classifier`` (ViTForImageClassification,
whose other names start ``vit.``).

The patch embedding: a Conv2d(C, d, kernel P, stride P) weight (d, C, P, P), flattened to
(d, C * P * P), is attnlab's ``PatchEmbedding`` Linear: both take each patch's pixels in the
order channel, row, column (``patchify``); the key map names the reshape ``conv2d_flatten``.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from attnlab.config import ConfigError
from attnlab.data.images import ImageTokenizer, Preprocess
from attnlab.interop.hf import (
    HF_ACTIVATIONS,
    Family,
    KeyMap,
    apply_key_map,
    read_hf_config,
    read_hf_weights,
    read_json_object,
    register,
)
from attnlab.models.vit import ViT, ViTConfig
from attnlab.rundir import RunError

PATCH = "embeddings.patch_embeddings.projection.weight"


def _square(v, name: str) -> int:
    if isinstance(v, (list, tuple)):
        if len(v) != 2 or v[0] != v[1]:
            raise RunError(f"config.json: {name} {v} is not square; attnlab's ViT reads squares")
        v = v[0]
    return int(v)


def vit_config(hf: dict, tensors: dict[str, Tensor]) -> ViTConfig:
    """attnlab ViTConfig for a Hugging Face ViT config.json (the heads follow the tensors)."""
    for key, ok in (("qkv_bias", True), ("use_mask_token", False), ("pooler_act", "tanh")):
        if hf.get(key, ok) != ok:
            raise RunError(f"config.json: ViT with {key}={hf[key]!r} is not supported")
    if hf.get("pooler_output_size") not in (None, hf.get("hidden_size")):
        raise RunError(
            "config.json: a ViT pooler wider or narrower than the model is not supported"
        )
    act = hf.get("hidden_act", "gelu")
    if act not in HF_ACTIVATIONS:
        raise RunError(f"config.json: activation {act!r} is not supported")
    n_classes = tensors["classifier.weight"].shape[0] if "classifier.weight" in tensors else 0
    try:
        return ViTConfig(
            image_size=_square(hf.get("image_size", 224), "image_size"),
            patch_size=_square(hf.get("patch_size", 16), "patch_size"),
            channels=hf.get("num_channels", 3),
            n_classes=n_classes,
            n_layer=hf["num_hidden_layers"],
            n_head=hf["num_attention_heads"],
            d_model=hf["hidden_size"],
            d_ff=hf.get("intermediate_size"),
            dropout=float(hf.get("hidden_dropout_prob", 0.0)),
            bias=True,
            norm_first=True,
            activation=HF_ACTIVATIONS[act],
            ln_eps=float(hf.get("layer_norm_eps", 1e-12)),
            pooler="pooler.dense.weight" in tensors,
        )
    except KeyError as e:
        raise RunError(f"config.json: ViT config has no {e.args[0]!r}") from None
    except ConfigError as e:
        raise RunError(f"config.json: {e}") from None


def vit_key_map(c: ViTConfig) -> KeyMap:
    """(attnlab name, HF ViT name without 'vit.', how) for every attnlab tensor."""
    rows: KeyMap = [
        ("cls_token", "embeddings.cls_token", "copy"),
        ("pos_embed", "embeddings.position_embeddings", "copy"),
        ("patch_embed.proj.weight", PATCH, "conv2d_flatten"),
        ("patch_embed.proj.bias", "embeddings.patch_embeddings.projection.bias", "copy"),
    ]
    pairs = (("ln1", "layernorm_before"), ("attn.q_proj", "attention.attention.query"),
             ("attn.k_proj", "attention.attention.key"), ("attn.v_proj", "attention.attention.value"),
             ("attn.out_proj", "attention.output.dense"), ("ln2", "layernorm_after"),
             ("mlp.fc1", "intermediate.dense"), ("mlp.fc2", "output.dense"))  # fmt: skip
    for i in range(c.n_layer):
        for ours, theirs in pairs:
            for p in ("weight", "bias"):
                rows.append((f"blocks.{i}.{ours}.{p}", f"encoder.layer.{i}.{theirs}.{p}", "copy"))
    last = [("ln_f", "layernorm")]
    last += [("pooler", "pooler.dense")] if c.pooler else []
    last += [("head", "classifier")] if c.n_classes else []
    for ours, theirs in last:
        rows += [(f"{ours}.{p}", f"{theirs}.{p}", "copy") for p in ("weight", "bias")]
    return rows


def load_vit(hf_dir: str | Path, hf: dict | None = None) -> ViT:
    hf = hf or read_hf_config(hf_dir)
    tensors = {k.removeprefix("vit."): v for k, v in read_hf_weights(hf_dir).items()}
    config = vit_config(hf, tensors)
    model = ViT(config)
    apply_key_map(model, tensors, vit_key_map(config), set(), str(hf_dir))
    return model.eval()


def read_preprocessor(hf_dir: str | Path, hf: dict, model: ViT) -> tuple[ImageTokenizer, str]:
    """The run's image reader from preprocessor_config.json, and that file's name."""
    name = "preprocessor_config.json"
    pre = read_json_object(Path(hf_dir) / name)  # one line naming the file if it is not JSON
    c = model.config
    if pre.get("do_center_crop"):
        raise RunError(f"{name}: do_center_crop is not supported")
    size = None
    if pre.get("do_resize", True):
        s = pre.get("size", {"height": 224, "width": 224})
        s = {"height": s, "width": s} if isinstance(s, int) else s
        if not isinstance(s, dict) or "height" not in s or "width" not in s:
            raise RunError(f"{name}: size {s!r} is not supported (height and width only)")
        size = (int(s["height"]), int(s["width"]))
        if size != (c.image_size, c.image_size):
            raise RunError(f"{name}: resizes to {size}, but the model reads "
                           f"{c.image_size}x{c.image_size} images")  # fmt: skip
    normalise = pre.get("do_normalize", True)
    mean = tuple(pre.get("image_mean", (0.5,) * c.channels)) if normalise else None
    std = tuple(pre.get("image_std", (0.5,) * c.channels)) if normalise else None
    if normalise and (len(mean) != c.channels or len(std) != c.channels):
        raise RunError(f"{name}: image_mean and image_std need {c.channels} values")
    preprocess = Preprocess(
        size=size,
        resample=int(pre.get("resample", 2)),
        rescale=float(pre.get("rescale_factor", 1 / 255)) if pre.get("do_rescale", True) else None,
        mean=mean,
        std=std,
    )
    labels = hf.get("id2label") or {}
    classes = [str(labels.get(str(i), labels.get(i, f"LABEL_{i}"))) for i in range(c.n_classes)]
    tok = ImageTokenizer("", classes, c.image_size, c.channels, seed=0, val_fraction=0.0,
                         preprocess=preprocess)  # fmt: skip
    return tok, name


FAMILY = register(Family("vit", 50, "ViT", ("vit",), load_vit, needs="preprocessor_config.json",
                         read_tokenizer=read_preprocessor))  # fmt: skip
