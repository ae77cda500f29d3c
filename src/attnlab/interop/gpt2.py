"""GPT-2 in and out: a Hugging Face GPT-2 directory read as an attnlab GPT, and a GPT run
(learned positions, pre-norm) written as ``GPT2LMHeadModel``.

GPT-2 stores its linear layers as ``Conv1D`` modules whose weight is (in, out), the transpose of
``nn.Linear``'s (out, in); its query, key and value projections are one (C, 3C) matrix ``c_attn``.
The key map names both: ``conv1d`` (transpose) and ``conv1d_q/k/v`` (third of c_attn, transposed).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from attnlab.blocks import layout_words
from attnlab.config import ConfigError
from attnlab.interop.hf import Family, activation, export_hf, register
from attnlab.interop.hf_files import KeyMap, apply_key_map, read_hf_config, read_hf_weights
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.rundir import RunError
from attnlab.tokenizers import Tokenizer

GPT2_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}  # ours -> HF


def _strip_prefix(tensors: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k.removeprefix(prefix): v for k, v in tensors.items()}


def _get(cfg: dict, *names, default=None):
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def gpt2_config(hf: dict) -> GPTConfig:
    """attnlab GPTConfig for a Hugging Face GPT-2 config.json."""
    for key, ok in (
        ("scale_attn_by_inverse_layer_idx", False),
        ("add_cross_attention", False),
        ("scale_attn_weights", True),
    ):
        if hf.get(key, ok) != ok:
            raise RunError(f"config.json: GPT-2 with {key}={hf[key]} is not supported")
    try:
        return GPTConfig(
            vocab_size=hf["vocab_size"],
            block_size=_get(hf, "n_positions", "n_ctx", default=1024),
            n_layer=hf["n_layer"],
            n_head=hf["n_head"],
            d_model=hf["n_embd"],
            d_ff=hf.get("n_inner"),
            dropout=float(hf.get("resid_pdrop", 0.1)),
            bias=True,
            pos="learned",
            norm_first=True,
            activation=activation(hf, "activation_function"),
            ln_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
            tie_weights=bool(hf.get("tie_word_embeddings", True)),
        )
    except KeyError as e:
        raise RunError(f"config.json: GPT-2 config has no {e.args[0]!r}") from None
    except ConfigError as e:
        raise RunError(f"config.json: {e}") from None


def gpt2_key_map(config: GPTConfig) -> KeyMap:
    """(attnlab name, HF GPT-2 name without 'transformer.', how) for every attnlab tensor."""
    rows: KeyMap = [
        ("tok_embed.weight", "wte.weight", "copy"),
        ("pos_embed.weight", "wpe.weight", "copy"),
    ]
    for i in range(config.n_layer):
        ours, theirs = f"blocks.{i}.", f"h.{i}."
        for ln_ours, ln_theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
            for p in ("weight", "bias"):
                rows.append((f"{ours}{ln_ours}.{p}", f"{theirs}{ln_theirs}.{p}", "copy"))
        for j in "qkv":
            rows.append(
                (f"{ours}attn.{j}_proj.weight", f"{theirs}attn.c_attn.weight", f"conv1d_{j}")
            )
            rows.append((f"{ours}attn.{j}_proj.bias", f"{theirs}attn.c_attn.bias", f"qkv_bias_{j}"))
        for lin_ours, lin_theirs in (
            ("attn.out_proj", "attn.c_proj"),
            ("mlp.fc1", "mlp.c_fc"),
            ("mlp.fc2", "mlp.c_proj"),
        ):
            rows.append((f"{ours}{lin_ours}.weight", f"{theirs}{lin_theirs}.weight", "conv1d"))
            rows.append((f"{ours}{lin_ours}.bias", f"{theirs}{lin_theirs}.bias", "copy"))
    rows += [("ln_f.weight", "ln_f.weight", "copy"), ("ln_f.bias", "ln_f.bias", "copy")]
    if not config.tie_weights:
        rows.append(("lm_head.weight", "lm_head.weight", "copy"))
    return rows


def _gpt2_skippable(tensors: dict[str, Tensor], config: GPTConfig) -> set[str]:
    """Buffers older GPT-2 files carry (the causal mask) and the tied LM head copy."""
    skip = {
        k
        for k in tensors
        if k.endswith((".attn.bias", ".attn.masked_bias")) and tensors[k].dim() != 1
    }
    if config.tie_weights and "lm_head.weight" in tensors:
        if not torch.equal(tensors["lm_head.weight"], tensors["wte.weight"]):
            raise RunError(
                "lm_head.weight differs from wte.weight but config.json says they are tied"
            )
        skip.add("lm_head.weight")
    return skip


def load_gpt2(hf_dir: str | Path, hf: dict | None = None) -> GPT:
    hf = hf or read_hf_config(hf_dir)
    config = gpt2_config(hf)
    tensors = _strip_prefix(read_hf_weights(hf_dir), "transformer.")
    model = GPT(config)
    apply_key_map(
        model, tensors, gpt2_key_map(config), _gpt2_skippable(tensors, config), str(hf_dir)
    )
    return model.eval()


def gpt2_state_dict(model: GPT) -> dict[str, Tensor]:
    """The inverse key map: attnlab GPT tensors -> GPT2LMHeadModel names, Conv1D layout."""
    sd = model.state_dict()
    out: dict[str, Tensor] = {}
    for o, h, how in gpt2_key_map(model.config):
        t = sd[o]
        if how == "copy":
            out[h] = t
        elif how == "conv1d":
            out[h] = t.t()
        elif how in ("conv1d_q", "qkv_bias_q"):  # q, k, v are rejoined once, at q's row
            parts = [sd[o.replace("q_proj", f"{j}_proj")] for j in "qkv"]
            out[h] = (
                torch.cat([p.t() for p in parts], dim=1) if how == "conv1d_q" else torch.cat(parts)
            )
    return {
        ("" if k == "lm_head.weight" else "transformer.") + k: v.contiguous()
        for k, v in out.items()
    }


def gpt2_hf_config(config: GPTConfig, tokenizer: Tokenizer | None) -> dict:
    """A GPT-2 config.json for an attnlab GPTConfig (or a RunError if GPT-2 cannot express it)."""
    problems = []
    defaults = GPTConfig(vocab_size=config.vocab_size)
    for name in ("norm", "ffn", "n_kv_heads", "head_dim", "qk_norm", "qkv_bias", "out_bias",
                 "attn_scale", "attn_softcap", "final_softcap", "sliding_window",
                 "embed_scale"):  # fmt: skip
        if getattr(config, name) != getattr(defaults, name):
            problems.append(f"{name}={getattr(config, name)!r} (GPT-2 has no such piece)")
    if config.pos != "learned":
        problems.append(f"pos={config.pos!r} (GPT-2 has learned positions)")
    steps = config.residual_steps()  # the blocks' declaration: pre-norm attention, then MLP
    if config.block_layout != "pre":
        problems.append(f"{layout_words(config.block_layout)} blocks (GPT-2 is pre-norm)")
    if not config.bias:
        problems.append("bias=False (GPT-2 has biases)")
    if [s.sublayer for s in steps] != ["attn", "mlp"]:
        problems.append("attention-only blocks (every GPT-2 block has an MLP)")
    if config.activation not in GPT2_ACTIVATIONS:
        problems.append(f"activation={config.activation!r}")
    if problems:
        raise RunError("cannot export as GPT-2: " + "; ".join(problems))
    eos = tokenizer.special_tokens.get("<|endoftext|>") if tokenizer is not None else None
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_embd": config.d_model,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": config.d_ff,
        "activation_function": GPT2_ACTIVATIONS[config.activation],
        "layer_norm_epsilon": config.ln_eps,
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "tie_word_embeddings": config.tie_weights,
        "scale_attn_weights": True,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "dtype": "float32",
    }


def export_gpt2(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Write an attnlab GPT run as a directory ``GPT2LMHeadModel.from_pretrained`` loads (see
    ``export_hf``, which also writes encoder runs)."""
    return export_hf(run_dir, out_dir, only="gpt")


FAMILY = register(Family(
    "gpt2", 10, "GPT-2", ("gpt2",), load_gpt2, exports=("gpt",),
    export=lambda run: (gpt2_hf_config(run.model.config, run.tokenizer),
                        gpt2_state_dict(run.model), run.model.config.block_size),
))  # fmt: skip
