"""Training a BERT-style encoder: masked-LM on a text, classification on ``label<TAB>text``.

Each task is an ``EncoderTask`` (a loss function, batch sources and evaluation figures) that
the shared ``attnlab.training.Trainer`` trains, as it trains a GPT or a ViT.

Tokenizers here always carry the five special tokens, at fixed ids
    [PAD]=0  [UNK]=1  [CLS]=2  [SEP]=3  [MASK]=4
and a post-processor that frames every text as ``[CLS] text [SEP]``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator
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
# Tasks: a loss function, batch sources and evaluation figures for ``attnlab.training.Trainer``
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class EncoderTask:
    """What the shared Trainer needs to train an encoder on one task.

    ``loss_fn(model, batch)`` calls the encoder's task head (``mlm_loss``, ``classify``), so the
    model it gets must be the Encoder itself (no DDP or ``torch.compile`` wrapper).
    ``eval_extras(val_loss)`` adds the task's figures to every evaluation.
    """

    loss_fn: Callable[[Encoder, tuple], Tensor]
    train_batches: Iterator[tuple[Tensor, ...]]
    val_batches: list[tuple[Tensor, ...]]
    eval_extras: Callable[[float], dict]
    n_train: int = 0
    n_val: int = 0
    classes: list[str] = dataclasses.field(default_factory=list)


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module):
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield next(model.parameters()).device
    finally:
        model.train(was)


def mlm_task(
    model: Encoder,
    tokenizer: Tokenizer,
    texts: list[str],
    val_fraction: float,
    batch_size: int,
    eval_iters: int,
    seed: int,
) -> EncoderTask:
    """Masked-LM on ``texts``: batches (inputs (B, T), labels (B, T)).

    The token stream (each line's ids, concatenated) is cut into windows of block_size - 2 and
    framed as [CLS] window [SEP]; the last ``val_fraction`` of the stream is held out, and
    ``eval_iters`` fixed batches of it are the validation set. ``val_loss`` is the mean
    cross-entropy over masked positions; the extras repeat it as ``val_mlm_loss`` and add
    ``val_masked_accuracy`` (argmax right at masked positions).
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

    def batch(source: Tensor, g: torch.Generator) -> tuple[Tensor, Tensor]:
        starts = torch.randint(len(source) - window, (batch_size,), generator=g)
        body = torch.stack([source[s : s + window] for s in starts.tolist()])  # (B, window)
        framed = torch.cat(
            [torch.full((batch_size, 1), cls_id), body, torch.full((batch_size, 1), sep_id)], 1
        )
        return mask_tokens(framed, mask_id, vocab, specials + [pad_id], generator=g)

    def train_batches() -> Iterator[tuple[Tensor, Tensor]]:
        g = torch.Generator().manual_seed(seed)
        while True:
            yield batch(train, g)

    g_val = torch.Generator().manual_seed(seed + 1)  # the same held-out batches every time
    val_batches = [batch(val, g_val) for _ in range(eval_iters)]

    def loss_fn(m: Encoder, b: tuple[Tensor, Tensor]) -> Tensor:
        return m.mlm_loss(*b)

    def eval_extras(val_loss: float) -> dict:
        right = total = 0
        with _eval_mode(model) as device:
            for inputs, labels in val_batches:
                logits = model.mlm_logits(inputs.to(device))  # (B, T, vocab)
                sel = labels.to(device) != IGNORE_INDEX
                right += int((logits.argmax(-1)[sel] == labels.to(device)[sel]).sum())
                total += int(sel.sum())
        return {"val_mlm_loss": val_loss, "val_masked_accuracy": right / max(1, total)}

    return EncoderTask(loss_fn, train_batches(), val_batches, eval_extras, len(train), len(val))


def classify_task(
    model: Encoder,
    tokenizer: Tokenizer,
    labels: list[str],
    texts: list[str],
    val_fraction: float,
    batch_size: int,
    seed: int,
) -> EncoderTask:
    """``label<TAB>text`` classification: batches (ids (B, T), attention_mask (B, T), y (B,)).

    Examples are shuffled with ``seed`` and the last ``val_fraction`` held out (at least one).
    The extras report accuracy on the whole held-out split (``val_accuracy``, ``val_correct``,
    ``val_examples``).
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

    def examples(idx: list[int]) -> tuple[Tensor, Tensor, Tensor]:
        ids, mask = pad_batch([seqs[i] for i in idx], pad_id)
        return ids, mask, y[idx]

    def train_batches() -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        g = torch.Generator().manual_seed(seed + 2)
        while True:
            pick = torch.randint(len(train_idx), (batch_size,), generator=g).tolist()
            yield examples([train_idx[i] for i in pick])

    val_batches = [examples(val_idx[lo : lo + 64]) for lo in range(0, len(val_idx), 64)]

    def loss_fn(m: Encoder, b: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        ids, mask, target = b
        return F.cross_entropy(m.classify(ids, mask).float(), target)  # (B, n_classes) logits

    def eval_extras(_val_loss: float) -> dict:
        right = 0
        with _eval_mode(model) as device:
            for ids, mask, target in val_batches:
                pred = model.classify(ids.to(device), mask.to(device)).argmax(-1).cpu()
                right += int((pred == target).sum())
        return {
            "val_accuracy": right / len(val_idx),
            "val_correct": right,
            "val_examples": len(val_idx),
        }

    return EncoderTask(
        loss_fn, train_batches(), val_batches, eval_extras, len(train_idx), len(val_idx), classes
    )


def _encode_plain(tokenizer: Tokenizer, texts: Iterable[str]) -> list[list[int]]:
    """Ids without [CLS]/[SEP] (masked-LM frames its own windows)."""
    texts = [t + "\n" for t in texts]
    if isinstance(tokenizer, HFTokenizer):
        return tokenizer.encode_batch(texts, add_special_tokens=False)
    return [tokenizer.encode(t) for t in texts]
