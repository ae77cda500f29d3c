"""attnlab: build, train and look inside transformers, one readable step at a time."""

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
from attnlab.checkpoint import load_run
from attnlab.hooks import ActivationCache, record
from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.rnn import RNNConfig, RNNSeq2Seq
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.models.vit import ViT, ViTConfig
from attnlab.tokenizers import CharTokenizer, WordTokenizer, load_tokenizer
from attnlab.training import TrainConfig, Trainer

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "RNNConfig",
    "RNNSeq2Seq",
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
