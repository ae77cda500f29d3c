"""Every kind of run attnlab has, tiny, made once per module through the real CLI's code: what
the acceptance tests that go over every verb on every kind share.

Kinds: a GPT with a char and with a BPE tokenizer, the attention-only induction GPT (with
snapshots), a masked LM, a text classifier, the BiLSTM classifier, the Transformer
encoder-decoder, the LSTM with and without attention, a ViT, and imported weights: a BERT and a
GPT-2 (built here from a transformers config), a random T5, and all-MiniLM-L6-v2 (an encoder
with no head, when `attnlab[models]` is installed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from task_helpers import train_args, write_task_data

os.environ.setdefault("HF_HUB_OFFLINE", "1")

BERT_WORDS = ["the", "bank", "of", "river", "day", "good", "water", "a", "is"]
EVERY_KIND = ["gpt", "gpt-bpe", "mlm", "classify", "transformer", "lstm-attention", "lstm",
              "vit", "bert", "gpt2", "minilm"]  # fmt: skip
MORE_KINDS = ["induction", "lstm-classifier", "t5"]
INPUT = {"gpt": "First Citizen", "gpt-bpe": "First Citizen", "mlm": "Speak, [MASK]peak.",
         "classify": "the day was good indeed", "transformer": "abcd", "lstm-attention": "abcd",
         "lstm": "abcd", "vit": "test:0", "bert": "the [MASK] of the river",
         "gpt2": "First Citizen", "minilm": "the bank of the river", "induction": "0123012301",
         "lstm-classifier": "the day was good indeed", "t5": "the cat sat on the mat"}  # fmt: skip


def bert_dir(d: Path) -> Path:
    """A tiny random BertForMaskedLM with a WordPiece vocab.txt, as Hugging Face writes one."""
    transformers = pytest.importorskip("transformers")
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *BERT_WORDS, *letters,
             *("##" + c for c in letters)]  # fmt: skip
    cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=32)  # fmt: skip
    transformers.BertForMaskedLM(cfg).save_pretrained(d)
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return d


def t5_dir(d: Path) -> Path:
    """A tiny random T5ForConditionalGeneration with a SentencePiece-style tokenizer.json."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    pieces = ["▁the", "▁a", "▁cat", "▁dog", "▁sat", "▁on", "▁mat", "s", "▁",
              *"abcdefghijklmnopqrstuvwxyz"]  # fmt: skip
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(p, -1.0 - 0.1 * i) for i, p in enumerate(pieces)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>",
                                                       special_tokens=[("</s>", 1)])  # fmt: skip
    tok.add_special_tokens(["<pad>", "</s>", "<unk>"])
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=len(vocab), relative_attention_num_buckets=8,
                                relative_attention_max_distance=12, dropout_rate=0.0,
                                decoder_start_token_id=0, num_layers=2, num_decoder_layers=2,
                                num_heads=2, d_model=16, d_kv=8, d_ff=32,
                                feed_forward_proj="relu")  # fmt: skip
    transformers.T5ForConditionalGeneration(cfg).save_pretrained(d)
    (d / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    return d


def make_runs(d: Path, kinds: list[str], steps: int = 20) -> dict:
    """kind -> its run directory under ``d`` (a kind that cannot be made here, MiniLM without
    its package, is left out); "_data" -> the directory of the data files."""
    from attnlab.cli import main

    write_task_data(d)
    (d / "river.txt").write_text("\n".join(" ".join(BERT_WORDS[i:] + BERT_WORDS[:i])
                                           for i in range(9)) * 4, encoding="utf-8")  # fmt: skip
    out: dict = {"_data": d}
    n = ["--max-iters", str(steps)]
    trained = {
        "gpt": ("lm", []),
        "gpt-bpe": ("lm", ["--tokenizer", "bpe", "--vocab-size", "300"]),
        "mlm": ("mlm", []),
        "classify": ("classify", []),
        "transformer": ("transformer", []),
        "lstm-attention": ("lstm-attention", []),
        "lstm": ("lstm-attention", ["--arch", "lstm"]),
        "vit": ("vit", []),
        "induction": ("induction", ["--snapshot-every", str(max(1, steps // 2))]),
    }
    for kind in kinds:
        if kind in trained:
            task, more = trained[kind]
            assert main(train_args(task, d, d / kind, *n, *more)) == 0, kind
            out[kind] = d / kind
    if "lstm-classifier" in kinds:
        assert main(["train", "--task", "classify", "--data", str(d / "labels.tsv"), "--out",
                     str(d / "lstm-classifier"), "--arch", "lstm-attention", "--tokenizer",
                     "word", "--d-model", "16", "--batch-size", "4", "--eval-iters", "2",
                     "--quiet", *n]) == 0  # fmt: skip
        out["lstm-classifier"] = d / "lstm-classifier"
    if "bert" in kinds:
        assert main(["import-hf", str(bert_dir(d / "hf-bert")), "--out", str(d / "bert")]) == 0
        out["bert"] = d / "bert"
    if "gpt2" in kinds:
        made = out.get("gpt-bpe") or d / "gpt-bpe"  # made by this call or an earlier one
        if not made.is_dir():
            make_runs(d, ["gpt-bpe"], steps)
        assert main(["export-hf", str(made), str(d / "hf-gpt2")]) == 0  # GPT-2 style
        assert main(["import-hf", str(d / "hf-gpt2"), "--out", str(d / "gpt2")]) == 0
        out["gpt2"] = d / "gpt2"
    if "t5" in kinds:
        assert main(["import-hf", str(t5_dir(d / "hf-t5")), "--out", str(d / "t5")]) == 0
        out["t5"] = d / "t5"
    if "minilm" in kinds and main(["import-hf", "minilm", "--out", str(d / "minilm")]) == 0:
        out["minilm"] = d / "minilm"
    return out


class Runs:
    """``make_runs`` one kind at a time, each made the first time a test asks for it
    (``runs[kind]``, ``kind in runs``): an xdist worker given two of a module's kinds makes
    two runs, not every kind's."""

    def __init__(self, d: Path, steps: int = 20):
        self.d, self.steps, self.made = d, steps, {}

    def __contains__(self, kind: str) -> bool:
        if kind not in self.made:
            self.made.update(make_runs(self.d, [kind], self.steps))
            self.made.setdefault(kind, None)  # could not be made here (MiniLM without its package)
        return self.made[kind] is not None

    def __getitem__(self, kind: str) -> Path:
        if kind == "_data":
            if not (self.d / "river.txt").is_file():
                make_runs(self.d, [], self.steps)
            return self.d
        if kind not in self:
            raise KeyError(kind)
        return self.made[kind]
