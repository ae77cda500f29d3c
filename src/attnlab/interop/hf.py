"""Hugging Face models in (GPT-2, BERT here; Llama, Mistral, Qwen, Gemma, GPT-NeoX through
``decoders``); GPT-2 and BERT weights out, with a tokenizer.

A Hugging Face model directory holds config.json, model.safetensors (or shards listed in
model.safetensors.index.json) and a tokenizer (tokenizer.json, or vocab.txt / vocab.json +
merges.txt). Reading it and the key-map machinery are ``hf_files``.

GPT-2 stores its linear layers as ``Conv1D`` modules whose weight is (in, out), the transpose of
``nn.Linear``'s (out, in); its query, key and value projections are one (C, 3C) matrix ``c_attn``.
The key map names both: ``conv1d`` (transpose) and ``conv1d_q/k/v`` (third of c_attn, transposed).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import Tensor

from attnlab import __version__ as ATTNLAB_VERSION
from attnlab.checkpoint import (
    RunError,
    read_json_object,  # noqa: F401  (vit reads it from here)
    save_model,
    save_tensors,
    with_weights_dtype,
)
from attnlab.config import ConfigError
from attnlab.files import FileLock, atomic_write_json, atomic_write_text
from attnlab.interop.hf_files import (
    KeyMap,
    apply_key_map,
    read_hf_config,
    read_hf_weights,
    weight_files,
)
from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.tokenizers import HFTokenizer, Tokenizer, TokenizerError, tokenizer_from_json

# HF activation name -> ours
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}
GPT2_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}  # ours -> HF
ATTNLAB_TOKENIZER = "attnlab_tokenizer.json"  # a char/word tokenizer kept beside an exported model


def _strip_prefix(tensors: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k.removeprefix(prefix): v for k, v in tensors.items()}


def _get(cfg: dict, *names, default=None):
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def _activation(cfg: dict, key: str) -> str:
    act = cfg.get(key, "gelu")
    if act not in HF_ACTIVATIONS:
        raise RunError(
            f"config.json: activation {act!r} is not supported; "
            f"supported: {', '.join(HF_ACTIVATIONS)}"
        )
    return HF_ACTIVATIONS[act]


# ---------------------------------------------------------------------------------------------
# GPT-2
# ---------------------------------------------------------------------------------------------


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
            activation=_activation(hf, "activation_function"),
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
        problems.append(f"{config.block_layout} blocks (GPT-2's are pre-norm)")
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


def _is_attnlab_run(d: Path) -> bool:
    try:
        return "attnlab_format" in json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def export_gpt2(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Write an attnlab GPT run as a directory ``GPT2LMHeadModel.from_pretrained`` loads (see
    ``export_hf``, which also writes encoder runs)."""
    return export_hf(run_dir, out_dir, only="gpt")


# ---------------------------------------------------------------------------------------------
# BERT
# ---------------------------------------------------------------------------------------------

BERT_PREFIXES = ("bert.",)


def bert_config(hf: dict, tensors: dict[str, Tensor]) -> EncoderConfig:
    """EncoderConfig for a BERT config.json; the heads follow the tensors present."""
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise RunError(
            f"config.json: position_embedding_type={hf['position_embedding_type']!r} "
            "is not supported (absolute only)"
        )
    if hf.get("is_decoder"):
        raise RunError("config.json: BERT as a decoder (is_decoder=true) is not supported")
    num_labels = tensors["classifier.weight"].shape[0] if "classifier.weight" in tensors else 0
    try:
        return EncoderConfig(
            vocab_size=hf["vocab_size"],
            block_size=hf.get("max_position_embeddings", 512),
            n_layer=hf["num_hidden_layers"],
            n_head=hf["num_attention_heads"],
            d_model=hf["hidden_size"],
            d_ff=hf.get("intermediate_size"),
            type_vocab_size=hf.get("type_vocab_size", 2),
            dropout=float(hf.get("hidden_dropout_prob", 0.1)),
            activation=_activation(hf, "hidden_act"),
            ln_eps=float(hf.get("layer_norm_eps", 1e-12)),
            pooler="pooler.dense.weight" in tensors,
            mlm_head="cls.predictions.transform.dense.weight" in tensors,
            num_labels=num_labels,
            pad_id=hf.get("pad_token_id") or 0,
            tie_weights=bool(hf.get("tie_word_embeddings", True)),
        )
    except KeyError as e:
        raise RunError(f"config.json: BERT config has no {e.args[0]!r}") from None
    except ConfigError as e:
        raise RunError(f"config.json: {e}") from None


def bert_key_map(config: EncoderConfig, decoder_bias: str = "cls.predictions.bias") -> KeyMap:
    """(attnlab name, HF BERT name without 'bert.', how) for every attnlab tensor."""
    rows: KeyMap = [
        ("tok_embed.weight", "embeddings.word_embeddings.weight", "copy"),
        ("pos_embed.weight", "embeddings.position_embeddings.weight", "copy"),
        ("embed_ln.weight", "embeddings.LayerNorm.weight", "copy"),
        ("embed_ln.bias", "embeddings.LayerNorm.bias", "copy"),
    ]
    if config.type_vocab_size:
        rows.append(("type_embed.weight", "embeddings.token_type_embeddings.weight", "copy"))
    pairs = [
        ("attn.q_proj", "attention.self.query"),
        ("attn.k_proj", "attention.self.key"),
        ("attn.v_proj", "attention.self.value"),
        ("attn.out_proj", "attention.output.dense"),
        ("ln1", "attention.output.LayerNorm"),
        ("mlp.fc1", "intermediate.dense"),
        ("mlp.fc2", "output.dense"),
        ("ln2", "output.LayerNorm"),
    ]
    for i in range(config.n_layer):
        for ours, theirs in pairs:
            for p in ("weight", "bias"):
                rows.append((f"blocks.{i}.{ours}.{p}", f"encoder.layer.{i}.{theirs}.{p}", "copy"))
    heads = []
    if config.pooler:
        heads.append(("pooler", "pooler.dense"))
    if config.mlm_head:
        heads += [
            ("mlm.dense", "cls.predictions.transform.dense"),
            ("mlm.ln", "cls.predictions.transform.LayerNorm"),
        ]
        rows.append(("mlm.decoder.bias", decoder_bias, "copy"))
        if not config.tie_weights:
            rows.append(("mlm.decoder.weight", "cls.predictions.decoder.weight", "copy"))
    if config.num_labels:
        heads.append(("classifier", "classifier"))
    for ours, theirs in heads:
        rows += [
            (f"{ours}.weight", f"{theirs}.weight", "copy"),
            (f"{ours}.bias", f"{theirs}.bias", "copy"),
        ]
    return rows


def _bert_tensors(raw: dict[str, Tensor]) -> dict[str, Tensor]:
    """Drop the 'bert.' prefix (BertFor*; sentence-transformers files have none) and rename
    the TF-era LayerNorm.gamma/beta to weight/bias."""
    out = {}
    for k, v in raw.items():
        for p in BERT_PREFIXES:
            k = k.removeprefix(p)
        out[
            k.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
                "LayerNorm.beta", "LayerNorm.bias"
            )
        ] = v
    return out


def _bert_skippable(tensors: dict[str, Tensor], config: EncoderConfig) -> set[str]:
    """The position-id buffer, the NSP head, and the decoder's tied copies (checked equal)."""
    skip = {k for k in tensors if k.endswith(("position_ids", "token_type_ids"))}
    skip |= {k for k in tensors if k.startswith("cls.seq_relationship.")}  # next-sentence head
    bias = tensors.get("cls.predictions.decoder.bias")
    if bias is not None and "cls.predictions.bias" in tensors:
        # HF's forward adds decoder.bias; cls.predictions.bias is its tied twin (always in 4.x,
        # with tied embeddings in 5.x) or, untied, a parameter nothing reads.
        if config.tie_weights and not torch.equal(bias, tensors["cls.predictions.bias"]):
            raise RunError("cls.predictions.decoder.bias differs from cls.predictions.bias")
        skip.add("cls.predictions.bias")
    dec = tensors.get("cls.predictions.decoder.weight")
    if dec is not None and config.tie_weights:
        if not torch.equal(dec, tensors["embeddings.word_embeddings.weight"]):
            raise RunError(
                "cls.predictions.decoder.weight differs from the word embeddings "
                "but config.json says they are tied"
            )
        skip.add("cls.predictions.decoder.weight")
    return skip


def load_bert(hf_dir: str | Path, hf: dict | None = None) -> Encoder:
    hf = hf or read_hf_config(hf_dir)
    tensors = _bert_tensors(read_hf_weights(hf_dir))
    config = bert_config(hf, tensors)
    model = Encoder(config)
    dec_bias = "cls.predictions.decoder.bias"  # what HF's forward adds, when the file has it
    dec_bias = dec_bias if dec_bias in tensors else "cls.predictions.bias"
    key_map = bert_key_map(config, decoder_bias=dec_bias)
    apply_key_map(model, tensors, key_map, _bert_skippable(tensors, config), str(hf_dir))
    return model.eval()


# ---------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------


def load_hf_tokenizer(
    hf_dir: str | Path, hf: dict | None = None
) -> tuple[Tokenizer | None, str | None]:
    """(tokenizer, the file it came from) for a HF directory; (None, None) if it has none.

    Padding and truncation saved in tokenizer.json are switched off: attnlab pads batches
    itself and reports a too-long text rather than silently cutting it.
    """
    from tokenizers import Tokenizer as HFTok
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

    hf_dir = Path(hf_dir)
    hf = hf or read_hf_config(hf_dir)
    try:
        if (hf_dir / ATTNLAB_TOKENIZER).is_file():  # an attnlab export: its own tokenizer
            text = (hf_dir / ATTNLAB_TOKENIZER).read_text(encoding="utf-8")
            return tokenizer_from_json(text), ATTNLAB_TOKENIZER
        if (hf_dir / "tokenizer.json").is_file():
            tok, source = HFTok.from_file(str(hf_dir / "tokenizer.json")), "tokenizer.json"
        elif (hf_dir / "vocab.txt").is_file():  # BERT WordPiece
            tok_cfg = _json_or_empty(hf_dir / "tokenizer_config.json")
            vocab = (hf_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
            vocab_ids = {w: i for i, w in enumerate(vocab)}
            tok = HFTok(models.WordPiece(vocab_ids, unk_token="[UNK]"))
            tok.normalizer = normalizers.BertNormalizer(
                lowercase=tok_cfg.get("do_lower_case", True)
            )
            tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            tok.decoder = decoders.WordPiece()
            tok.post_processor = processors.BertProcessing(
                ("[SEP]", vocab_ids["[SEP]"]), ("[CLS]", vocab_ids["[CLS]"])
            )
            specials = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
            tok.add_special_tokens([t for t in specials if t in vocab_ids])  # kept whole, never
            source = "vocab.txt"  # lower-cased: "the [MASK] of" has its mask token
        elif (hf_dir / "vocab.json").is_file() and (hf_dir / "merges.txt").is_file():  # GPT-2 BPE
            bpe = models.BPE.from_file(str(hf_dir / "vocab.json"), str(hf_dir / "merges.txt"))
            tok = HFTok(bpe)
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = decoders.ByteLevel()
            source = "vocab.json + merges.txt"
        else:
            return None, None
    except TokenizerError:
        raise
    except KeyError as e:
        raise RunError(f"{hf_dir}: vocab.txt has no {e.args[0]} token") from None
    except Exception as e:  # the Rust side raises its own exception type
        raise RunError(f"{hf_dir}: tokenizer could not be read ({e})") from None
    tok.no_padding()
    tok.no_truncation()
    return HFTokenizer(tok), source


def _json_or_empty(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


# ---------------------------------------------------------------------------------------------
# Whole directories
# ---------------------------------------------------------------------------------------------


# model_type -> loader (hf_dir, hf) -> model. A family in a module of its own (interop/t5.py,
# interop/vit.py) adds itself here when attnlab.interop is imported.
LOADERS = {"gpt2": load_gpt2, "bert": load_bert}
# files a model_type cannot be imported without (its text or image reader)
REQUIRED_FILES: dict[str, str] = {}
# model_type -> reader of its "tokenizer" (hf_dir, hf, model) -> (tokenizer, source); the rest
# read tokenizer.json / vocab files (load_hf_tokenizer)
TOKENIZER_READERS: dict = {}


def load_hf(hf_dir: str | Path):
    """(model, tokenizer, provenance) for a HF directory of a model type in ``LOADERS``, in
    eval mode."""
    hf_dir = Path(hf_dir)
    hf = read_hf_config(hf_dir)
    files = weight_files(hf_dir)  # refuses a directory of pickles before anything else
    kind, known = hf.get("model_type"), LOADERS
    if kind not in known:
        raise RunError(
            f"{hf_dir}: model_type {kind!r} is not supported; attnlab imports {', '.join(known)}"
        )
    need = REQUIRED_FILES.get(kind)
    if need and not (hf_dir / need).is_file():
        raise RunError(f"{hf_dir}: no {need}, which a {kind} model needs to read its input")
    model = LOADERS[kind](hf_dir, hf)
    if kind in TOKENIZER_READERS:
        tokenizer, tok_source = TOKENIZER_READERS[kind](hf_dir, hf, model)
    else:
        tokenizer, tok_source = load_hf_tokenizer(hf_dir, hf)
    vocab = getattr(model.config, "vocab_size", None)
    if tokenizer is not None and vocab is not None and tokenizer.vocab_size > vocab:
        raise RunError(
            f"{hf_dir}: the tokenizer has {tokenizer.vocab_size} tokens but the model "
            f"only {model.config.vocab_size}"
        )
    digest = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):  # noqa: B023
                digest.update(chunk)
    source = {
        "format": "huggingface",
        "path": str(hf_dir.resolve()),
        "hf_model_type": kind,
        "architectures": hf.get("architectures"),
        "name_or_path": hf.get("_name_or_path"),
        "transformers_version": hf.get("transformers_version"),
        "weights": [f.name for f in files],
        "weights_sha256": digest.hexdigest(),
        "tokenizer": tok_source,
        "imported_by": f"attnlab {ATTNLAB_VERSION}",
    }
    if "attnlab" in hf:
        source["attnlab"] = hf["attnlab"]
    provenance = {"source": source}
    pooling = _sentence_transformers_pooling(hf_dir)
    if pooling:
        provenance["sentence_embedding"] = pooling
    return model, tokenizer, provenance


def _sentence_transformers_pooling(hf_dir: Path) -> dict | None:
    """{"pool": "mean"|"cls", "normalize": bool} from a sentence-transformers layout."""
    modules = _json_or_list(hf_dir / "modules.json")
    pool_cfg = _json_or_empty(hf_dir / "1_Pooling" / "config.json")
    if not modules and not pool_cfg:
        return None
    pool = "cls" if pool_cfg.get("pooling_mode_cls_token") else "mean"
    normalize = any(
        str(m.get("type", "")).endswith("Normalize") for m in modules if isinstance(m, dict)
    )
    return {"pool": pool, "normalize": normalize}


def _json_or_list(path: Path) -> list:
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    except (json.JSONDecodeError, UnicodeDecodeError):
        return []
    return data if isinstance(data, list) else []


def _fresh_output_dir(out_dir: str | Path, verb: str) -> Path:
    """``out_dir`` as a Path, refused when it is a file or already holds an attnlab run."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise RunError(f"{out_dir}: exists and is not a directory")
    if _is_attnlab_run(out_dir):
        raise RunError(
            f"{out_dir}: is an attnlab run directory; {verb} will not overwrite it "
            "(give another directory)"
        )
    return out_dir


def import_hf(hf_dir: str | Path, out_dir: str | Path, dtype: str = "auto") -> Path:
    """Convert a Hugging Face directory into an attnlab run directory. ``dtype`` "auto" keeps
    the weights as the loader gives them (a decoder's bfloat16 weights stay bfloat16: the run is
    the file's size); "float32" computes in float32 whatever the file holds."""
    if dtype not in ("auto", "float32"):
        raise RunError(f"dtype {dtype!r}: choose auto or float32")
    model, tokenizer, provenance = load_hf(hf_dir)
    if dtype == "float32":
        with_weights_dtype(model, "float32")
    with FileLock(out_dir) as lock:  # a train writing out_dir refuses this, and this a train
        out_dir = _fresh_output_dir(out_dir, "import-hf")
        out_dir.mkdir(parents=True, exist_ok=True)
        lock.take()  # a directory made just now: locked before its first file
        save_model(out_dir, model, tokenizer, extra=provenance)
    return out_dir


# ---------------------------------------------------------------------------------------------
# Export: weights, config and a tokenizer that transformers' Auto classes load
# ---------------------------------------------------------------------------------------------

# attnlab's word split (tokenizers.WORD_RE: r"\w+|[^\w\s]") in Oniguruma's words: Python's \w
# is a letter, a number or "_"; its \s includes the ASCII separators \x1c-\x1f.
HF_WORD_PATTERN = r"[\p{L}\p{N}_]+|[^\p{L}\p{N}_\s\x{1c}-\x{1f}]"


def hf_tokenizer(tokenizer: Tokenizer):
    """The run's tokenizer as a Hugging Face ``tokenizers.Tokenizer`` giving the same ids for
    any text. BPE and WordPiece runs already are one. A char run becomes a WordLevel model over
    single characters, a word run a WordLevel model over attnlab's word split. A character (or
    word) the vocabulary lacks: where attnlab has ``<unk>`` both give its id; where it has none
    (a language model's char tokenizer) both refuse the text (attnlab: TokenizerError naming
    the characters; transformers: an exception from the WordLevel model)."""
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTok

    from attnlab.tokenizers import UNK, CharTokenizer, WordTokenizer

    if isinstance(tokenizer, HFTokenizer):
        return HFTok.from_str(tokenizer.to_json())
    if isinstance(tokenizer, CharTokenizer):
        tok = HFTok(models.WordLevel(dict(tokenizer.stoi), unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()  # characters join with nothing between them
    elif isinstance(tokenizer, WordTokenizer):
        tok = HFTok(models.WordLevel(dict(tokenizer.stoi), unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.Split(
            Regex(HF_WORD_PATTERN), behavior="removed", invert=True
        )  # keep the words and marks, drop what is between them (whitespace)
    else:
        raise RunError(
            f"a {type(tokenizer).__name__} cannot be written as a Hugging Face tokenizer"
        )
    if UNK in tokenizer.stoi:
        tok.add_special_tokens([UNK])
    return tok


def tokenizer_files(tokenizer: Tokenizer, max_length: int) -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json (file -> text) for
    ``AutoTokenizer.from_pretrained``: a PreTrainedTokenizerFast over ``hf_tokenizer``, with the
    run's special tokens named (BERT's [CLS] [SEP] [MASK] [PAD] [UNK]; <unk>; <|endoftext|>)."""
    tok = hf_tokenizer(tokenizer)
    vocab = tok.get_vocab()
    roles = {"cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]",
             "pad_token": "[PAD]", "unk_token": "[UNK]"}  # fmt: skip
    special = {role: t for role, t in roles.items() if t in vocab}
    if "<unk>" in vocab and "unk_token" not in special:
        special["unk_token"] = "<unk>"
    if "<|endoftext|>" in vocab:
        special.update(bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,  # decode gives back what the decoder joins
        **special,
    }
    return {
        "tokenizer.json": tok.to_str(),
        "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False),
        "special_tokens_map.json": json.dumps(special, indent=2, ensure_ascii=False),
    }


def bert_hf_config(config: EncoderConfig, labels: list[str] | None = None) -> dict:
    """A BERT config.json for an attnlab EncoderConfig (or a RunError saying what BERT cannot
    express): BertForMaskedLM with a masked-LM head, BertForSequenceClassification with a
    classification head (its labels as id2label), else BertModel."""
    problems = []
    if config.pos != "learned":
        problems.append(f"pos={config.pos!r} (BERT has learned positions)")
    if config.block_layout != "post":
        problems.append(f"{config.block_layout} blocks (BERT's are post-norm)")
    if not config.embed_norm:
        problems.append("no LayerNorm after the embeddings")
    if not config.bias:
        problems.append("bias=False (BERT has biases)")
    if config.activation != "gelu":
        problems.append(f"activation={config.activation!r} (export writes BERT's gelu)")
    if config.num_labels and not config.pooler:
        problems.append("a classification head without the pooler")
    if problems:
        raise RunError("cannot export as BERT: " + "; ".join(problems))
    arch = ("BertForMaskedLM" if config.mlm_head
            else "BertForSequenceClassification" if config.num_labels else "BertModel")  # fmt: skip
    out = {
        "architectures": [arch],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "intermediate_size": config.d_ff or 4 * config.d_model,
        "hidden_act": "gelu",
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.dropout,
        "max_position_embeddings": config.block_size,
        "type_vocab_size": max(1, config.type_vocab_size),
        "layer_norm_eps": config.ln_eps,
        "pad_token_id": config.pad_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": config.tie_weights,
        "dtype": "float32",
    }
    if config.num_labels:
        names = labels if labels and len(labels) == config.num_labels else None
        names = names or [f"LABEL_{i}" for i in range(config.num_labels)]
        out["id2label"] = {str(i): n for i, n in enumerate(names)}
        out["label2id"] = {n: i for i, n in enumerate(names)}
        out["num_labels"] = config.num_labels
    return out


def bert_state_dict(model: Encoder) -> dict[str, Tensor]:
    """The inverse of ``bert_key_map``: attnlab encoder tensors -> BertFor* names. A model
    without token types gets an all-zero type embedding (BERT always adds one: adding 0 keeps
    every output the same); a masked LM's pooler is left out (BertForMaskedLM has none)."""
    c = model.config
    sd = model.state_dict()
    out: dict[str, Tensor] = {}
    for ours, theirs, _ in bert_key_map(c):
        if c.mlm_head and ours.startswith("pooler."):
            continue
        base = theirs.startswith(("embeddings.", "encoder.", "pooler."))
        out[("bert." if base and (c.mlm_head or c.num_labels) else "") + theirs] = sd[ours]
    if c.mlm_head:
        out["cls.predictions.decoder.bias"] = sd["mlm.decoder.bias"].clone()  # HF adds this one
        if not c.tie_weights:
            out["cls.predictions.decoder.weight"] = sd["mlm.decoder.weight"]
    if not c.type_vocab_size:
        prefix = "bert." if (c.mlm_head or c.num_labels) else ""
        out[prefix + "embeddings.token_type_embeddings.weight"] = torch.zeros(1, c.d_model)
    return {k: v.contiguous() for k, v in out.items()}


# How each attnlab model type is written as a Hugging Face architecture (the explicit key
# maps above): run -> (HF config.json, tensors, the tokenizer's max length). A format of this
# module, not a declaration of the models, which know nothing of Hugging Face.
EXPORTS = {
    "gpt": lambda run: (gpt2_hf_config(run.model.config, run.tokenizer),
                        gpt2_state_dict(run.model), run.model.config.block_size),
    "encoder": lambda run: (bert_hf_config(run.model.config, run.config.get("labels")),
                            bert_state_dict(run.model), run.model.config.block_size),
}  # fmt: skip


def export_hf(run_dir: str | Path, out_dir: str | Path, only: str | None = None) -> Path:
    """Write a GPT run as GPT-2 (``GPT2LMHeadModel``), or as Llama / Qwen2 / Qwen3 where it has
    their pieces, and an encoder run as BERT
    (``BertForMaskedLM``, ``BertForSequenceClassification`` or ``BertModel``), with a tokenizer
    ``AutoTokenizer.from_pretrained`` loads (``tokenizer_files``), in a directory transformers
    opens with ``from_pretrained``. A char or word tokenizer is also kept as attnlab's own
    (attnlab_tokenizer.json), so ``import-hf`` brings the run back exactly."""
    from attnlab.run import load_run
    from attnlab.tokenizers import PairTokenizer

    run = load_run(run_dir)
    model, tokenizer = run
    # kind branch 2 of 2: a Hugging Face architecture is this module's format, chosen by the
    # model_type config.json names (EXPORTS); the models declare nothing about Hugging Face
    if only is not None and model.model_type != only:  # export_gpt2: GPT-2 directories only
        raise RunError(
            f"{run_dir}: export-hf writes GPT-2 directories from GPT runs; this run "
            f"holds a model of type {model.model_type!r}"
        )
    if model.model_type not in EXPORTS:
        raise RunError(
            f"{run_dir}: export-hf writes GPT runs (as GPT-2) and encoder runs (as BERT); this "
            f"run holds a model of type {model.model_type!r}, which attnlab cannot write as a "
            "Hugging Face architecture"
        )
    hf, tensors, max_length = EXPORTS[model.model_type](run)
    if tokenizer is not None and (
        isinstance(tokenizer, PairTokenizer) or not hasattr(tokenizer, "encode")
    ):
        raise RunError(f"{run_dir}: its tokenizer cannot be written for Hugging Face")
    files = tokenizer_files(tokenizer, max_length) if tokenizer is not None else {}
    hf["attnlab"] = {
        "exported_from": str(Path(run_dir).resolve()),
        "attnlab_version": ATTNLAB_VERSION,
        "model_type": model.model_type,
        "config": model.config.to_dict(),
    }
    out_dir = _fresh_output_dir(out_dir, "export-hf")
    out_dir.mkdir(parents=True, exist_ok=True)
    save_tensors(out_dir / "model.safetensors", tensors, metadata={"format": "pt"})
    for name, text in files.items():
        atomic_write_text(out_dir / name, text)
    if tokenizer is not None and not isinstance(tokenizer, HFTokenizer):
        atomic_write_text(out_dir / ATTNLAB_TOKENIZER, tokenizer.to_json())
    atomic_write_json(out_dir / "config.json", hf)  # last: a directory with config.json is complete
    return out_dir
