"""Sentence embeddings from an encoder: one vector per text.

    mean  e = sum_t m_t h_t / sum_t m_t     the real tokens' last hidden states h_t (B, T, C),
                                            [CLS] and [SEP] included, padding (m_t = 0) excluded
    cls   e = h_0                           the first token's state
Optionally scaled to unit length (cosine similarity is then a dot product).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.data.batches import pad_batch
from attnlab.models.encoder import Encoder
from attnlab.tokenizers import Tokenizer, TokenizerError


@torch.no_grad()
def sentence_embeddings(
    model: Encoder,
    tokenizer: Tokenizer,
    texts: list[str],
    pool: str = "mean",
    normalize: bool = False,
) -> Tensor:
    """(len(texts), C): mean of each text's token states (padding excluded), or its [CLS] state."""
    seqs = [tokenizer.encode(t) for t in texts]
    limit = model.config.block_size
    for t, s in zip(texts, seqs):
        if len(s) > limit:
            raise TokenizerError(
                f"text of {len(s)} tokens is longer than the model's {limit}: {t[:40]!r}"
            )
    pad = getattr(tokenizer, "special_tokens", {}).get("[PAD]", model.config.pad_id)
    ids, mask = pad_batch(seqs, pad)
    device = next(model.parameters()).device
    emb = model.embed(ids.to(device), mask.to(device), pool=pool)  # (B, C)
    return F.normalize(emb, dim=-1) if normalize else emb
