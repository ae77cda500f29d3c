"""Hugging Face T5 in: ``T5ForConditionalGeneration`` (T5, and v1.1 / flan with gated GELU).

config.json -> ``T5Config``; the weights through an explicit key map. Hugging Face's names:
``shared`` (the embedding), ``{encoder,decoder}.block.{i}.layer.{j}`` where layer 0 is
self-attention (q, k, v, o, and in block 0 the ``relative_attention_bias``), layer 1 the
decoder's cross-attention (``EncDecAttention``), and the last layer the feed-forward
(``DenseReluDense``: wi, wo; gated: wi_0 the gate, wi_1 the up projection, wo), each with its
``layer_norm``; then ``final_layer_norm``.

Tied or not: the original T5 ties the LM head to ``shared`` and scales the decoder output by
d_model^-0.5; v1.1 and flan have a separate ``lm_head.weight`` and no scale. Older configs say
so with ``tie_word_embeddings: false``; transformers 5 writes ``scale_decoder_outputs`` instead
and always ties. A file's ``lm_head.weight`` that differs from ``shared.weight`` is the untied
head, whatever the config says.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from attnlab.config import ConfigError
from attnlab.interop.hf import (
    Family,
    KeyMap,
    apply_key_map,
    load_hf_tokenizer,
    read_hf_config,
    read_hf_weights,
    register,
)
from attnlab.models.t5 import T5, T5Config
from attnlab.rundir import RunError
from attnlab.tokenizers import HFTokenizer, SharedPairTokenizer

# Hugging Face dense_act_fn -> attnlab activation (the gated-gelu of v1.1 is gelu_new)
T5_ACTIVATIONS = {"relu": "relu", "gelu_new": "gelu_new", "gelu": "gelu", "silu": "silu"}


def t5_config(hf: dict, tensors: dict[str, Tensor]) -> T5Config:
    """attnlab T5Config for a Hugging Face T5 config.json (and the tensors it came with)."""
    proj = str(hf.get("feed_forward_proj", "relu"))
    gated, _, act = proj.rpartition("-")
    if gated not in ("", "gated"):
        raise RunError(f"config.json: feed_forward_proj {proj!r} is not supported")
    act = "gelu_new" if proj == "gated-gelu" else act
    if act not in T5_ACTIVATIONS:
        raise RunError(f"config.json: feed_forward_proj {proj!r}: activation {act!r} is not "
                       f"supported; "
                       f"supported: {', '.join(T5_ACTIVATIONS)}")  # fmt: skip
    if hf.get("is_decoder") or hf.get("is_encoder_decoder", True) is False:
        raise RunError("config.json: a T5 stack alone (is_decoder / no encoder) is not supported")
    untied = (
        "lm_head.weight" in tensors
        and "shared.weight" in tensors
        and not torch.equal(tensors["lm_head.weight"], tensors["shared.weight"])
    )
    scale = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True) is not False)
    try:
        n_layers = hf["num_layers"]
        return T5Config(
            vocab_size=hf["vocab_size"],
            d_model=hf["d_model"],
            d_kv=hf["d_kv"],
            d_ff=hf["d_ff"],
            n_encoder_layers=n_layers,
            n_decoder_layers=hf.get("num_decoder_layers") or n_layers,
            n_head=hf["num_heads"],
            num_buckets=hf.get("relative_attention_num_buckets", 32),
            max_distance=hf.get("relative_attention_max_distance", 128),
            max_len=hf.get("n_positions") or 512,
            dropout=float(hf.get("dropout_rate", 0.1)),
            ln_eps=float(hf.get("layer_norm_epsilon", 1e-6)),
            ffn="gated" if gated else "mlp",
            activation=T5_ACTIVATIONS[act],
            tie_weights=not untied,
            scale_output=bool(scale),
            pad_id=hf.get("pad_token_id", 0) if hf.get("pad_token_id") is not None else 0,
            eos_id=_first(hf.get("eos_token_id", 1), 1),
            decoder_start_id=_first(hf.get("decoder_start_token_id", 0), 0),
        )
    except KeyError as e:
        raise RunError(f"config.json: T5 config has no {e.args[0]!r}") from None
    except (ConfigError, TypeError) as e:
        raise RunError(f"config.json: {e}") from None


def _first(v, default: int) -> int:
    if isinstance(v, list):
        v = v[0] if v else None
    return default if v is None else int(v)


def t5_key_map(c: T5Config) -> KeyMap:
    """(attnlab name, HF T5ForConditionalGeneration name, how) for every attnlab tensor."""
    rows: KeyMap = [("shared.weight", "shared.weight", "copy")]
    ffn = (("mlp.gate", "wi_0"), ("mlp.up", "wi_1"), ("mlp.down", "wo")) if c.ffn == "gated" else (
        ("mlp.fc1", "wi"), ("mlp.fc2", "wo"))  # fmt: skip
    for stack, n in (("encoder", c.n_encoder_layers), ("decoder", c.n_decoder_layers)):
        bias = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        rows.append((f"{stack}.pos_bias.embedding.weight", bias, "copy"))  # (buckets, H)
        for i in range(n):
            ours, theirs = f"{stack}.blocks.{i}.", f"{stack}.block.{i}.layer."
            sub = [("attn", "ln1", "0.SelfAttention")]
            if stack == "decoder":
                sub.append(("cross", "ln_cross", "1.EncDecAttention"))
            for attn, ln, hf_attn in sub:
                for p, q in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "o")):
                    rows.append(
                        (f"{ours}{attn}.{p}.weight", f"{theirs}{hf_attn}.{q}.weight", "copy")
                    )
                rows.append((f"{ours}{ln}.weight", f"{theirs}{hf_attn.split('.')[0]}.layer_norm.weight",
                             "copy"))  # fmt: skip
            j = len(sub)  # the feed-forward is the last layer of the block
            for p, q in ffn:
                rows.append((f"{ours}{p}.weight", f"{theirs}{j}.DenseReluDense.{q}.weight", "copy"))
            rows.append((f"{ours}ln2.weight", f"{theirs}{j}.layer_norm.weight", "copy"))
        rows.append((f"{stack}.ln_f.weight", f"{stack}.final_layer_norm.weight", "copy"))
    if not c.tie_weights:
        rows.append(("decoder.lm_head.weight", "lm_head.weight", "copy"))
    return rows


def _t5_skippable(tensors: dict[str, Tensor], c: T5Config) -> set[str]:
    """The stacks' copies of the shared embedding, and a tied LM head (checked equal)."""
    skip = set()
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight") + (
        ("lm_head.weight",) if c.tie_weights else ()
    ):
        if name in tensors:
            if not torch.equal(tensors[name], tensors["shared.weight"]):
                raise RunError(f"{name} differs from shared.weight, which T5 shares")
            skip.add(name)
    return skip


def load_t5(hf_dir: str | Path, hf: dict | None = None) -> T5:
    hf = hf or read_hf_config(hf_dir)
    tensors = read_hf_weights(hf_dir)
    if "shared.weight" not in tensors:
        for alt in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
            if alt in tensors:
                tensors["shared.weight"] = tensors[alt]
                break
    config = t5_config(hf, tensors)
    model = T5(config)
    apply_key_map(model, tensors, t5_key_map(config), _t5_skippable(tensors, config), str(hf_dir))
    return model.eval()


def read_t5_tokenizer(hf_dir: str | Path, hf: dict, model: T5):
    """T5's tokenizer.json (SentencePiece-derived: Unigram, or BPE with byte fallback), with
    the model's <pad>, decoder start and end ids: a ``SharedPairTokenizer``."""
    tok, source = load_hf_tokenizer(hf_dir, hf)
    if not isinstance(tok, HFTokenizer):
        raise RunError(f"{hf_dir}: T5 needs a Hugging Face tokenizer.json")
    c = model.config
    return SharedPairTokenizer(tok, c.pad_id, c.decoder_start_id, c.eos_id), source


FAMILY = register(Family("t5", 40, "T5", ("t5",), load_t5, needs="tokenizer.json",
                         read_tokenizer=read_t5_tokenizer))  # fmt: skip
