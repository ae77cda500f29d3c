"""Masked language modelling: a BERT-style encoder learns to fill in hidden tokens.

    data    the lines of a text file (or of every .txt file in a directory); the token stream
            (each line's ids, concatenated) is cut into windows of block_size - 2, framed as
            [CLS] window [SEP]; the last ``val_fraction`` of the stream is held out
    batch   BERT's masking: 15% of the tokens are chosen; of those 80% become [MASK], 10% a
            random token, 10% stay. inputs (B, T), labels (B, T) (-100 where not chosen)
    loss    mean cross-entropy at the chosen positions, in nats per masked token
    figures val loss, masked accuracy (argmax right at the chosen positions)
    example a few held-out masked tokens and what the model puts there

``EncoderOptions`` (the data, tokenizer and encoder sizes) is shared with text classification.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab import data
from attnlab.config import BaseConfig, ConfigError
from attnlab.data import corpus as corpora
from attnlab.data.batches import RandomBatches
from attnlab.metrics import Metric
from attnlab.models.encoder import (
    ENCODER_PRESETS,
    IGNORE_INDEX,
    Encoder,
    EncoderConfig,
    mask_tokens,
)
from attnlab.tasks.base import EvalOptions, Task, on, predict_options, register
from attnlab.tokenizers import ENCODER_SPECIALS, TokenizerError, build_tokenizer, special_id

MODEL_OPTIONS = ("n_layer", "n_head", "d_model", "block_size", "dropout", "pos")


@dataclasses.dataclass
class EncoderOptions(BaseConfig):
    data: str = ""
    encoding: str = "utf-8"
    tokenizer: str = "char"  # char, word, bpe or wordpiece, with [CLS] [SEP] [MASK] ...
    vocab_size: int = 512  # bpe, wordpiece
    val_fraction: float = 0.1
    preset: str = "baby"  # sizes: attnlab.models.encoder.ENCODER_PRESETS
    n_layer: int | None = None  # None: the preset's
    n_head: int | None = None
    d_model: int | None = None
    block_size: int | None = None
    dropout: float | None = None  # None: the config's (0.1)
    pos: str | None = None  # learned or sinusoidal
    norm: str | None = None  # post (BERT) or pre

    def validate(self) -> None:
        self._one_of("tokenizer", ("char", "word", "bpe", "wordpiece"))
        self._positive("vocab_size")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction must be between 0 and 1, got {self.val_fraction}")
        if self.pos == "rotary":
            raise ConfigError("--pos rotary is not available for the encoder (learned or sinusoidal)")  # fmt: skip
        self.model_config(vocab_size=len(ENCODER_SPECIALS) + 1)

    def model_config(self, vocab_size: int, **heads) -> EncoderConfig:
        if self.preset not in ENCODER_PRESETS:
            raise ConfigError(
                f"--preset {self.preset!r} is not an encoder preset; "
                f"choose {', '.join(ENCODER_PRESETS)}"
            )
        fields = dict(ENCODER_PRESETS[self.preset])
        fields.update({k: getattr(self, k) for k in MODEL_OPTIONS if getattr(self, k) is not None})
        if self.norm is not None:
            self._one_of("norm", ("pre", "post"))
            fields["norm_first"] = self.norm == "pre"
        return EncoderConfig(vocab_size=vocab_size, pad_id=0, **fields, **heads)


def read_texts(path: str | Path, encoding: str = "utf-8") -> tuple[list[str], data.Corpus]:
    """The non-blank lines of a text file, or of every .txt file in a directory (sorted)."""
    corpus = data.open_corpus(path, encoding)  # missing, binary, undecodable, empty: DataError
    lines = [ln for ln in corpus.read().splitlines() if ln.strip()]
    if not lines:
        raise data.DataError(f"{path}: no text")
    return lines, corpus


def check_fingerprint(corpus: data.Corpus, cfg: dict) -> None:
    """The data of a resumed run must be the bytes it was trained on."""
    if cfg.get("data_sha256") and data.fingerprint(corpus.files) != cfg["data_sha256"]:
        raise data.DataError(
            f"{', '.join(map(str, corpus.files[:2]))}: changed since the run began (SHA-256 "
            "differs), so --resume cannot continue exactly; start a new run"
        )


@register
class MaskedLM(Task):
    name = "mlm"
    eval_reads = Task.eval_reads | {"encoding", "batch_size"}
    order = 20
    label = "--task mlm"
    Options = EncoderOptions
    unit = "tokens"
    loss_unit = "nats / masked token"
    metrics = (Metric("val_masked_accuracy", "masked accuracy", "%", higher_is_better=True),)
    best = "val_loss"

    def __init__(self, options: EncoderOptions, seed: int = 1337):
        super().__init__(options, seed)
        self.train_ids = self.val_ids = None
        self.sha256 = None
        self._val: list = []  # the validation batches the Trainer asked for

    # -- data ----------------------------------------------------------------------------------

    def prepare(self, run_dir):
        o = self.options
        texts, corpus = read_texts(o.data, o.encoding)
        if self.tokenizer is None:  # else --init-from's, the run's own
            self.tokenizer = build_tokenizer(o.tokenizer, texts, o.vocab_size, encoder=True)
        self._split(texts)
        self.sha256 = data.fingerprint(corpus.files)

    def reload(self, run_dir, tokenizer, cfg):
        texts, corpus = read_texts(corpora.recorded(cfg, self.options.data), self.options.encoding)
        check_fingerprint(corpus, cfg)
        self.tokenizer, self.sha256 = tokenizer, cfg.get("data_sha256")
        self._split(texts)

    @property
    def window(self) -> int:
        return self.options.model_config(len(ENCODER_SPECIALS) + 1).block_size - 2

    def _split(self, texts: list[str]) -> None:
        tok = self.tokenizer
        seqs = tok.encode_batch([t + "\n" for t in texts], add_special_tokens=False)
        ids = torch.tensor([i for s in seqs for i in s], dtype=torch.long)
        w = self.window
        n_val = max(w + 1, int(len(ids) * self.options.val_fraction))
        if len(ids) < n_val + w + 1:
            raise data.DataError(
                f"{self.options.data}: the text is only {len(ids)} tokens; masked-LM with "
                f"block_size {w + 2} needs at least {n_val + w + 1}"
            )
        self.train_ids, self.val_ids = ids[:-n_val], ids[-n_val:]

    def _maker(self, source: torch.Tensor):
        """make(n, generator) -> (inputs (n, T), labels (n, T)): n framed windows, masked."""
        tok, w = self.tokenizer, self.window
        cls_id, sep_id = special_id(tok, "[CLS]"), special_id(tok, "[SEP]")
        mask_id, pad_id = special_id(tok, "[MASK]"), special_id(tok, "[PAD]")
        specials = sorted(set(tok.special_tokens.values()) | {pad_id})
        vocab = tok.vocab_size

        def make(n: int, g: torch.Generator):
            starts = torch.randint(len(source) - w, (n,), generator=g)
            body = torch.stack([source[s : s + w] for s in starts.tolist()])  # (n, w)
            framed = torch.cat([torch.full((n, 1), cls_id), body, torch.full((n, 1), sep_id)], 1)
            return mask_tokens(framed, mask_id, vocab, specials, generator=g)

        return make

    def model_config(self):
        if self.init is not None:
            return self.init_model_config()
        return self.options.model_config(self.tokenizer.vocab_size, mlm_head=True)

    @classmethod
    def fine_tunes(cls, model_class: type) -> bool:
        """Any text encoder: a masked-LM head is added where it has none."""
        return issubclass(model_class, Encoder)

    def head_fields(self) -> dict:
        """The masked-LM head (its decoder tied to the embedding, as BERT's), and no other."""
        return {"mlm_head": True, "num_labels": 0, "pooler": False}

    def build_model(self) -> Encoder:
        return Encoder(self.model_config())

    # -- training ------------------------------------------------------------------------------

    def train_batches(self, batch_size, seed, rank=0, world_size=1):
        return RandomBatches(self._maker(self.train_ids), batch_size, seed, rank, world_size)

    def val_batches(self, batch_size, eval_iters):
        source = RandomBatches(self._maker(self.val_ids), batch_size, self.seed + 1)
        self._val = [next(source) for _ in range(eval_iters)]  # the same ones every time
        return self._val

    def loss(self, model, batch):
        inputs, labels = batch
        logits = model(inputs, head="mlm")  # (B, T, vocab)
        if not bool((labels != IGNORE_INDEX).any()):
            return logits.sum() * 0.0  # nothing chosen in this batch: a zero with a gradient
        flat = logits.reshape(-1, logits.size(-1)).float()
        return F.cross_entropy(flat, labels.reshape(-1), ignore_index=IGNORE_INDEX)

    def count(self, batch) -> int:
        return int(batch[0].numel())

    def evaluate(self, model, val_loss):
        right = total = 0
        device = next(model.parameters()).device
        for inputs, labels in self._val:
            logits = model(inputs.to(device), head="mlm")  # (B, T, vocab)
            sel = labels.to(device) != IGNORE_INDEX
            right += int((logits.argmax(-1)[sel] == labels.to(device)[sel]).sum())
            total += int(sel.sum())
        return {"val_masked_accuracy": right / max(1, total)}

    def example(self, model):
        if not self._val:
            return None
        inputs, labels = self._val[0]
        device = next(model.parameters()).device
        pred = model(inputs[:1].to(device), head="mlm")[0].argmax(-1).cpu()  # (T,)
        where = (labels[0] != IGNORE_INDEX).nonzero().flatten().tolist()[:6]
        dec = self.tokenizer.decode
        pairs = [f"{dec([int(labels[0, t])])!r}->{dec([int(pred[t])])!r}" for t in where]
        return "masked (true->predicted): " + ", ".join(pairs) if pairs else None

    # -- the run directory ---------------------------------------------------------------------

    @property
    def title(self) -> str:
        return f"masked LM: {Path(str(self.options.data)).name} ({self.options.tokenizer})"

    def run_config(self):
        return {**super().run_config(), "data": str(self.options.data),
                "data_path": corpora.where(self.options.data),
                "data_sha256": self.sha256}  # fmt: skip

    def describe(self, model):
        n = sum(p.numel() for p in model.parameters())
        return (
            f"masked-LM: {n:,} parameters, {self.tokenizer.vocab_size} tokens "
            f"({self.options.tokenizer}), {len(self.train_ids):,} train and "
            f"{len(self.val_ids):,} held-out tokens"
        )

    def summary(self, result, final):
        acc = result.last_eval.get("val_masked_accuracy")
        acc_text = f"  val_masked_accuracy {acc:.4f}" if acc is not None else ""
        loss = result.val_loss
        return f"val loss {loss:.4f}{on(result)}{acc_text}" if loss is not None else "no evaluation"

    def predict(self, model, inputs, options=None, **given):
        """Each mask token of each text ([MASK], or the tokenizer's own such as <mask>) with its
        ``top_k`` fillers and their probabilities, read from the masked-LM head."""
        top_k = predict_options(options, given).top_k
        device = next(model.parameters()).device
        mask_id, mask = mask_token(self.tokenizer)
        out = []
        for text in inputs:
            ids = self.tokenizer.encode(text.replace("[MASK]", mask))
            if len(ids) > model.config.block_size:
                raise TokenizerError(f"{text[:40]!r} is {len(ids)} tokens; this model reads at "
                                     f"most {model.config.block_size}")  # fmt: skip
            with torch.no_grad():
                logits = model(torch.tensor([ids], device=device), head="mlm")[0]  # (T, V)
            out.append({"input": text, "masks": mask_fills(self.tokenizer, ids, logits, mask_id,
                                                           top_k)})  # fmt: skip
        return out

    def predict_recorded(self, model, rec, options):
        """Each mask's fillers from the recorded masked-LM logits (the text as it was read:
        a "[MASK]" the tokenizer spells otherwise, <mask>, is predict's own pass)."""
        mask_id, mask = mask_token(self.tokenizer)
        logits = rec.cache.get("mlm_logits")
        if logits is None or rec.text.replace("[MASK]", mask) != rec.text or "" not in rec.ids:
            return None
        ids = rec.ids[""]
        return {"input": rec.text, "masks": mask_fills(self.tokenizer, ids, logits[0], mask_id,
                                                       options.top_k)}  # fmt: skip

    def prediction_lines(self, pred):
        if not pred["masks"]:
            return [f"{pred['input']!r}: no [MASK] in the text; put [MASK] where the model should "
                    "guess a token"]  # fmt: skip
        lines = [f"{pred['input']!r}"]
        for n, fills in enumerate(pred["masks"]):
            shown = "  ".join(f"{f['token']!r} {f['p']:.3f}" for f in fills)
            lines.append(f"  [MASK] #{n + 1} (position {fills[0]['position']}): {shown}")
        return lines

    # -- eval ----------------------------------------------------------------------------------

    def score(self, model, options=None):
        """Masked-token accuracy and loss: the held-out token stream (or the lines of
        ``options.data``) cut into windows of block_size - 2, framed [CLS] window [SEP] and
        masked as in training (15% chosen; 80% [MASK], 10% random, 10% kept) with a fixed seed;
        the figures count the chosen positions only."""
        from attnlab.evaluation import Evaluation, Figure

        o = options or EvalOptions()
        if o.data is not None:
            texts, _ = read_texts(o.data, o.encoding)
            seqs = self.tokenizer.encode_batch([t + "\n" for t in texts], add_special_tokens=False)
            ids, where = torch.tensor([i for s in seqs for i in s], dtype=torch.long), o.data
        else:
            split = self.check_split(o)
            ids = self.val_ids if split == "val" else self.train_ids
            where = f"the {split} split of {self.options.data}"
        w = model.config.block_size - 2
        n = len(ids) // w
        if n == 0:
            raise data.DataError(f"{where}: {len(ids)} tokens, fewer than one window of {w}")
        if o.limit:
            n = min(n, o.limit)
        tok = self.tokenizer
        body = ids[: n * w].view(n, w)
        framed = torch.cat([torch.full((n, 1), special_id(tok, "[CLS]")), body,
                            torch.full((n, 1), special_id(tok, "[SEP]"))], 1)  # fmt: skip
        specials = sorted(set(tok.special_tokens.values()))
        g = torch.Generator().manual_seed(self.seed + 1)
        inputs, labels = mask_tokens(framed, mask_token(tok)[0], tok.vocab_size, specials,
                                     generator=g)  # fmt: skip
        device = next(model.parameters()).device
        right = chosen = 0
        loss = 0.0
        with torch.no_grad():
            for i in range(0, n, o.batch_size):
                x, y = (
                    inputs[i : i + o.batch_size].to(device),
                    labels[i : i + o.batch_size].to(device),
                )
                logits = model(x, head="mlm")  # (B, T, V)
                sel = y != IGNORE_INDEX
                right += int((logits.argmax(-1)[sel] == y[sel]).sum())
                chosen += int(sel.sum())
                loss += float(F.cross_entropy(logits[sel].float(), y[sel], reduction="sum"))
        if chosen == 0:
            raise data.DataError(f"{where}: no token could be masked")
        figures = [
            Figure("masked_accuracy", "masked-token accuracy", right / chosen, "%"),
            Figure("loss", "loss", loss / chosen, "nats/masked token"),
            Figure("masked", "masked tokens", chosen, "count"),
            Figure("windows", "windows", n, "count"),
        ]
        return Evaluation(self.name, f"{where}: {n} windows of {w} tokens", figures)


def mask_token(tokenizer) -> tuple[int, str]:
    """(id, text) of the tokenizer's mask token: [MASK] (BERT, attnlab) or <mask> (RoBERTa)."""
    specials = getattr(tokenizer, "special_tokens", {})
    for name in ("[MASK]", "<mask>"):
        if name in specials:
            return specials[name], name
    vocab = tokenizer.tok.get_vocab() if hasattr(tokenizer, "tok") else {}
    if "<mask>" in vocab:
        return vocab["<mask>"], "<mask>"
    raise TokenizerError("the tokenizer has no mask token ([MASK] or <mask>)")


def mask_fills(tokenizer, ids: list[int], logits: torch.Tensor, mask_id: int,
               top_k: int) -> list[list[dict]]:  # fmt: skip
    """For each position of ``ids`` holding ``mask_id``: the ``top_k`` tokens of softmax(
    logits[t]) (logits (T, V) from the masked-LM head) with their ids and probabilities. The
    one reading of masked-LM logits, shared by ``predict`` and ``trace``."""
    fills = []
    for t in [i for i, x in enumerate(ids) if x == mask_id]:
        probs = torch.softmax(logits[t].float(), -1)  # (V,)
        top = torch.topk(probs, min(top_k, probs.numel()))
        fills.append([{"token": tokenizer.decode([i]), "id": i, "p": p, "position": t}
                      for p, i in zip(top.values.tolist(), top.indices.tolist())])  # fmt: skip
    return fills
