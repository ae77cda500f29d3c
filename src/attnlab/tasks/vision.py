"""Image classification: a vision transformer (ViT) names the class of an image.

    data    the built-in ``digits`` (8x8, 10 classes) or a ``DIR/<label>/*.png`` folder, split
            with the seed into train / val / test (the test images are never trained on)
    batch   images (B, C, H, W) in [0, 1], class ids (B,)
    loss    cross-entropy of the class logits read from [CLS], in nats per image
    figures val loss, val accuracy; at the end, accuracy on the test split (in config.json)
    example a held-out image's predicted class and its true class

Reached as ``attnlab train --task classify`` on image data, or with ``--arch vit``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.config import BaseConfig, ConfigError
from attnlab.data import images as im
from attnlab.metrics import Metric
from attnlab.models.vit import ViT, ViTConfig
from attnlab.modes import evaluating
from attnlab.tasks.base import EvalOptions, Task, predict_options, register

MODEL_OPTIONS = ("n_layer", "n_head", "d_model", "patch_size", "dropout")


@dataclasses.dataclass
class VisionOptions(BaseConfig):
    data: str = "digits"
    arch: str = "vit"
    val_fraction: float = 0.1  # and 20% of the images for the test split
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    patch_size: int = 2  # side of a square patch, in pixels
    dropout: float = 0.0
    norm: str | None = None  # pre (ViT) or post

    def validate(self) -> None:
        if self.arch not in ("vit", "transformer"):
            raise ConfigError(f"--arch {self.arch} cannot classify images; use --arch vit")
        if not 0.0 < self.val_fraction < 0.5:
            raise ConfigError(f"val_fraction must be between 0 and 0.5, got {self.val_fraction}")
        if self.norm is not None:
            self._one_of("norm", ("pre", "post"))
        self.model_config(self.patch_size, 1, 2)  # sizes, before the images are read

    def model_config(self, image_size: int, channels: int, n_classes: int) -> ViTConfig:
        sizes = {k: getattr(self, k) for k in MODEL_OPTIONS}
        return ViTConfig(image_size=image_size, channels=channels, n_classes=n_classes,
                         norm_first=self.norm != "post", **sizes)  # fmt: skip


@register
class ImageClassifier(Task):
    name = "vision"
    order = 50
    label = "--arch vit"
    hint = "(size it with --n-layer, --n-head, --d-model and --patch-size)"
    Options = VisionOptions
    unit = "images"
    loss_unit = "nats / image"
    metrics = (Metric("val_accuracy", "accuracy", "%", higher_is_better=True),)
    best = "val_accuracy"
    train_defaults = {"max_iters": 600, "batch_size": 64, "lr": 2e-3}

    def __init__(self, options: VisionOptions, seed: int = 1337):
        super().__init__(options, seed)
        self.images: im.ImageSet | None = None

    @classmethod
    def default_out(cls, options) -> Path:
        return Path("runs") / Path(str(options.data)).name

    # -- data ----------------------------------------------------------------------------------

    @property
    def source(self) -> str:
        d = str(self.options.data)
        return d if d == im.DIGITS else str(Path(d).resolve())

    def prepare(self, run_dir):
        preprocess = getattr(self.tokenizer, "preprocess", None)  # --init-from's: read as it is
        self._load(preprocess)
        x = self.images
        self.tokenizer = im.ImageTokenizer(self.source, x.classes, x.image_size, x.channels,
                                           self.seed, self.options.val_fraction,
                                           preprocess=preprocess)  # fmt: skip

    def reload(self, run_dir, tokenizer, cfg):
        self._load(getattr(tokenizer, "preprocess", None))
        self.tokenizer = tokenizer

    def _load(self, preprocess: im.Preprocess | None = None) -> None:
        self.images = x = im.load_images(str(self.options.data))
        if self.init is not None:  # the images as the run it starts from reads them
            self.images = x = self._as_source(x, preprocess)
        self.train_idx, self.val_idx, self.test_idx = im.split(len(x), self.options.val_fraction,
                                                               self.seed)  # fmt: skip
        try:
            self.model_config()
        except ConfigError as e:
            raise ConfigError(f"{self.options.data}: {e}") from None

    def _as_source(self, x: im.ImageSet, preprocess: im.Preprocess | None) -> im.ImageSet:
        """``x`` through the source's preprocessing (an imported ViT's resize and normalise),
        or as it is if it has the size and channels the source was trained on."""
        c = self.init.config
        want = (c.get("channels"), c.get("image_size"), c.get("image_size"))
        if preprocess is not None:
            x = im.ImageSet(preprocess.images(x.images, want[0]), x.labels, x.classes, x.source)
        if tuple(x.images.shape[1:]) != want:
            raise im.DataError(f"{self.options.data}: images are {tuple(x.images.shape[1:])} "
                               f"(C, H, W); the run --init-from starts from reads {want}")  # fmt: skip
        return x

    def model_config(self) -> ViTConfig:
        if self.init is not None:
            return self.init_model_config()
        x = self.images
        return self.options.model_config(x.image_size, x.channels, len(x.classes))

    @classmethod
    def fine_tunes(cls, model_class: type) -> bool:
        """Any ViT (trained by attnlab, or imported): its classifier is this data's."""
        return issubclass(model_class, ViT)

    def head_fields(self) -> dict:
        return {"n_classes": len(self.images.classes)}

    def fresh(self) -> tuple[str, ...]:
        """The classifier starts fresh unless the source classified the same labels."""
        same = self.init is not None and self.init.labels == self.images.classes
        return () if same else ("head.",)

    def build_model(self) -> ViT:
        return ViT(self.model_config())

    # -- training ------------------------------------------------------------------------------

    def train_batches(self, batch_size, seed, rank=0, world_size=1):
        X, Y = self.images.images, self.images.labels
        i = self.train_idx
        return im.RandomImageBatches(X[i], Y[i], batch_size, seed, rank, world_size)

    def val_batches(self, batch_size, eval_iters):
        X, Y = self.images.images, self.images.labels
        return im.fixed_batches(X[self.val_idx], Y[self.val_idx], 256)

    def loss(self, model, batch):
        x, y = batch
        return F.cross_entropy(model(x).float(), y)  # (B, n_classes) logits

    def sample_inputs(self, n, max_len):
        """The first ``n`` held-out images (B, C, H, W): their patches are the tokens."""
        return self.images.images[self.val_idx[:n]], False

    def accuracy(self, model, idx) -> tuple[int, int]:
        X, Y = self.images.images, self.images.labels
        device = next(model.parameters()).device
        right = sum(
            int((model(x.to(device)).argmax(-1) == y.to(device)).sum())
            for x, y in im.fixed_batches(X[idx], Y[idx], 256)
        )
        return right, len(idx)

    def evaluate(self, model, val_loss):
        right, n = self.accuracy(model, self.val_idx)
        return {"val_accuracy": right / n}

    def example(self, model):
        i = int(self.val_idx[0])
        x = self.images.images[i : i + 1].to(next(model.parameters()).device)
        probs = torch.softmax(model(x).float(), -1)[0]  # (n_classes,)
        k = int(probs.argmax())
        truth = self.images.classes[int(self.images.labels[i])]
        return f"a held-out image -> {self.images.classes[k]} ({float(probs[k]):.2f}; true {truth})"

    # -- the run directory ---------------------------------------------------------------------

    @property
    def title(self) -> str:
        return f"vision transformer: {Path(str(self.options.data)).name}"

    def run_config(self):
        # "classify", as typed (and as older ViT runs say); model_type "vit" makes it this task
        return {**super().run_config(), "task": "classify", "arch": "vit", "data": self.source,
                "labels": self.images.classes if self.images else None,
                "val_fraction": self.options.val_fraction, "test_fraction": im.TEST_FRACTION,
                "n_train": len(self.train_idx), "n_val": len(self.val_idx),
                "n_test": len(self.test_idx)}  # fmt: skip

    def describe(self, model):
        x, c = self.images, self.model_config()
        return (
            f"vit: {len(x)} images {c.image_size}x{c.image_size}x{c.channels}, "
            f"{len(x.classes)} classes ({len(self.train_idx)} train, {len(self.val_idx)} val, "
            f"{len(self.test_idx)} test); {c.n_patches} patches of {c.patch_size}x{c.patch_size}, "
            f"{c.n_layer} layers, {c.n_head} heads, d_model {c.d_model}, "
            f"{sum(p.numel() for p in model.parameters()):,} parameters"
        )

    def finish(self, model):
        """Accuracy on the test split, which training never saw."""
        with evaluating(model), torch.no_grad():
            right, n = self.accuracy(model, self.test_idx)
        return {"test_accuracy": right / n, "test_correct": right}

    def summary(self, result, final):
        if "test_accuracy" not in final:
            return f"trained {result.step} steps"
        n = len(self.test_idx)
        return f"held-out test accuracy {final['test_accuracy']:.4f} ({final['test_correct']}/{n})"

    def predict(self, model, inputs, options=None, **given):
        """Each image's (a file, or ``test:N``) ``top_k`` classes with probabilities."""
        top_k = predict_options(options, given).top_k
        if not model.config.n_classes:
            raise ConfigError("this ViT has no classifier (a Hugging Face ViTModel): it predicts "
                              "no class; trace, attention, similarity and explore read it")  # fmt: skip
        device = next(model.parameters()).device
        out = []
        for text in inputs:
            image, truth = self.tokenizer.read(text)
            with torch.no_grad():
                logits = model(image[None].to(device))[0]  # (n_classes,)
            out.append(self._classes(text, truth, logits, top_k))
        return out

    def predict_recorded(self, model, rec, options):
        """The classes from the recorded logits at [CLS]; the truth the image's split names."""
        if not model.config.n_classes or rec.logits is None:
            return None
        return self._classes(rec.text, rec.extra.get("truth"), rec.logits[0, 0], options.top_k)

    def _classes(self, text: str, truth, logits, top_k: int) -> dict:
        """{"input", "truth", "classes": the ``top_k`` classes of softmax(logits (C,))}."""
        classes = self.tokenizer.classes
        probs = torch.softmax(logits.float(), dim=-1)
        top = torch.topk(probs, min(top_k, len(probs)))
        return {"input": text, "truth": truth, "classes": [{"label": classes[i], "p": p}
                for p, i in zip(top.values.tolist(), top.indices.tolist())]}  # fmt: skip

    def prediction_lines(self, pred):
        from attnlab.tasks.classify import class_lines

        return class_lines(pred)

    # -- eval ----------------------------------------------------------------------------------

    splits = ("test", "val", "train")

    def score(self, model, options=None):
        """Accuracy, per-class precision / recall / F1 and the confusion matrix on the test
        split (never trained on), or on a ``DIR/<label>/*.png`` folder whose labels are the
        run's classes."""
        from attnlab.tasks.classify import class_evaluation

        o = options or EvalOptions()
        classes = list(self.tokenizer.classes)
        if o.data is not None:
            given = im.load_images(str(o.data))
            unknown = sorted(set(given.classes) - set(classes))
            if unknown:
                raise im.DataError(f"{o.data}: class folders the model does not know: "
                                   f"{', '.join(unknown[:5])} (it knows {', '.join(classes)})")  # fmt: skip
            want = (self.tokenizer.channels, self.tokenizer.image_size, self.tokenizer.image_size)
            if tuple(given.images.shape[1:]) != want:
                raise im.DataError(f"{o.data}: images are {tuple(given.images.shape[1:])} "
                                   f"(C, H, W); this model reads {want}")  # fmt: skip
            X = given.images
            Y = torch.tensor([classes.index(given.classes[int(k)]) for k in given.labels])
            where = str(o.data)
        else:
            split = self.check_split(o)
            idx = {"test": self.test_idx, "val": self.val_idx, "train": self.train_idx}[split]
            X, Y = self.images.images[idx], self.images.labels[idx]
            where = f"the {split} split of {self.options.data}"
        if o.limit:
            X, Y = X[: o.limit], Y[: o.limit]
        device = next(model.parameters()).device
        with torch.no_grad():
            logits = torch.cat([model(x.to(device)).float().cpu()
                                for x, _ in im.fixed_batches(X, Y, 256)])  # fmt: skip
        return class_evaluation(self.name, f"{where}: {len(Y)} images", logits, Y, classes)
