"""Sequence to sequence: an encoder-decoder (the Transformer, or an LSTM with or without
attention) learns to turn a source string into a target string.

    data    a generated task (copy, reverse, sort, addition, dates; ``reverse:max_len=40``) or a
            ``source<TAB>target`` file, split into train / val / test (see attnlab.data.tasks)
    batch   src (B, S) = x <eos>, tgt_in (B, T) = <bos> y, tgt_out (B, T) = y <eos>; <pad> fills
    loss    cross-entropy of model(src, tgt_in) (B, T, V) against tgt_out, <pad> ignored
            (label-smoothed if asked), in nats per target token
    figures val loss; exact match (the greedy decoding equals the target); token accuracy
            (teacher-forced argmax right, <eos> included)
    example a held-out source, the model's greedy translation, and the target
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.config import BaseConfig, ConfigError
from attnlab.data.batches import EpochBatches
from attnlab.data.tasks import (
    DEFAULTS,
    Seq2SeqData,
    collate,
    encode_pairs,
    load_data,
    read_tsv,
    rebuild,
)
from attnlab.generation import beam_search, greedy, pad_ids
from attnlab.heartbeat import count as count_done
from attnlab.metrics import Metric
from attnlab.models.declare import max_positions, model_for
from attnlab.models.rnn import RNNConfig
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.modes import evaluating
from attnlab.tasks.base import EvalOptions, Task, predict_options, register
from attnlab.tokenizers import (
    PAD,
    CharTokenizer,
    PairTokenizer,
    TokenizerError,
    build_tokenizer,
)

ARCHS = ("transformer", "lstm-attention", "lstm")
MAX_VAL = 1000  # held-out pairs decoded at each evaluation
EVAL_BATCH = 250


@dataclasses.dataclass
class Seq2SeqOptions(BaseConfig):
    data: str = ""
    encoding: str = "utf-8"
    arch: str = "transformer"  # transformer, lstm-attention, lstm
    tokenizer: str = "char"  # a TSV file's source and target tokenizers (char, word, bpe)
    src_tokenizer: str | None = None  # None: --tokenizer
    tgt_tokenizer: str | None = None
    vocab_size: int = 512
    min_freq: int = 1
    val_fraction: float = 0.1  # a TSV file: this much for validation, as much again for test
    n_layer: int | None = None  # transformer: 2 + 2 layers; LSTM: 1
    n_head: int | None = None  # transformer: 4
    d_model: int | None = None  # transformer: 128; LSTM: 256 hidden units
    dropout: float | None = None  # transformer: 0.1; LSTM: 0
    norm: str | None = None  # transformer: post (the paper) or pre
    pos: str | None = None  # transformer: sinusoidal only
    score: str = "dot"  # lstm-attention: dot, scaled-dot, general or additive
    attend_eos: bool | None = None  # lstm-attention: None = True, the attention may read <eos>
    label_smoothing: float = 0.0

    def validate(self) -> None:
        self._one_of("arch", ARCHS)
        for name in ("tokenizer", "src_tokenizer", "tgt_tokenizer"):
            if getattr(self, name) is not None:
                self._one_of(name, ("char", "word", "bpe"))
        self._positive("vocab_size", "min_freq")
        self._one_of("score", ("dot", "scaled-dot", "general", "additive"))
        if self.attend_eos is not None and self.arch != "lstm-attention":
            raise ConfigError("--attend-eos / --no-attend-eos apply to --arch lstm-attention only")
        self._fraction("label_smoothing")
        if self.arch != "transformer" and (self.n_head or self.norm or self.pos):
            raise ConfigError("--n-head, --norm and --pos apply to --arch transformer only")
        if self.pos and self.pos != "sinusoidal":
            raise ConfigError("the seq2seq Transformer uses sinusoidal positions")
        if self.norm is not None:
            self._one_of("norm", ("pre", "post"))
        self.model_config(8, 8, 16)  # sizes

    def model_config(self, src_vocab: int, tgt_vocab: int, max_len: int):
        """Transformer: 2+2 layers, 4 heads, d_model 128, post-norm, dropout 0.1. LSTM: 1 layer
        of 256 units (``d_model`` sets it), embeddings of half that, no dropout."""
        if self.arch == "transformer":
            return Seq2SeqConfig(
                src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab, max_len=max_len,
                n_encoder_layers=self.n_layer or 2, n_decoder_layers=self.n_layer or 2,
                n_head=self.n_head or 4, d_model=self.d_model or 128,
                dropout=0.1 if self.dropout is None else self.dropout,
                norm_first=self.norm == "pre", label_smoothing=self.label_smoothing,
            )  # fmt: skip
        hidden = self.d_model or 256
        return RNNConfig(
            src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab, d_embed=max(hidden // 2, 8),
            d_hidden=hidden, n_layer=self.n_layer or 1,
            attention=self.score if self.arch == "lstm-attention" else "none",
            attend_eos=self.attend_eos is not False, dropout=self.dropout or 0.0, label_smoothing=self.label_smoothing,
        )  # fmt: skip


def pair_tokenizer(data: Seq2SeqData, source: str = "char", target: str = "char",
                   vocab_size: int = 512, min_freq: int = 1) -> PairTokenizer:  # fmt: skip
    """Generated tasks: char tokenizers over the task's alphabet. A corpus: ``source`` and
    ``target`` kinds (char, word, bpe) built from the TRAIN split only (char gets <unk>)."""
    if data.alphabet is not None:
        return PairTokenizer(CharTokenizer(data.alphabet[0]), CharTokenizer(data.alphabet[1]))
    sources = "\n".join(s for s, _ in data.train)
    targets = "\n".join(t for _, t in data.train)
    return PairTokenizer(
        build_tokenizer(source, sources, vocab_size, min_freq, unk=True),
        build_tokenizer(target, targets, vocab_size, min_freq, unk=True),
    )


@torch.no_grad()
def score_pairs(model: nn.Module, tokenizer: PairTokenizer, pairs: list[tuple[str, str]],
                beam: int = 1, alpha: float = 0.6, batch_size: int = EVAL_BATCH) -> dict:  # fmt: skip
    """Exact match of the decoded outputs (greedy, or beam search if beam > 1), teacher-forced
    token accuracy (argmax of every target position given the true prefix, <eos> included),
    the mean cross-entropy ``loss``, over ``pairs``, and the decoded ``outputs`` (text)."""
    device = next(model.parameters()).device
    encoded = encode_pairs(tokenizer, pairs)
    exact = correct = total = 0
    loss_sum = 0.0
    decoded: list[str] = []
    with evaluating(model):
        for i in range(0, len(encoded), batch_size):
            chunk = encoded[i : i + batch_size]
            src, tgt_in, tgt_out = (t.to(device) for t in collate(chunk, tokenizer.BOS))
            logits = model(src, tgt_in)  # (B, T, V)
            keep = tgt_out != PAD
            correct += int(((logits.argmax(-1) == tgt_out) & keep).sum())
            total += int(keep.sum())
            loss_sum += float(F.cross_entropy(logits[keep].float(), tgt_out[keep], reduction="sum"))
            if beam == 1:
                outs = greedy(model, src)
            else:
                outs = [beam_search(model, pad_ids([s], device=device), beam, alpha)[0].tokens
                        for s, _ in chunk]  # fmt: skip
            exact += sum(o == t[: t.index(tokenizer.EOS)] for o, (_, t) in zip(outs, chunk))
            decoded += [tokenizer.decode_target(o) for o in outs]
            count_done(len(decoded), len(encoded), "pairs")  # a Heartbeat around this shows it
    n, tokens = max(len(encoded), 1), max(total, 1)
    return {"exact": exact / n, "token_acc": correct / tokens, "loss": loss_sum / tokens,
            "n": len(encoded), "outputs": decoded}  # fmt: skip


@register
class Seq2Seq(Task):
    name = "seq2seq"
    eval_reads = Task.eval_reads | {"encoding", "beam", "alpha"}
    order = 40
    label = "--task seq2seq"
    Options = Seq2SeqOptions
    unit = "pairs"
    loss_unit = "nats / target token"
    metrics = (
        Metric("val_exact", "exact match", "%", higher_is_better=True),
        Metric("val_token_acc", "token accuracy", "%", higher_is_better=True),
    )
    best = "val_exact"
    train_defaults = {"max_iters": 2000, "batch_size": 64, "lr": 2e-3, "weight_decay": 0.01}

    def __init__(self, options: Seq2SeqOptions, seed: int = 1337):
        super().__init__(options, seed)
        self.data: Seq2SeqData | None = None
        self._t0 = time.monotonic()

    @classmethod
    def self_attention(cls, options) -> bool:
        return options.arch == "transformer"

    @classmethod
    def defaults_for(cls, given: dict) -> dict:
        """The LSTMs learn dates more slowly than the Transformer: 3000 steps, not 2000."""
        arch = given.get("arch", "transformer") if isinstance(given, dict) else given.arch
        steps = {"max_iters": 3000} if arch in ("lstm", "lstm-attention") else {}
        return {**cls.train_defaults, **steps}

    @classmethod
    def default_out(cls, options) -> Path:
        spec = str(options.data)
        name = spec.partition(":")[0] if spec.partition(":")[0] in DEFAULTS else Path(spec).stem
        return Path("runs") / f"{name}-{options.arch}"

    # -- data ----------------------------------------------------------------------------------

    def prepare(self, run_dir):
        o = self.options
        self.data = load_data(o.data, self.seed, o.val_fraction, o.encoding)
        if self.tokenizer is None:  # else --init-from's, the run's own
            self.tokenizer = pair_tokenizer(self.data, o.src_tokenizer or o.tokenizer,
                                            o.tgt_tokenizer or o.tokenizer, o.vocab_size,
                                            o.min_freq)  # fmt: skip
        self._encode()

    def reload(self, run_dir, tokenizer, cfg):
        o = self.options
        recipe = cfg.get("data")
        self.data = rebuild(recipe) if recipe else load_data(o.data, self.seed, o.val_fraction, o.encoding)  # fmt: skip
        self.tokenizer = tokenizer
        self._encode()

    def _encode(self) -> None:
        d, tok = self.data, self.tokenizer
        self.train_set = encode_pairs(tok, d.train)
        self.val_pairs = d.val[:MAX_VAL]
        longest = max(max(len(tok.encode_source(s)), len(tok.encode_target(t)) + 1)
                      for split in (d.train, d.val, d.test) for s, t in split)  # fmt: skip
        self.max_len = max(256, 2 * longest + 16)

    def model_config(self):
        if self.init is not None:
            return self.init_model_config()
        tok = self.tokenizer
        return self.options.model_config(tok.src_vocab_size, tok.tgt_vocab_size, self.max_len)

    @classmethod
    def fine_tunes(cls, model_class: type) -> bool:
        """An encoder-decoder Transformer: attnlab's, or T5 imported from Hugging Face (an
        LSTM's shape comes from --arch, which a fine-tuned run cannot choose)."""
        return issubclass(model_class, Seq2SeqTransformer)

    def head_fields(self) -> dict:
        """The longest sequence this data needs, where it is past the run's ``max_len`` and
        its positions are computed (sinusoidal, or T5's relative ones), not learned."""
        have = self.init.config.get("max_len", self.max_len)
        if self.max_len <= have:
            return {}
        if self.init.config.get("pos", "sinusoidal") == "learned":
            raise ConfigError(f"{self.options.data}: needs {self.max_len} positions, past the "
                              f"{have} the run's learned position table holds")  # fmt: skip
        return {"max_len": self.max_len}

    def build_model(self) -> nn.Module:
        return model_for(self.model_config())  # the transformer's or the LSTM's config

    # -- training ------------------------------------------------------------------------------

    def train_batches(self, batch_size, seed, rank=0, world_size=1):
        def make(idx: list[int]):
            return collate([self.train_set[i] for i in idx], self.tokenizer.BOS)

        return EpochBatches(len(self.train_set), make, batch_size, seed, rank, world_size)

    val_whole = True  # its val_batches cover the held-out split

    def val_batches(self, batch_size, eval_iters):
        enc = encode_pairs(self.tokenizer, self.val_pairs)
        start = self.tokenizer.BOS
        return [collate(enc[i : i + EVAL_BATCH], start) for i in range(0, len(enc), EVAL_BATCH)]

    def loss(self, model, batch):
        src, tgt_in, tgt_out = batch
        logits = model(src, tgt_in)  # (B, T, V)
        flat = logits.reshape(-1, logits.size(-1)).float()
        eps = self.options.label_smoothing
        return F.cross_entropy(flat, tgt_out.reshape(-1), ignore_index=PAD, label_smoothing=eps)

    def evaluate(self, model, val_loss):
        r = score_pairs(model, self.tokenizer, self.val_pairs)
        return {"val_exact": r["exact"], "val_token_acc": r["token_acc"]}

    def example(self, model):
        src, tgt = self.val_pairs[0]
        out = self.predict(model, [src])[0]["output"]
        return f"{src!r} -> {out!r} (target {tgt!r})"

    # -- the run directory ---------------------------------------------------------------------

    @property
    def title(self) -> str:
        return f"seq2seq: {self.data.name if self.data else self.options.data}, {self.options.arch}"

    def run_config(self):
        return {**super().run_config(), "arch": self.options.arch,
                "data": self.data.recipe if self.data else None}  # fmt: skip

    def describe(self, model):
        n = sum(p.numel() for p in model.parameters())
        d = self.data
        return (
            f"seq2seq: {type(model).__name__} ({n:,} parameters) on {d.name}: "
            f"{len(d.train):,} train, {len(d.val):,} val, {len(d.test):,} test pairs"
        )

    def summary(self, result, final):
        ev = result.last_eval
        if "val_exact" not in ev:
            return f"trained {result.step} steps"
        return (
            f"{result.out_dir}: val exact match {ev['val_exact']:.1%}, token accuracy "
            f"{ev['val_token_acc']:.1%} (step {result.step}); test it with: "
            f"attnlab eval {result.out_dir}"
        )

    def predict(self, model, inputs, options=None, **given):
        """The translation of each source text: greedy (``beam`` = 1, batched) or the best of
        a beam search, with the ``top_k`` best beams and their length-normalised scores."""
        o = predict_options(options, given)
        device = next(model.parameters()).device
        srcs = [self.tokenizer.encode_source(t) for t in inputs]
        limit = max_positions(model)  # a Transformer's max_len; an LSTM: none
        for t, s in zip(inputs, srcs):
            if limit and len(s) > limit:
                raise TokenizerError(f"source of {len(s)} tokens is longer than the model's "
                                     f"{limit} positions: {t[:40]!r}")  # fmt: skip
        if o.beam == 1:
            outs = greedy(model, pad_ids(srcs, device=device), o.max_len)
            return [{"input": t, "output": self.tokenizer.decode_target(ids), "beam": 1}
                    for t, ids in zip(inputs, outs)]  # fmt: skip
        out = []
        for t, s in zip(inputs, srcs):
            hyps = beam_search(model, pad_ids([s], device=device), o.beam, o.alpha, o.max_len)
            beams = [{"output": self.tokenizer.decode_target(h.tokens), "score": h.score,
                      "logprob": h.logprob, "finished": h.finished} for h in hyps[: o.top_k]]  # fmt: skip
            out.append({"input": t, "output": beams[0]["output"], "beam": o.beam, "beams": beams})
        return out

    def predict_recorded(self, model, rec, options):
        """The greedy translation the recording decoded (and then ran teacher-forced): the
        same greedy decoder ``predict`` runs, at its default length; a beam search, or another
        ``max_len``, is predict's own."""
        if options.beam != 1 or options.max_len is not None or "translation" not in rec.extra:
            return None
        return {"input": rec.text, "output": rec.extra["translation"], "beam": 1}

    def prediction_lines(self, pred):
        lines = [f"{pred['input']!r} -> {pred['output']!r}"]
        if pred["output"] == "":  # '' alone reads like a failure of the tool
            lines.append("  (no text: the decoder wrote only special tokens (padding, end) "
                         "before it stopped, as an untrained or random model does; `attnlab "
                         "trace RUN TEXT` shows what it predicts at each step)")  # fmt: skip
        for n, b in enumerate(pred.get("beams", [])[1:], 2):
            lines.append(f"  beam #{n}: {b['output']!r}  (score {b['score']:.3f})")
        return lines

    # -- eval ----------------------------------------------------------------------------------

    splits = ("test", "val", "train")

    def score(self, model, options=None):
        """Exact match, token accuracy, loss, and corpus BLEU and chrF of the decoded outputs
        (greedy, or beam search) on the run's test split or a ``source<TAB>target`` file."""
        from attnlab.evaluation import Evaluation, Figure
        from attnlab.metrics import bleu, chrf

        o = options or EvalOptions()
        if o.data is not None:
            pairs, where = read_tsv(o.data, o.encoding), str(o.data)
        else:
            split = self.check_split(o)
            pairs, where = self.data.split(split), f"the {split} split of {self.data.name}"
        if o.limit:
            pairs = pairs[: o.limit]
        r = score_pairs(model, self.tokenizer, pairs, beam=o.beam, alpha=o.alpha)
        refs = [self.tokenizer.decode_target(self.tokenizer.encode_target(t)) for _, t in pairs]
        b = bleu(r["outputs"], refs)
        figures = [
            Figure("exact_match", "exact match", r["exact"], "%"),
            Figure("token_accuracy", "token accuracy", r["token_acc"], "%"),
            Figure("bleu", "BLEU", b["bleu"], "/100"),
            Figure("chrf", "chrF", chrf(r["outputs"], refs), "/100"),
            Figure("loss", "loss", r["loss"], "nats/target token"),
            Figure("pairs", "pairs", r["n"], "count"),
        ]
        wrong = [{"source": s, "output": h, "target": t}
                 for (s, t), h, ref in zip(pairs, r["outputs"], refs) if h != ref][:3]  # fmt: skip
        decoding = "greedy" if o.beam == 1 else f"beam {o.beam}"
        return Evaluation(self.name, f"{where}: {r['n']} pairs, {decoding}", figures,
                          mistakes=wrong)  # fmt: skip
