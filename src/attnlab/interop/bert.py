"""BERT in and out: a Hugging Face BERT directory (``BertModel``, ``BertForMaskedLM``,
``BertForSequenceClassification``, a sentence-transformers layout) read as an attnlab encoder,
and an encoder run (learned positions, post-norm, gelu) written as one of them."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from attnlab.blocks import layout_words
from attnlab.config import ConfigError
from attnlab.interop.hf import Family, activation, register
from attnlab.interop.hf_files import KeyMap, apply_key_map, read_hf_config, read_hf_weights
from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.rundir import RunError

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
            activation=activation(hf, "hidden_act"),
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


def bert_hf_config(config: EncoderConfig, labels: list[str] | None = None) -> dict:
    """A BERT config.json for an attnlab EncoderConfig (or a RunError saying what BERT cannot
    express): BertForMaskedLM with a masked-LM head, BertForSequenceClassification with a
    classification head (its labels as id2label), else BertModel."""
    problems = []
    if config.pos != "learned":
        problems.append(f"pos={config.pos!r} (BERT has learned positions)")
    if config.block_layout != "post":
        problems.append(f"{layout_words(config.block_layout)} blocks (BERT is post-norm)")
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


FAMILY = register(Family(
    "bert", 20, "BERT", ("bert",), load_bert, exports=("encoder",),
    export=lambda run: (bert_hf_config(run.model.config, run.config.get("labels")),
                        bert_state_dict(run.model), run.model.config.block_size),
))  # fmt: skip
