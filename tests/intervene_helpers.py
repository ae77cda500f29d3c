"""Small runs of every model kind for the intervention tests (random or briefly trained)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from attnlab.rundir import save_model
from attnlab.tokenizers import CharTokenizer, PairTokenizer

WORDS = ["the", "bank", "of", "river", "money", "a", "is", "green", "deep", "water", "went",
         "to", "i", "we", "sat", "by"]  # fmt: skip
PAIRS_TEXT = "abcdefghijklmnopqrstuvwxyz 0123456789-"


def perturb(model: torch.nn.Module, scale: float = 0.1) -> torch.nn.Module:
    """Non-trivial biases and LayerNorms, so that every term of a decomposition is exercised."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln" in name or "LayerNorm" in name:
                p.add_(scale * torch.randn_like(p))
    return model


def bert_mlm_run(path: Path) -> Path:
    """A tiny random Hugging Face BertForMaskedLM with a WordPiece vocab.txt, imported with
    ``import_hf`` (the path a real BERT or MiniLM-style checkpoint takes)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    from attnlab.interop.hf import import_hf

    transformers.logging.set_verbosity_error()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=24, num_hidden_layers=2,
                                  num_attention_heads=3, intermediate_size=40,
                                  max_position_embeddings=32, attn_implementation="eager")  # fmt: skip
    torch.manual_seed(0)
    ref = perturb(transformers.BertForMaskedLM(cfg).eval(), 0.3)
    hf_dir = path / "hf"
    ref.save_pretrained(hf_dir)
    (hf_dir / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return import_hf(hf_dir, path / "run")


def pair_tokenizer() -> PairTokenizer:
    return PairTokenizer(CharTokenizer(PAIRS_TEXT), CharTokenizer(PAIRS_TEXT))


def seq2seq_run(path: Path, norm_first: bool = False) -> Path:
    from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

    tok = pair_tokenizer()
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                        max_len=48, n_encoder_layers=2, n_decoder_layers=2, n_head=2, d_model=16,
                        dropout=0.0, norm_first=norm_first)  # fmt: skip
    model = perturb(Seq2SeqTransformer(cfg).eval())
    save_model(path, model, tok)
    return path


def rnn_run(path: Path, attention: str = "dot") -> Path:
    from attnlab.models.rnn import RNNConfig, RNNSeq2Seq

    tok = pair_tokenizer()
    torch.manual_seed(0)
    cfg = RNNConfig(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                    d_embed=8, d_hidden=16, attention=attention)  # fmt: skip
    save_model(path, RNNSeq2Seq(cfg).eval(), tok)
    return path


def vit_run(path: Path) -> Path:
    from attnlab.data.images import ImageTokenizer
    from attnlab.models.vit import ViT, ViTConfig

    torch.manual_seed(0)
    model = perturb(ViT(ViTConfig(image_size=8, patch_size=2, channels=1, n_classes=10,
                                  n_layer=2, n_head=2, d_model=16)).eval())  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)  # far from uniform, so rollout and gradients have something to show
    tok = ImageTokenizer("digits", [str(i) for i in range(10)], 8, 1, 0, 0.1)
    save_model(path, model, tok)
    return path
