"""Training a BERT-style encoder: masked-LM on a text, classification on ``label<TAB>text``.

The loop is deliberately small (AdamW, linear warm-up then cosine decay, gradient clipping,
periodic evaluation) so that it can later move onto the shared Trainer: a task supplies
``batch() -> loss`` and ``evaluate() -> metrics`` and the loop does the rest.

Tokenizers here always carry the five special tokens, at fixed ids
    [PAD]=0  [UNK]=1  [CLS]=2  [SEP]=3  [MASK]=4
and a post-processor that frames every text as ``[CLS] text [SEP]``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.models.encoder import IGNORE_INDEX, SPECIAL_TOKENS, Encoder, mask_tokens
from attnlab.tokenizers import HFTokenizer, Tokenizer, TokenizerError

TOKENIZER_KINDS = ("char", "word", "bpe", "wordpiece")


class TaskDataError(ValueError):
    """Training data that cannot be used (empty, malformed line, one class only)."""


# ---------------------------------------------------------------------------------------------
# Tokenizers with special tokens
# ---------------------------------------------------------------------------------------------


def build_encoder_tokenizer(kind: str, texts: list[str], vocab_size: int = 512) -> HFTokenizer:
    """A ``char``, ``word``, byte-level ``bpe`` or ``wordpiece`` tokenizer trained on ``texts``,
    with [PAD] [UNK] [CLS] [SEP] [MASK] at ids 0-4 and ``[CLS] $A [SEP]`` framing."""
    from tokenizers import Tokenizer as HFTok
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

    specials = list(SPECIAL_TOKENS)
    if kind == "char":  # BPE with no merges splits text into single characters
        chars = sorted((set("".join(texts)) | {"\n"}) - set(specials))
        vocab = {t: i for i, t in enumerate(specials + chars)}
        tok = HFTok(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
        tok.decoder = decoders.Fuse()
    elif kind == "word":
        tok = HFTok(models.WordLevel(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()  # \w+ | [^\w\s]+
        trainer = trainers.WordLevelTrainer(special_tokens=specials, show_progress=False)
        tok.train_from_iterator(texts, trainer=trainer)
    elif kind == "bpe":
        tok = HFTok(models.BPE(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tok.train_from_iterator(texts, trainer=trainer)
    elif kind == "wordpiece":
        tok = HFTok(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=False)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=specials, show_progress=False
        )
        tok.train_from_iterator(texts, trainer=trainer)
    else:
        raise TokenizerError(f"unknown tokenizer {kind!r}; choose {', '.join(TOKENIZER_KINDS)}")
    tok.add_special_tokens(specials)
    ids = {t: tok.token_to_id(t) for t in specials}
    assert [ids[t] for t in specials] == list(range(len(specials))), ids
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    return HFTokenizer(tok)


def special_id(tokenizer: Tokenizer, name: str) -> int:
    ids = getattr(tokenizer, "special_tokens", {})
    if name not in ids:
        raise TokenizerError(
            f"the tokenizer has no {name} token (encoder tasks need {' '.join(SPECIAL_TOKENS)})"
        )
    return ids[name]


# ---------------------------------------------------------------------------------------------
# Batching and sentence embeddings
# ---------------------------------------------------------------------------------------------


def pad_batch(seqs: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-pad id lists into (ids (B, T), attention_mask (B, T)), mask 1 = real token."""
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


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


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def read_texts(path: str | Path, encoding: str = "utf-8") -> list[str]:
    """The lines of a text file, or of every .txt file in a directory (sorted)."""
    from attnlab.data import open_corpus

    path = Path(path)
    if not path.exists():
        raise TaskDataError(f"{path}: no such file or directory")
    corpus = open_corpus(path, encoding)  # binary, undecodable, empty: a DataError naming it
    lines = [ln for ln in corpus.read().splitlines() if ln.strip()]
    if not lines:
        raise TaskDataError(f"{path}: no text")
    return lines


def read_labelled(path: str | Path, encoding: str = "utf-8") -> tuple[list[str], list[str]]:
    """(labels, texts) from ``label<TAB>text`` lines; blank lines are skipped."""
    from attnlab.data import open_corpus

    path = Path(path)
    if not path.exists():
        raise TaskDataError(f"{path}: no such file or directory")
    if not path.is_file():
        raise TaskDataError(f"{path}: is a directory; expected one label<TAB>text file")
    text = open_corpus(path, encoding).read()  # binary, undecodable, empty: a DataError
    labels, texts = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        label, tab, text = line.partition("\t")
        if not tab or not label.strip() or not text.strip():
            raise TaskDataError(f"{path}:{n}: expected 'label<TAB>text'")
        labels.append(label.strip())
        texts.append(text)
    if len(set(labels)) < 2:
        raise TaskDataError(
            f"{path}: classification needs at least two labels, found {len(set(labels))}"
        )
    return labels, texts


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class LoopSettings:
    max_iters: int = 2000
    batch_size: int = 12
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_iters: int = 100
    lr_decay_iters: int | None = None
    weight_decay: float = 0.1
    beta2: float = 0.99
    grad_clip: float = 1.0
    eval_interval: int = 250
    log_interval: int = 10
    quiet: bool = False


def lr_at(it: int, s: LoopSettings) -> float:
    """Linear warm-up to ``lr`` over ``warmup_iters``, then cosine decay to ``min_lr``."""
    if it < s.warmup_iters:
        return s.lr * (it + 1) / s.warmup_iters
    decay = s.lr_decay_iters or s.max_iters
    if it >= decay:
        return s.min_lr
    ratio = (it - s.warmup_iters) / max(1, decay - s.warmup_iters)
    return s.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (s.lr - s.min_lr)


def make_optimizer(model: torch.nn.Module, s: LoopSettings) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not biases, LayerNorms)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": s.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=s.lr, betas=(0.9, s.beta2))


def train_loop(
    model: torch.nn.Module,
    batch_loss: Callable[[], Tensor],
    evaluate: Callable[[], dict],
    s: LoopSettings,
    log: Callable[[str], None] | None = None,
) -> list[dict]:
    """Run ``s.max_iters`` optimiser steps; returns the evaluation records (the last is final)."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    opt = make_optimizer(model, s)
    history: list[dict] = []
    t0 = time.time()
    for it in range(s.max_iters):
        for group in opt.param_groups:
            group["lr"] = lr_at(it, s)
        model.train()
        loss = batch_loss()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if s.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        if not s.quiet and (it % s.log_interval == 0 or it == s.max_iters - 1):
            log(
                f"iter {it + 1}/{s.max_iters}  loss {loss.item():.4f}  lr {lr_at(it, s):.2e}  "
                f"{time.time() - t0:.1f}s"
            )
        last = it == s.max_iters - 1
        if last or (s.eval_interval and (it + 1) % s.eval_interval == 0):
            model.eval()
            with torch.no_grad():
                record = {"iter": it + 1, **evaluate()}
            history.append(record)
            if not s.quiet:
                log(
                    "eval  "
                    + "  ".join(
                        f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in record.items()
                    )
                )
    model.eval()
    return history


# ---------------------------------------------------------------------------------------------
# Tasks
# ---------------------------------------------------------------------------------------------


def mlm_task(
    model: Encoder,
    tokenizer: Tokenizer,
    texts: list[str],
    val_fraction: float,
    batch_size: int,
    eval_iters: int,
    seed: int,
    device="cpu",
):
    """(batch_loss, evaluate) for masked-LM on ``texts``.

    The token stream (each line's ids, concatenated) is cut into windows of block_size - 2 and
    framed as [CLS] window [SEP]; the last ``val_fraction`` of the stream is held out.
    """
    ids = [i for seq in _encode_plain(tokenizer, texts) for i in seq]
    window = model.config.block_size - 2
    n_val = max(window + 1, int(len(ids) * val_fraction))
    if len(ids) < n_val + window + 1:
        raise TaskDataError(
            f"the text is only {len(ids)} tokens; masked-LM with block_size "
            f"{model.config.block_size} needs at least {n_val + window + 1}"
        )
    stream = torch.tensor(ids, dtype=torch.long)
    train, val = stream[:-n_val], stream[-n_val:]
    cls_id, sep_id = special_id(tokenizer, "[CLS]"), special_id(tokenizer, "[SEP]")
    mask_id, pad_id = special_id(tokenizer, "[MASK]"), special_id(tokenizer, "[PAD]")
    specials = sorted(set(getattr(tokenizer, "special_tokens", {}).values()))
    vocab = model.config.vocab_size
    g_train = torch.Generator().manual_seed(seed)

    def batch(source: Tensor, g: torch.Generator) -> tuple[Tensor, Tensor]:
        starts = torch.randint(len(source) - window, (batch_size,), generator=g)
        body = torch.stack([source[s : s + window] for s in starts.tolist()])  # (B, window)
        framed = torch.cat(
            [torch.full((batch_size, 1), cls_id), body, torch.full((batch_size, 1), sep_id)], 1
        )
        inputs, labels = mask_tokens(framed, mask_id, vocab, specials + [pad_id], generator=g)
        return inputs.to(device), labels.to(device)

    def batch_loss() -> Tensor:
        inputs, labels = batch(train, g_train)
        return model.mlm_loss(inputs, labels)

    def evaluate() -> dict:
        g = torch.Generator().manual_seed(seed + 1)  # the same held-out batches every time
        losses, right, total = [], 0, 0
        for _ in range(eval_iters):
            inputs, labels = batch(val, g)
            logits = model.mlm_logits(inputs)
            sel = labels != IGNORE_INDEX
            losses.append(
                F.cross_entropy(logits[sel].float(), labels[sel]).item() if sel.any() else 0.0
            )
            right += int((logits.argmax(-1)[sel] == labels[sel]).sum())
            total += int(sel.sum())
        return {
            "val_mlm_loss": sum(losses) / len(losses),
            "val_masked_accuracy": right / max(1, total),
        }

    return batch_loss, evaluate


def classify_task(
    model: Encoder,
    tokenizer: Tokenizer,
    labels: list[str],
    texts: list[str],
    val_fraction: float,
    batch_size: int,
    seed: int,
    device="cpu",
):
    """(batch_loss, evaluate, classes, n_train, n_val) for ``label<TAB>text`` classification.

    Examples are shuffled with ``seed`` and the last ``val_fraction`` held out (at least one).
    Evaluation reports accuracy on the whole held-out split.
    """
    classes = sorted(set(labels))
    y = torch.tensor([classes.index(lab) for lab in labels])
    limit = model.config.block_size
    sep_id, pad_id = special_id(tokenizer, "[SEP]"), special_id(tokenizer, "[PAD]")
    seqs = [
        s if len(s) <= limit else s[: limit - 1] + [sep_id]
        for s in (tokenizer.encode(t) for t in texts)
    ]
    order = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = min(len(seqs) - 1, max(1, round(len(seqs) * val_fraction)))
    val_idx, train_idx = order[:n_val], order[n_val:]
    g_train = torch.Generator().manual_seed(seed + 2)

    def batch_loss() -> Tensor:
        pick = torch.randint(len(train_idx), (batch_size,), generator=g_train).tolist()
        ids, mask = pad_batch([seqs[train_idx[i]] for i in pick], pad_id)
        logits = model.classify(ids.to(device), mask.to(device))  # (B, n_classes)
        return F.cross_entropy(logits.float(), y[[train_idx[i] for i in pick]].to(device))

    def evaluate() -> dict:
        right = 0
        for lo in range(0, len(val_idx), 64):
            chunk = val_idx[lo : lo + 64]
            ids, mask = pad_batch([seqs[i] for i in chunk], pad_id)
            pred = model.classify(ids.to(device), mask.to(device)).argmax(-1).cpu()
            right += int((pred == y[chunk]).sum())
        return {
            "val_accuracy": right / len(val_idx),
            "val_correct": right,
            "val_examples": len(val_idx),
        }

    return batch_loss, evaluate, classes, len(train_idx), len(val_idx)


def _encode_plain(tokenizer: Tokenizer, texts: Iterable[str]) -> list[list[int]]:
    """Ids without [CLS]/[SEP] (masked-LM frames its own windows)."""
    texts = [t + "\n" for t in texts]
    if isinstance(tokenizer, HFTokenizer):
        return tokenizer.encode_batch(texts, add_special_tokens=False)
    return [tokenizer.encode(t) for t in texts]
