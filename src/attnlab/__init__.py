"""attnlab: build, train and look inside transformers, one readable step at a time."""

from typing import TYPE_CHECKING

# What `from attnlab import X` gives, and the module it comes from. They are imported on
# first use (PEP 562), so `import attnlab` does not import torch: the command line can then
# take over Ctrl-C before the slow imports start (see attnlab.cli.main).
_EXPORTS = {
    "KVCache": "attnlab.attention",
    "MultiHeadAttention": "attnlab.attention",
    "causal_mask": "attnlab.attention",
    "combine_masks": "attnlab.attention",
    "from_hf_attention_mask": "attnlab.attention",
    "from_torch_key_padding_mask": "attnlab.attention",
    "from_torch_mha_mask": "attnlab.attention",
    "padding_mask": "attnlab.attention",
    "scaled_dot_product_attention": "attnlab.attention",
    "load_run": "attnlab.run",
    "Run": "attnlab.run",
    "ActivationCache": "attnlab.hooks",
    "record": "attnlab.hooks",
    "Encoder": "attnlab.models.encoder",
    "EncoderConfig": "attnlab.models.encoder",
    "GPT": "attnlab.models.gpt",
    "GPTConfig": "attnlab.models.gpt",
    "RNNConfig": "attnlab.models.rnn",
    "RNNSeq2Seq": "attnlab.models.rnn",
    "Seq2SeqConfig": "attnlab.models.seq2seq",
    "Seq2SeqTransformer": "attnlab.models.seq2seq",
    "ViT": "attnlab.models.vit",
    "ViTConfig": "attnlab.models.vit",
    "CharTokenizer": "attnlab.tokenizers",
    "WordTokenizer": "attnlab.tokenizers",
    "load_tokenizer": "attnlab.tokenizers",
    "TrainConfig": "attnlab.training",
    "Trainer": "attnlab.training",
}

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "RNNConfig",
    "RNNSeq2Seq",
    "Run",
    "Seq2SeqConfig",
    "Seq2SeqTransformer",
    "TrainConfig",
    "Trainer",
    "ViT",
    "ViTConfig",
    "ActivationCache",
    "CharTokenizer",
    "Encoder",
    "EncoderConfig",
    "GPTConfig",
    "KVCache",
    "MultiHeadAttention",
    "WordTokenizer",
    "causal_mask",
    "combine_masks",
    "from_hf_attention_mask",
    "from_torch_key_padding_mask",
    "from_torch_mha_mask",
    "load_run",
    "load_tokenizer",
    "padding_mask",
    "record",
    "scaled_dot_product_attention",
]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'attnlab' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # what editors and type checkers see
    from attnlab.attention import (
        KVCache,
        MultiHeadAttention,
        causal_mask,
        combine_masks,
        from_hf_attention_mask,
        from_torch_key_padding_mask,
        from_torch_mha_mask,
        padding_mask,
        scaled_dot_product_attention,
    )
    from attnlab.hooks import ActivationCache, record
    from attnlab.models.encoder import Encoder, EncoderConfig
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.models.rnn import RNNConfig, RNNSeq2Seq
    from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
    from attnlab.models.vit import ViT, ViTConfig
    from attnlab.run import Run, load_run
    from attnlab.tokenizers import CharTokenizer, WordTokenizer, load_tokenizer
    from attnlab.training import TrainConfig, Trainer
