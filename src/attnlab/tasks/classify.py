"""Text classification: a BERT-style encoder reads a text and names its class.

    data    a ``label<TAB>text`` file; examples are shuffled with the seed and the last
            ``val_fraction`` held out (at least one)
    batch   ids (B, T) framed [CLS] text [SEP], attention_mask (B, T), class ids (B,)
    loss    cross-entropy of the class logits, from the [CLS] state through the pooler
    figures val loss, accuracy on the whole held-out split
    example a held-out text, the class the model gives it, and its true class

``--arch lstm-attention`` trains the classifier of Jain & Wallace (2019) instead: a BiLSTM whose
states one additive attention pools into the vector the class is read from
(``attnlab.models.rnn_classifier``); ``--score uniform`` fixes that attention uniform.

``--task classify`` on images (``--data digits``, a ``DIR/<label>/*.png`` folder, or
``--arch vit``) is the vision task (``attnlab.tasks.vision``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab import data
from attnlab.config import ConfigError
from attnlab.data import corpus as corpora
from attnlab.data.batches import RandomBatches, pad_batch
from attnlab.metrics import Metric
from attnlab.models.declare import model_for
from attnlab.models.encoder import Encoder
from attnlab.models.rnn_classifier import LSTMClassifierConfig
from attnlab.tasks.base import EvalOptions, Task, predict_options, register, task_class
from attnlab.tasks.mlm import EncoderOptions, check_fingerprint
from attnlab.tokenizers import build_tokenizer, special_id

VAL_BATCH = 64
ARCHS = ("transformer", "lstm-attention")


@dataclasses.dataclass
class ClassifyOptions(EncoderOptions):
    """The encoder's options, and the architecture: ``transformer`` (a BERT-style encoder) or
    ``lstm-attention`` (a BiLSTM of ``d_model`` units each way, embeddings as wide, pooled by
    one attention whose ``score`` is additive or uniform)."""

    arch: str = "transformer"
    score: str | None = None  # lstm-attention: additive (default) or uniform

    def validate(self) -> None:
        self._one_of("arch", ARCHS)
        if self.arch == "transformer":
            if self.score is not None:
                raise ConfigError("--score applies to --arch lstm-attention only")
        else:
            if self.score is not None:
                self._one_of("score", ("additive", "uniform"))
            if self.n_layer or self.n_head or self.norm or self.pos:
                raise ConfigError("--n-layer, --n-head, --norm and --pos apply to --arch "
                                  "transformer only (the LSTM classifier has one layer)")  # fmt: skip
        super().validate()

    def model_config(self, vocab_size: int, **heads):
        if self.arch == "transformer":
            return super().model_config(vocab_size, **heads)
        d = self.d_model or 64
        return LSTMClassifierConfig(
            vocab_size=vocab_size, d_embed=d, d_hidden=d, attention=self.score or "additive",
            num_labels=heads.get("num_labels") or 2, block_size=self.block_size or 128,
            dropout=self.dropout or 0.0, pad_id=0,
        )  # fmt: skip


def read_labelled(path: str | Path, encoding: str = "utf-8", min_labels: int = 2):
    """(labels, texts, corpus) from ``label<TAB>text`` lines; blank lines are skipped. Training
    needs ``min_labels`` = 2 distinct labels; scoring a file needs one."""
    if Path(path).is_dir():
        raise data.DataError(f"{path}: is a directory; expected one label<TAB>text file")
    corpus = data.open_corpus(path, encoding)  # missing, binary, undecodable, empty: DataError
    labels, texts = [], []
    for n, line in enumerate(corpus.read().splitlines(), 1):
        if not line.strip():
            continue
        label, tab, text = line.partition("\t")
        if not tab or not label.strip() or not text.strip():
            raise data.DataError(f"{path}:{n}: expected 'label<TAB>text'")
        labels.append(label.strip())
        texts.append(text)
    if len(set(labels)) < min_labels:
        raise data.DataError(
            f"{path}: classification needs at least two labels, found {len(set(labels))}"
            if min_labels > 1
            else f"{path}: no label<TAB>text lines"
        )
    return labels, texts, corpus


@register
class TextClassifier(Task):
    name = "classify"
    eval_reads = Task.eval_reads | {"encoding", "batch_size"}
    order = 30
    label = "--task classify"
    Options = ClassifyOptions
    unit = "examples"
    loss_unit = "nats / example"
    metrics = (Metric("val_accuracy", "accuracy", "%", higher_is_better=True),)
    best = "val_accuracy"
    train_defaults = {"max_iters": 500, "batch_size": 32}

    def __init__(self, options: EncoderOptions, seed: int = 1337):
        super().__init__(options, seed)
        self.classes: list[str] = []
        self.sha256 = None

    @classmethod
    def redirect(cls, given: dict) -> type[Task]:
        from attnlab.data.images import is_image_data

        arch = given.get("arch")
        if (
            arch == "vit"
            or _reads(given.get("model_type")) == "image"
            or is_image_data(given.get("data", ""))
        ):
            return task_class("vision")
        if arch not in (None, *ARCHS):
            raise ConfigError(f"--arch {arch} is not a text classifier (use "
                              f"{' or '.join(ARCHS)})")  # fmt: skip
        return cls

    @classmethod
    def self_attention(cls, options) -> bool:
        return options.arch == "transformer"  # an LSTM's one attention pools, it has no heads

    # -- data ----------------------------------------------------------------------------------

    def prepare(self, run_dir):
        o = self.options
        labels, texts, corpus = read_labelled(o.data, o.encoding)
        if self.tokenizer is None:  # else --init-from's, the run's own
            self.tokenizer = build_tokenizer(o.tokenizer, texts, o.vocab_size, encoder=True)
        self.sha256 = data.fingerprint(corpus.files)
        self._split(labels, texts)

    def reload(self, run_dir, tokenizer, cfg):
        labels, texts, corpus = read_labelled(corpora.recorded(cfg, self.options.data),
                                              self.options.encoding)  # fmt: skip
        check_fingerprint(corpus, cfg)
        self.tokenizer, self.sha256 = tokenizer, cfg.get("data_sha256")
        self._split(labels, texts)

    def restore(self, cfg: dict) -> None:
        self.classes = list(cfg.get("labels") or [])

    def _split(self, labels: list[str], texts: list[str]) -> None:
        self.classes = sorted(set(labels))
        self.y = torch.tensor([self.classes.index(lab) for lab in labels])
        self.texts = texts
        limit = self.options.model_config(8).block_size
        sep = special_id(self.tokenizer, "[SEP]")
        self.seqs = [s if len(s) <= limit else s[: limit - 1] + [sep]
                     for s in (self.tokenizer.encode(t) for t in texts)]  # fmt: skip
        g = torch.Generator().manual_seed(self.seed)
        order = torch.randperm(len(self.seqs), generator=g).tolist()
        n_val = min(len(self.seqs) - 1, max(1, round(len(self.seqs) * self.options.val_fraction)))
        self.val_idx, self.train_idx = order[:n_val], order[n_val:]

    def examples(self, idx: list[int]):
        """(ids (B, T), attention_mask (B, T), y (B,)) of the examples ``idx``."""
        ids, mask = pad_batch([self.seqs[i] for i in idx], special_id(self.tokenizer, "[PAD]"))
        return ids, mask, self.y[idx]

    def model_config(self):
        if self.init is not None:
            return self.init_model_config()
        return self.options.model_config(self.tokenizer.vocab_size, pooler=True,
                                         num_labels=len(self.classes))  # fmt: skip

    @classmethod
    def fine_tunes(cls, model_class: type) -> bool:
        """Any text encoder: its masked-LM head (if any) gives way to a classification head."""
        return issubclass(model_class, Encoder)

    def head_fields(self) -> dict:
        """BERT's pooler and a classifier over this data's classes; no masked-LM head."""
        return {"pooler": True, "num_labels": len(self.classes), "mlm_head": False}

    def fresh(self) -> tuple[str, ...]:
        """The classifier starts fresh unless the source classified the same labels."""
        same = self.init is not None and self.init.labels == self.classes
        return () if same else ("classifier.",)

    def build_model(self):
        return model_for(self.model_config())

    # -- training ------------------------------------------------------------------------------

    def train_batches(self, batch_size, seed, rank=0, world_size=1):
        def make(n: int, g: torch.Generator):
            pick = torch.randint(len(self.train_idx), (n,), generator=g).tolist()
            return self.examples([self.train_idx[i] for i in pick])

        return RandomBatches(make, batch_size, seed, rank, world_size)

    val_whole = True  # its val_batches cover the held-out split

    def val_batches(self, batch_size, eval_iters):
        v = self.val_idx
        return [self.examples(v[lo : lo + VAL_BATCH]) for lo in range(0, len(v), VAL_BATCH)]

    def loss(self, model, batch):
        ids, mask, target = batch
        return F.cross_entropy(model(ids, mask, head="classify").float(), target)  # (B, classes)

    def evaluate(self, model, val_loss):
        right = 0
        device = next(model.parameters()).device
        for ids, mask, target in self.val_batches(VAL_BATCH, 1):
            pred = model(ids.to(device), mask.to(device), head="classify").argmax(-1).cpu()
            right += int((pred == target).sum())
        n = len(self.val_idx)
        return {"val_accuracy": right / n, "val_correct": right, "val_examples": n}

    def example(self, model):
        i = self.val_idx[0]
        pred = self.predict(model, [self.texts[i]], top_k=1)[0]["classes"][0]
        text = self.texts[i] if len(self.texts[i]) <= 60 else self.texts[i][:57] + "..."
        return f"{text!r} -> {pred['label']} ({pred['p']:.2f}; true {self.classes[int(self.y[i])]})"

    # -- the run directory ---------------------------------------------------------------------

    @property
    def title(self) -> str:
        return f"text classification: {Path(str(self.options.data)).name}"

    def run_config(self):
        return {**super().run_config(), "labels": self.classes, "data": str(self.options.data),
                "data_path": corpora.where(self.options.data),
                "data_sha256": self.sha256}  # fmt: skip

    def describe(self, model):
        n = sum(p.numel() for p in model.parameters())
        return (
            f"classify: {len(self.classes)} classes, {len(self.train_idx)} training and "
            f"{len(self.val_idx)} held-out examples, {n:,} parameters"
        )

    def summary(self, result, final):
        ev = result.last_eval
        if "val_accuracy" not in ev:
            return f"trained {result.step} steps"
        return (
            f"held-out accuracy {ev['val_accuracy']:.4f} ({ev['val_correct']}/{ev['val_examples']})"
        )

    def predict(self, model, inputs, options=None, **given):
        """Each text's ``top_k`` classes with probabilities, from the [CLS] state."""
        top_k = predict_options(options, given).top_k
        device = next(model.parameters()).device
        out = []
        for text in inputs:
            ids = self.tokenizer.encode(text)[: model.config.block_size]
            with torch.no_grad():
                logits = model(torch.tensor([ids], device=device), head="classify")[0]
            out.append(self._classes(model, text, logits, top_k))
        return out

    def predict_recorded(self, model, rec, options):
        """The classes from the recorded class logits (read at [CLS], or the LSTM's pooled
        state)."""
        logits = rec.cache.get("class_logits")
        logits = logits[0] if logits is not None else (
            rec.logits[0, 0] if rec.logits is not None else None)  # fmt: skip
        return None if logits is None else self._classes(model, rec.text, logits, options.top_k)

    def _classes(self, model, text: str, logits, top_k: int) -> dict:
        """{"input", "classes": the ``top_k`` classes of softmax(logits (C,))}."""
        classes = self.class_names(model)
        top = torch.topk(torch.softmax(logits.float(), -1), min(top_k, len(classes)))
        return {"input": text, "classes": [{"label": classes[i], "p": p}
                for p, i in zip(top.values.tolist(), top.indices.tolist())]}  # fmt: skip

    def class_names(self, model) -> list[str]:
        """The run's labels, or "0", "1", ... for imported weights that name none."""
        return self.classes or [str(i) for i in range(model.config.num_labels)]

    def prediction_lines(self, pred):
        return class_lines(pred)

    # -- eval ----------------------------------------------------------------------------------

    def score(self, model, options=None):
        """Accuracy, per-class precision / recall / F1 and the confusion matrix on the held-out
        examples, or on every line of a ``label<TAB>text`` file (its labels must be the run's)."""
        o = options or EvalOptions()
        classes = self.class_names(model)
        if o.data is not None:
            labels, texts, _ = read_labelled(o.data, o.encoding, min_labels=1)
            unknown = sorted(set(labels) - set(classes))
            if unknown:
                raise data.DataError(
                    f"{o.data}: labels the model does not know: {', '.join(unknown[:5])} "
                    f"(it knows {', '.join(classes)})"
                )
            limit = model.config.block_size
            sep = special_id(self.tokenizer, "[SEP]")
            seqs = [s if len(s) <= limit else s[: limit - 1] + [sep]
                    for s in self.tokenizer.encode_batch(texts)]  # fmt: skip
            y = [classes.index(lab) for lab in labels]
            where = str(o.data)
        else:
            split = self.check_split(o)
            idx = self.val_idx if split == "val" else self.train_idx
            seqs, y = [self.seqs[i] for i in idx], self.y[idx].tolist()
            texts = [self.texts[i] for i in idx]
            where = f"the {split} split of {self.options.data}"
        if o.limit:
            seqs, y, texts = seqs[: o.limit], y[: o.limit], texts[: o.limit]
        pad = special_id(self.tokenizer, "[PAD]")
        device = next(model.parameters()).device
        logits = []
        with torch.no_grad():
            for lo in range(0, len(seqs), o.batch_size):
                ids, mask = pad_batch(seqs[lo : lo + o.batch_size], pad)
                logits.append(model(ids.to(device), mask.to(device), head="classify").float().cpu())
        return class_evaluation(self.name, f"{where}: {len(y)} examples", torch.cat(logits),
                                torch.tensor(y), classes, texts)  # fmt: skip


def class_lines(pred: dict) -> list[str]:
    """A classifier's prediction (text or image) as terminal lines."""
    truth = pred.get("truth")
    name = pred["input"] if "truth" in pred else repr(pred["input"])  # an image: its file or test:N
    lines = [name + (f"  (true class {truth})" if truth is not None else "")]
    width = max(len(c["label"]) for c in pred["classes"])
    lines += [f"  {c['label']:<{width}}  {c['p']:.4f}" for c in pred["classes"]]
    return lines


def class_evaluation(task: str, where: str, logits: torch.Tensor, y: torch.Tensor,
                     classes: list[str], inputs: list[str] | None = None):  # fmt: skip
    """The Evaluation of class logits (N, K) against true classes y (N,): accuracy, mean loss,
    macro precision / recall / F1, the per-class table and the confusion matrix, and the first
    few misclassified inputs."""
    from attnlab.evaluation import Evaluation, Figure
    from attnlab.metrics import classification_report, confusion_matrix

    pred = logits.argmax(-1)
    report = classification_report(confusion_matrix(y.tolist(), pred.tolist(), len(classes)),
                                   classes)  # fmt: skip
    loss = float(F.cross_entropy(logits, y)) if len(y) else float("nan")
    figures = [
        Figure("accuracy", "accuracy", report["accuracy"], "%"),
        Figure("loss", "loss", loss, "nats/example"),
        Figure("macro_precision", "macro precision", report["macro_precision"], "%"),
        Figure("macro_recall", "macro recall", report["macro_recall"], "%"),
        Figure("macro_f1", "macro F1", report["macro_f1"], "%"),
        Figure("examples", "examples", len(y), "count"),
    ]
    wrong = [{"input": inputs[i], "true": classes[int(y[i])], "predicted": classes[int(pred[i])]}
             for i in (pred != y).nonzero().flatten().tolist()[:3]] if inputs else []  # fmt: skip
    return Evaluation(task, where, figures, report, mistakes=wrong)


def _reads(model_type: str | None) -> str:
    """What the registered model of ``model_type`` reads (text, image, source)."""
    from attnlab.models.declare import registered

    cls = registered().get(model_type or "")
    return cls.reads if cls is not None else "text"
