"""Today's decoder families in: Llama, Mistral, Qwen2, Qwen3, Gemma 1-3 and GPT-NeoX (Pythia).

Each is an attnlab GPT built with the pieces its config.json names (``GPTConfig``'s norm, ffn,
n_kv_heads, rotary, ... fields), filled through an explicit key map as GPT-2's is (``hf.py``):
one row per attnlab tensor, every Hugging Face tensor used once, every shape checked.

    family          norm        feed-forward        attention                  extras
    llama, mistral  rms         SwiGLU              GQA, rotate-half rotary    llama3 rope scaling;
                                                                               Mistral's window
    qwen2, qwen3    rms         SwiGLU              GQA; Qwen2 q/k/v biases,   windows from
                                                    Qwen3 QK-norm              max_window_layers
    gemma           rms (1 + w) GeGLU (tanh GELU)   GQA, head_dim              embeddings x sqrt(C)
    gemma2          rms (1 + w) GeGLU               query_pre_attn_scalar,     four norms a block,
                                                    softcap, alternate windows final-logit softcap
    gemma3_text     rms (1 + w) GeGLU               QK-norm, windows by        a local rope base
                                                    layer_types
    gpt_neox        layer       GELU MLP            partial rotary, one fused  parallel residual
                                                    qkv interleaved per head

The rotary settings are read in both spellings: transformers 5's ``rope_parameters`` (Gemma 3:
one per layer type) and the older ``rope_theta`` / ``rope_scaling`` / ``rotary_pct`` /
``rope_local_base_freq`` that checkpoints on disk carry. Anything attnlab does not build (a
rope scaling type it lacks, mixture-of-experts, bidirectional Gemma) is refused in one line
naming it. bfloat16 weights are kept and computed in bfloat16 (as transformers does by default),
so a run is the size of its file; float32, float16 and mixed files are computed in float32.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from attnlab.blocks import layout_words
from attnlab.config import ConfigError
from attnlab.interop.hf import Family, register
from attnlab.interop.hf_files import KeyMap, apply_key_map, read_hf_config, read_hf_weights
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.rundir import RunError, build_model, weights_dtype

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
GEMMAS = ("gemma", "gemma2", "gemma3_text")
FAMILIES = (*LLAMA_LIKE, *GEMMAS, "gpt_neox")
READS_ATTENTION_BIAS = ("llama", "qwen3", *GEMMAS)  # the families whose code reads it

# Hugging Face activation -> attnlab's (attnlab.blocks.ACTIVATIONS)
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_new": "gelu_new", "relu": "relu"}  # fmt: skip
LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}
# config.json keys that mean a model attnlab does not build
UNSUPPORTED = {
    "num_experts": "mixture-of-experts", "num_local_experts": "mixture-of-experts",
    "n_routed_experts": "mixture-of-experts", "moe_intermediate_size": "mixture-of-experts",
    "use_bidirectional_attention": "bidirectional attention",
    "attention_chunk_size": "chunked attention",
}  # fmt: skip


def _refuse(feature: str):
    raise RunError(f"config.json: {feature} is not supported by attnlab")


def _need(hf: dict, key: str):
    if hf.get(key) is None:
        raise RunError(f"config.json: {hf.get('model_type')} config has no {key!r}")
    return hf[key]


def _activation(hf: dict, *keys: str) -> str:
    """The first of ``keys`` config.json sets, else the family's default (transformers')."""
    default = {"gpt_neox": "gelu"}.get(hf["model_type"], "silu")
    default = "gelu_pytorch_tanh" if hf["model_type"] in GEMMAS else default
    act = next((hf[k] for k in keys if hf.get(k)), default)
    if act not in ACTIVATIONS:
        _refuse(f"activation {act!r}")
    return ACTIVATIONS[act]


def _rope(params: dict | None, hf: dict) -> tuple[float, dict | None]:
    """(base, GPTConfig rope_scaling) from one rope_parameters dict, else the older keys."""
    params = dict(params or {})
    base = params.get("rope_theta", hf.get("rope_theta", hf.get("rotary_emb_base", 10000.0)))
    scaling = hf.get("rope_scaling") if not params.get("rope_type") else params
    scaling = scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return float(base), None
    if kind == "linear":
        return float(base), {"kind": "linear", "factor": float(scaling["factor"])}
    if kind == "llama3":
        return float(base), {
            "kind": "llama3",
            "factor": float(scaling["factor"]),
            "low_freq_factor": float(scaling["low_freq_factor"]),
            "high_freq_factor": float(scaling["high_freq_factor"]),
            "original_max_positions": int(scaling["original_max_position_embeddings"]),
        }
    _refuse(f"rope scaling type {kind!r} (attnlab has default, linear, llama3)")


def _partial_rotary(hf: dict, head_dim: int) -> int | None:
    """rot_dim from partial_rotary_factor (rope_parameters or top level) or rotary_pct."""
    params = hf.get("rope_parameters") or {}
    f = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", hf.get("rotary_pct")))
    if f is None or float(f) == 1.0:
        return None
    return int(head_dim * float(f))


def _layer_types(hf: dict, n_layer: int) -> tuple[list | None, int | None]:
    """(layer_types, sliding_window) as GPTConfig takes them."""
    kind, window = hf["model_type"], hf.get("sliding_window")
    types = hf.get("layer_types")
    if kind in ("qwen2", "qwen3") and not hf.get("use_sliding_window", False):
        window = None
    if types is None:
        if kind in ("qwen2", "qwen3") and window is not None:
            first = hf.get("max_window_layers", n_layer)
            types = [
                "sliding_attention" if i >= first else "full_attention" for i in range(n_layer)
            ]
        elif kind == "gemma2":
            types = ["sliding_attention" if (i + 1) % 2 else "full_attention"
                     for i in range(n_layer)]  # fmt: skip
        elif kind == "gemma3_text":
            every = hf.get("sliding_window_pattern", 6)
            types = ["sliding_attention" if (i + 1) % every else "full_attention"
                     for i in range(n_layer)]  # fmt: skip
    if types is None:  # llama, gemma: no window; mistral: every layer within it
        return None, window if kind == "mistral" else None
    for t in types:
        if t not in LAYER_TYPES:
            _refuse(f"layer type {t!r}")
    types = [LAYER_TYPES[t] for t in types]
    if window is None or "sliding" not in types:
        return None, None
    return types, int(window)


def decoder_config(hf: dict) -> GPTConfig:
    """The attnlab GPTConfig of a Llama, Mistral, Qwen2/3, Gemma 1-3 or GPT-NeoX config.json."""
    kind = hf.get("model_type")
    for key, feature in UNSUPPORTED.items():
        if hf.get(key):
            _refuse(f"{feature} ({key})")
    try:
        return _decoder_config(kind, hf)
    except ConfigError as e:
        raise RunError(f"config.json: {e}") from None
    except (TypeError, ValueError, KeyError) as e:
        raise RunError(f"config.json: an unreadable {kind} config ({e!r})") from None


def _decoder_config(kind: str, hf: dict) -> GPTConfig:
    n_layer, n_head = _need(hf, "num_hidden_layers"), _need(hf, "num_attention_heads")
    d_model = _need(hf, "hidden_size")
    head_dim = hf.get("head_dim") or d_model // n_head
    gemma = kind in GEMMAS
    common = dict(
        vocab_size=_need(hf, "vocab_size"),
        block_size=hf.get("max_position_embeddings") or 2048,
        n_layer=n_layer,
        n_head=n_head,
        d_model=d_model,
        d_ff=_need(hf, "intermediate_size"),
        dropout=0.0,
        pos="rotary",
        rotary="half",
        head_dim=head_dim if head_dim * n_head != d_model else None,
        tie_weights=bool(hf.get("tie_word_embeddings", kind in GEMMAS)),
    )
    params = hf.get("rope_parameters")
    if kind == "gpt_neox":
        base, scaling = _rope(params, hf)
        attn_bias = bool(hf.get("attention_bias", True))
        return GPTConfig(**common, bias=True, qkv_bias=attn_bias, out_bias=attn_bias,
                         norm="layer", ffn="mlp", activation=_activation(hf, "hidden_act"),
                         ln_eps=float(hf.get("layer_norm_eps", 1e-5)), rope_base=base,
                         rope_scaling=scaling, rot_dim=_partial_rotary(hf, head_dim),
                         parallel=bool(hf.get("use_parallel_residual", True)))  # fmt: skip
    layer_types, window = _layer_types(hf, n_layer)
    local_base = None
    if kind == "gemma3_text":  # a rope per layer type: the global one scaled, the local not
        per_type = params if params and "full_attention" in params else {}
        base, scaling = _rope(per_type.get("full_attention"), hf)
        local = per_type.get("sliding_attention") or {}
        local_base = float(local.get("rope_theta", hf.get("rope_local_base_freq", 10000.0)))
        if local.get("rope_type", "default") != "default":
            _refuse(f"rope scaling on sliding layers ({local['rope_type']!r})")
    else:
        base, scaling = _rope(params, hf)
    # transformers reads attention_bias and mlp_bias only where the family's code does:
    # Mistral and Qwen2 ignore both (Qwen2's q/k/v always have biases, its o_proj never)
    attn_bias = kind in READS_ATTENTION_BIAS and bool(hf.get("attention_bias", False))
    scalar = hf.get("query_pre_attn_scalar") if kind in ("gemma2", "gemma3_text") else None
    return GPTConfig(
        **common,
        bias=kind == "llama" and bool(hf.get("mlp_bias", False)),
        qkv_bias=attn_bias or kind == "qwen2",  # Qwen2: q/k/v biases, none on o_proj
        out_bias=attn_bias,
        norm="rms-gemma" if gemma else "rms",
        ffn="gated",
        activation=_activation(
            hf, "hidden_activation" if kind != "gemma" else "hidden_act", "hidden_act"
        ),  # fmt: skip
        ln_eps=float(hf.get("rms_norm_eps", 1e-6)),
        n_kv_heads=hf.get("num_key_value_heads") or n_head,
        rot_dim=_partial_rotary(hf, head_dim),
        rope_base=base,
        rope_scaling=scaling,
        local_rope_base=local_base if local_base != base else None,
        sliding_window=window,
        layer_types=layer_types,
        qk_norm=kind in ("qwen3", "gemma3_text"),
        attn_scale=float(scalar) ** -0.5 if scalar else None,
        attn_softcap=hf.get("attn_logit_softcapping") if kind in GEMMAS else None,
        final_softcap=hf.get("final_logit_softcapping") if kind in GEMMAS else None,
        post_norms=kind in ("gemma2", "gemma3_text"),
        embed_scale=gemma,
    )


# ---------------------------------------------------------------------------------------------
# Key maps
# ---------------------------------------------------------------------------------------------


def llama_key_map(c: GPTConfig, kind: str) -> KeyMap:
    """(attnlab name, HF name, how) for the Llama-shaped families (Llama, Mistral, Qwen, Gemma):
    q/k/v/o_proj, gate/up/down_proj, and two norms a block (four in Gemma 2/3)."""
    rows: KeyMap = [("tok_embed.weight", "model.embed_tokens.weight", "copy")]
    norms = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}
    if c.block_layout == "four-norm":  # Gemma 2/3: post_attention_layernorm closes attention
        norms = {"ln1": "input_layernorm", "ln1_post": "post_attention_layernorm",
                 "ln2": "pre_feedforward_layernorm", "ln2_post": "post_feedforward_layernorm"}  # fmt: skip
    for i in range(c.n_layer):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        rows += [(f"{ours}{o}.weight", f"{theirs}{t}.weight", "copy") for o, t in norms.items()]
        linears = [(f"attn.{x}_proj", f"self_attn.{x}_proj", c.qkv_bias) for x in "qkv"]
        linears.append(("attn.out_proj", "self_attn.o_proj", c.out_bias))
        linears += [(f"mlp.{x}", f"mlp.{x}_proj", c.bias) for x in ("gate", "up", "down")]
        for o, t, bias in linears:
            rows.append((f"{ours}{o}.weight", f"{theirs}{t}.weight", "copy"))
            if bias:
                rows.append((f"{ours}{o}.bias", f"{theirs}{t}.bias", "copy"))
        if c.qk_norm:
            rows += [(f"{ours}attn.{x}_norm.weight", f"{theirs}self_attn.{x}_norm.weight", "copy")
                     for x in "qk"]  # fmt: skip
    rows.append(("ln_f.weight", "model.norm.weight", "copy"))
    if not c.tie_weights:
        rows.append(("lm_head.weight", "lm_head.weight", "copy"))
    return rows


def _neox_part(part: int, n_head: int):
    """GPT-NeoX's query_key_value rows are per head [q | k | v] (H, 3, D): one of the three."""

    def take(t: Tensor) -> Tensor:
        return t.unflatten(0, (n_head, 3, -1))[:, part].flatten(0, 1)  # (H*D, ...) or (H*D,)

    return take


def neox_key_map(c: GPTConfig) -> KeyMap:
    """(attnlab name, HF name, how) for GPT-NeoX / Pythia: the fused, head-interleaved qkv split
    into q, k and v (``_neox_part``); LayerNorms with biases; a separate output embedding."""
    rows: KeyMap = [("tok_embed.weight", "gpt_neox.embed_in.weight", "copy")]
    for i in range(c.n_layer):
        ours, theirs = f"blocks.{i}.", f"gpt_neox.layers.{i}."
        pairs = [("ln1", "input_layernorm", True), ("ln2", "post_attention_layernorm", True),
                 ("attn.out_proj", "attention.dense", c.out_bias),
                 ("mlp.fc1", "mlp.dense_h_to_4h", True), ("mlp.fc2", "mlp.dense_4h_to_h", True)]  # fmt: skip
        for o, t, bias in pairs:
            rows.append((f"{ours}{o}.weight", f"{theirs}{t}.weight", "copy"))
            if bias:
                rows.append((f"{ours}{o}.bias", f"{theirs}{t}.bias", "copy"))
        for j, x in enumerate("qkv"):
            qkv = f"{theirs}attention.query_key_value"
            rows.append((f"{ours}attn.{x}_proj.weight", f"{qkv}.weight", _neox_part(j, c.n_head)))
            if c.qkv_bias:
                rows.append((f"{ours}attn.{x}_proj.bias", f"{qkv}.bias", _neox_part(j, c.n_head)))
    rows += [("ln_f.weight", "gpt_neox.final_layer_norm.weight", "copy"),
             ("ln_f.bias", "gpt_neox.final_layer_norm.bias", "copy")]  # fmt: skip
    if not c.tie_weights:
        rows.append(("lm_head.weight", "embed_out.weight", "copy"))
    return rows


def _skippable(tensors: dict[str, Tensor], c: GPTConfig, kind: str) -> set[str]:
    """Buffers some files carry (rotary tables, causal masks) and a tied head's stored copy."""
    buffers = (".rotary_emb.inv_freq", ".attention.bias", ".attention.masked_bias")
    skip = {k for k in tensors if k.endswith(buffers)}
    head = "embed_out.weight" if kind == "gpt_neox" else "lm_head.weight"
    if c.tie_weights and head in tensors:
        skip.add(head)
    return skip


def load_decoder(hf_dir: str | Path, hf: dict | None = None) -> GPT:
    """A Hugging Face Llama / Mistral / Qwen2 / Qwen3 / Gemma / Gemma 2 / Gemma 3 (text) /
    GPT-NeoX directory as an attnlab GPT in eval mode: built on the meta device, then given the
    memory-mapped weights (converted to float32 where stored in half precision)."""
    hf = hf or read_hf_config(hf_dir)
    kind = hf.get("model_type")
    config = decoder_config(hf)
    tensors = read_hf_weights(hf_dir, mmap=True)
    if kind != "gpt_neox" and "model.embed_tokens.weight" not in tensors:  # bare XModel files
        tensors = {f"model.{k}": v for k, v in tensors.items()}
    key_map = neox_key_map(config) if kind == "gpt_neox" else llama_key_map(config, kind)
    # bfloat16 weights stay bfloat16 (the run is the file's size and computes as transformers
    # does by default); float16 and mixed files are computed in float32
    stored = {tensors[h].dtype for _, h, _ in key_map if h in tensors}
    dtype = "bfloat16" if stored == {torch.bfloat16} else "float32"
    cfg = {"model_type": "gpt", "config": config.to_dict(), "dtype": dtype}
    model = build_model(cfg, device="meta")
    apply_key_map(model, tensors, key_map, _skippable(tensors, config, kind), str(hf_dir))
    return model.eval()


# ---------------------------------------------------------------------------------------------
# Export: a Llama-shaped GPT as LlamaForCausalLM (Qwen2 / Qwen3 where its biases or QK-norm ask)
# ---------------------------------------------------------------------------------------------

HF_NAMES = {ours: theirs for theirs, ours in ACTIVATIONS.items() if theirs != "swish"}


def is_llama_shaped(c: GPTConfig) -> bool:
    """A GPT that only the Llama family could hold: RMSNorm (GPT-2 has LayerNorm; the rest is
    checked by ``llama_hf_config``, which names what the family lacks)."""
    return c.norm == "rms"


def llama_hf_config(c: GPTConfig, tokenizer=None) -> dict:
    """The config.json of the closest Llama-family architecture for a GPTConfig: llama, or
    qwen2 (q/k/v biases without an output bias), or qwen3 (QK-norm); a RunError names what none
    of them has."""
    steps = [s.sublayer for s in c.residual_steps()]
    problems = [
        what
        for what, bad in (
            (
                "a feed-forward without a gate (theirs: ffn=gated)",
                c.ffn != "gated" and steps == ["attn", "mlp"],
            ),
            ("blocks other than attention then a feed-forward", steps != ["attn", "mlp"]),
            (
                f"{layout_words(c.block_layout)} blocks (theirs are pre-norm)",
                c.block_layout != "pre",
            ),
            (f"activation {c.activation!r}", c.activation not in HF_NAMES),
            ("positions other than rotary", c.pos != "rotary"),
            (
                "adjacent-pair rotary (theirs rotates halves, as --arch llama does)",
                c.pos == "rotary" and c.rotary != "half",
            ),  # fmt: skip
            ("partial rotary (rot_dim)", c.rot_dim is not None),
            ("sliding windows", c.sliding_window is not None),
            ("softcaps", c.attn_softcap is not None or c.final_softcap is not None),
            ("a scale other than 1/sqrt(head width)", c.attn_scale is not None),
            ("scaled embeddings", c.embed_scale),
            ("a local rope base", c.local_rope_base is not None),
        )
        if bad
    ]
    qkv_bias = c.bias if c.qkv_bias is None else c.qkv_bias
    out_bias = c.bias if c.out_bias is None else c.out_bias
    kind = "qwen3" if c.qk_norm else ("qwen2" if qkv_bias and not out_bias else "llama")
    if kind == "qwen2" and c.bias:
        problems.append("MLP biases beside q/k/v biases")
    if kind == "qwen3" and qkv_bias != out_bias:
        problems.append("q/k/v biases without an output bias beside QK-norm")
    if kind != "llama" and c.bias:
        problems.append(f"MLP biases ({kind} has none)")
    if problems:
        raise RunError("cannot export: transformers' models with RMSNorm (the Llama family) "
                       "lack " + "; ".join(problems))  # fmt: skip
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
    rope = {"rope_type": "default", "rope_theta": c.rope_base}
    if c.rope_scaling:
        s = dict(c.rope_scaling)
        rope = {"rope_type": s.pop("kind"), "rope_theta": c.rope_base, **s}
        if "original_max_positions" in rope:
            rope["original_max_position_embeddings"] = rope.pop("original_max_positions")
    eos = None
    if tokenizer is not None:
        eos = next((tokenizer.special_tokens[t] for t in ("</s>", "<|endoftext|>", "<eos>")
                    if t in getattr(tokenizer, "special_tokens", {})), None)  # fmt: skip
    hf = {
        "architectures": [arch[kind]],
        "model_type": kind,
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "intermediate_size": c.d_ff or 4 * c.d_model,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_kv_heads or c.n_head,
        "head_dim": c.head_width,
        "hidden_act": HF_NAMES[c.activation],
        "max_position_embeddings": c.block_size,
        "rms_norm_eps": c.ln_eps,
        "tie_word_embeddings": c.tie_weights,
        "rope_parameters": rope,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "dtype": "float32",
    }
    if kind == "llama":
        hf.update(attention_bias=qkv_bias, mlp_bias=c.bias)
    if kind == "qwen3":
        hf["attention_bias"] = qkv_bias
    return hf


def llama_state_dict(model: GPT, kind: str) -> dict[str, Tensor]:
    """The inverse key map: every attnlab tensor under its Hugging Face name (all copies)."""
    sd = model.state_dict()
    return {h: sd[o].contiguous() for o, h, _ in llama_key_map(model.config, kind)}


def export_llama(run) -> tuple[dict, dict, int]:
    """A GPT that has their pieces (``is_llama_shaped``) as Llama / Qwen2 / Qwen3."""
    c = run.model.config
    config = llama_hf_config(c, run.tokenizer)
    config["dtype"] = weights_dtype(run.model)  # a run imported from bfloat16 stays bfloat16
    return config, llama_state_dict(run.model, config["model_type"]), c.block_size


# a GPT run that is not Llama-shaped is written as GPT-2 (gpt2.py's family takes any GPT)
FAMILY = register(Family(
    "decoders", 30, "Llama, Mistral, Qwen2/3, Gemma 1-3, Pythia", FAMILIES, load_decoder,
    needs="tokenizer.json", exports=("gpt",), export=export_llama,
    fits=lambda model: is_llama_shaped(model.config),
))  # fmt: skip
