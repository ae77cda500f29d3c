"""Image data for the vision transformer: the built-in ``digits`` set, or a folder of images.

- ``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes), read
  from inside the scikit-learn wheel with ``sklearn.datasets.load_digits`` (no network). Its
  pixels are integers 0..16; here they are scaled to [0, 1].
- a folder laid out as ``DIR/<label>/*.png`` (also .jpg/.jpeg), one subfolder per class, read
  with ``matplotlib.image.imread``. Grayscale or RGB (an alpha channel is dropped); every image
  must have the same square size, because nothing is resized.

Images are float32 tensors (N, C, H, W) in [0, 1]. ``split`` divides them into train / val /
test with a fixed seed, so the same run always holds out the same test images.

``ImageTokenizer`` is what a ViT run stores as its tokenizer.json: it turns the TEXT argument
of ``attnlab attention/explore/classify`` (an image path, or ``test:N``) into pixels.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnlab.data.corpus import DataError

DIGITS = "digits"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
TEST_FRACTION = 0.2  # held out for the final accuracy, never seen during training
INSTALL_HINT = "pip install 'attnlab[vision]'"


@dataclasses.dataclass
class ImageSet:
    """Images (N, C, H, W) float32 in [0, 1], labels (N,) int64 indexing ``classes``."""

    images: Tensor
    labels: Tensor
    classes: list[str]
    source: str

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def image_size(self) -> int:
        return self.images.size(-1)

    @property
    def channels(self) -> int:
        return self.images.size(1)


def is_image_data(spec: str) -> bool:
    """True for ``digits`` and for a folder with a subfolder of images (``DIR/<label>/*.png``)."""
    if spec == DIGITS:
        return True
    if not spec:  # no data named (an imported run): not the current directory's images
        return False
    path = Path(spec)
    try:
        return path.is_dir() and any(
            f.suffix.lower() in IMAGE_SUFFIXES
            for d in path.iterdir()
            if d.is_dir()
            for f in d.iterdir()
        )
    except OSError:
        return False


def load_images(spec: str) -> ImageSet:
    """``digits`` or a ``DIR/<label>/*.png`` folder; anything else is a DataError."""
    if spec == DIGITS:
        return load_digits()
    path = Path(spec)
    if not path.exists():
        raise DataError(f"{spec}: no such image folder (and not the built-in {DIGITS!r})")
    if not path.is_dir():
        raise DataError(f"{spec}: expected {DIGITS!r} or a folder of DIR/<label>/*.png images")
    return load_image_folder(path)


def load_digits() -> ImageSet:
    """scikit-learn's 8x8 digits, (1797, 1, 8, 8) in [0, 1]; classes '0'..'9'."""
    try:
        from sklearn.datasets import load_digits as sk_digits
    except ImportError:
        raise DataError(
            f"the built-in {DIGITS!r} images come with scikit-learn, which is not installed: "
            f"{INSTALL_HINT}"
        ) from None
    d = sk_digits()
    images = torch.from_numpy(d.images.astype(np.float32) / 16.0)[:, None]  # (N, 1, 8, 8)
    labels = torch.from_numpy(d.target.astype(np.int64))  # (N,)
    return ImageSet(images, labels, [str(i) for i in range(10)], DIGITS)


def read_image(path: str | Path) -> Tensor:
    """One image file -> (C, H, W) float32 in [0, 1]; C = 1 (grayscale) or 3 (RGB)."""
    import matplotlib.image as mpimg

    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such image file")
    if not path.is_file():
        raise DataError(f"{path}: not an image file")
    try:
        a = np.asarray(mpimg.imread(path))
    except Exception as e:  # PIL and matplotlib raise many types for a bad file
        raise DataError(f"{path}: cannot read as an image ({type(e).__name__})") from None
    if a.dtype == np.uint8:
        a = a / 255.0
    elif a.dtype == np.uint16:
        a = a / 65535.0
    a = a.astype(np.float32)
    if a.ndim == 3:
        if a.shape[2] == 4:
            a = a[:, :, :3]  # drop alpha
        if a.shape[2] not in (1, 3):
            raise DataError(f"{path}: {a.shape[2]} channels; expected grayscale or RGB")
        a = a.transpose(2, 0, 1)  # (C, H, W)
    elif a.ndim == 2:
        a = a[None]  # (1, H, W)
    else:
        raise DataError(f"{path}: not a 2-D image (array of shape {a.shape})")
    return torch.from_numpy(np.ascontiguousarray(a))


def load_image_folder(root: Path) -> ImageSet:
    """``root/<label>/*.png``: one class per subfolder (sorted by name), equal-size images."""
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(class_dirs) < 2:
        raise DataError(
            f"{root}: expected one subfolder per class (at least 2) holding images, "
            f"found {len(class_dirs)}"
        )
    images, labels, first = [], [], None
    for k, d in enumerate(class_dirs):
        files = sorted(p for p in d.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise DataError(f"{d}: no .png/.jpg images in this class folder")
        for f in files:
            img = read_image(f)
            if first is None:
                first = (f, tuple(img.shape))
                if img.shape[1] != img.shape[2]:
                    raise DataError(f"{f}: {_size(img)}; images must be square (none are resized)")
            elif tuple(img.shape) != first[1]:
                raise DataError(
                    f"{f} is {_size(img)} but {first[0]} is {_size(first[1])}: every image "
                    "must have the same size and channels (attnlab does not resize)"
                )
            images.append(img)
            labels.append(k)
    return ImageSet(
        torch.stack(images), torch.tensor(labels), [d.name for d in class_dirs], str(root)
    )


def _size(img_or_shape) -> str:
    C, H, W = tuple(getattr(img_or_shape, "shape", img_or_shape))
    return f"{H}x{W} {'grayscale' if C == 1 else 'RGB'}"


def split(
    n: int, val_fraction: float, seed: int, test_fraction: float = TEST_FRACTION
) -> tuple[Tensor, Tensor, Tensor]:
    """Indices (train, val, test) of a seeded random permutation of ``range(n)``."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test = max(1, round(n * test_fraction))
    n_val = max(1, round(n * val_fraction)) if val_fraction > 0 else 0
    if n - n_test - n_val < 1:
        raise DataError(f"{n} images are too few to split into train, val and test")
    return perm[n_test + n_val :], perm[n_test : n_test + n_val], perm[:n_test]


class RandomImageBatches:
    """Endless batches (images (B, C, H, W), labels (B,)) drawn at random from a split.

    Batch k is a function of (seed, k) alone, so ``state_dict`` is just k: a resumed run
    continues with exactly the batches it would have seen. Each draw picks the global batch of
    ``batch_size * world_size`` images; this process keeps its ``rank``'s slice of it.
    """

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        self.images, self.labels = images, labels
        self.batch_size = min(batch_size, len(labels) // world_size)
        self.rank, self.world_size = rank, world_size
        self.seed, self.k = seed, 0

    def __iter__(self):
        return self

    def __next__(self) -> tuple[Tensor, Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.k)
        B = self.batch_size
        idx = torch.randperm(len(self.labels), generator=g)[: B * self.world_size]
        idx = idx[self.rank * B : (self.rank + 1) * B]
        self.k += 1
        return self.images[idx], self.labels[idx]

    def state_dict(self) -> dict:
        return {"k": self.k}

    def load_state_dict(self, state: dict) -> None:
        self.k = int(state["k"])


def fixed_batches(images: Tensor, labels: Tensor, batch_size: int) -> list:
    """The whole split in order, as a list of (images, labels) batches."""
    return [
        (images[i : i + batch_size], labels[i : i + batch_size])
        for i in range(0, len(labels), batch_size)
    ]


@dataclasses.dataclass
class Preprocess:
    """A Hugging Face image model's preprocessing (``preprocessor_config.json``), in its order:
    resize to ``size`` (height, width) with PIL's ``resample`` filter on the 8-bit image, then
    x * ``rescale`` (1/255: pixels to [0, 1]), then (x - mean) / std per channel. Resize works
    on 8-bit pixels and rescale in float64, as transformers' ViTImageProcessor does, so both
    give the same numbers."""

    size: tuple[int, int] | None  # (height, width); None = no resize
    resample: int = 2  # PIL.Image.BILINEAR
    rescale: float | None = 1 / 255
    mean: tuple[float, ...] | None = (0.5, 0.5, 0.5)
    std: tuple[float, ...] | None = (0.5, 0.5, 0.5)

    def __call__(self, image) -> Tensor:
        """A PIL image or an 8-bit array (H, W[, C]) -> float32 (C, H, W), ready for the model."""
        from PIL import Image

        pil = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image))
        if self.size is not None:
            h, w = self.size
            pil = pil.resize((w, h), resample=self.resample)
        a = np.asarray(pil)
        a = a[:, :, None] if a.ndim == 2 else a  # (H, W, C)
        a = a.transpose(2, 0, 1)  # (C, H, W)
        if self.rescale is not None:
            a = (a.astype(np.float64) * self.rescale).astype(np.float32)
        a = a.astype(np.float32)
        if self.mean is not None and self.std is not None:
            mean = np.array(self.mean, dtype=np.float32)[:, None, None]  # (C, 1, 1)
            std = np.array(self.std, dtype=np.float32)[:, None, None]
            a = (a - mean) / std
        return torch.from_numpy(np.ascontiguousarray(a))

    def images(self, x: Tensor, channels: int) -> Tensor:
        """Images (N, C, H, W) in [0, 1], as ``load_images`` gives them -> (N, channels, h, w)
        preprocessed, each as its 8-bit picture would be (what ``read`` does to a file)."""
        from PIL import Image

        out = []
        for img in x:
            a = (img.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0)  # (H, W, C)
            a = a.numpy()
            pil = Image.fromarray(a[:, :, 0] if a.shape[2] == 1 else a)
            out.append(self(pil.convert("RGB" if channels == 3 else "L")))
        return torch.stack(out)

    def read(self, path: str | Path, channels: int) -> Tensor:
        """An image file -> (C, H, W) preprocessed; RGB (or grayscale for a 1-channel model)."""
        from PIL import Image, UnidentifiedImageError

        path = Path(path)
        if not path.is_file():
            raise DataError(f"{path}: no such image file")
        try:
            with Image.open(path) as img:
                img = img.convert("RGB" if channels == 3 else "L")
        except (OSError, UnidentifiedImageError) as e:
            raise DataError(f"{path}: cannot read as an image ({type(e).__name__})") from None
        return self(img)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Preprocess:
        d = dict(d)
        for k in ("size", "mean", "std"):
            d[k] = tuple(d[k]) if d.get(k) is not None else None
        return cls(**d)


class ImageTokenizer:
    """The "tokenizer" of a ViT run: where its images come from, and how to read one more.

    A ViT cuts an image into patches inside the model, so this only reads pixels. ``image(text)``
    accepts what the look-inside verbs pass as TEXT: the path of an image file (the size and
    channels the model was trained on), or ``test:N``, the N-th image (from 0) of the run's
    held-out test split, rebuilt from the data source and seed it stores. ``decode`` names
    classes, so a class id prints as its label. Saved as tokenizer.json (type "image").
    """

    kind = "image"

    def __init__(
        self,
        source: str,
        classes: list[str],
        image_size: int,
        channels: int,
        seed: int,
        val_fraction: float,
        test_fraction: float = TEST_FRACTION,
        preprocess: Preprocess | dict | None = None,
    ):
        self.source, self.classes = source, list(classes)
        self.image_size, self.channels = image_size, channels
        self.seed, self.val_fraction, self.test_fraction = seed, val_fraction, test_fraction
        if isinstance(preprocess, dict):
            preprocess = Preprocess.from_dict(preprocess)
        self.preprocess = preprocess  # an imported model's (resize, rescale, normalise)

    @property
    def vocab_size(self) -> int:
        return len(self.classes)

    def decode(self, ids) -> str:
        return " ".join(self.classes[int(i)] for i in ids)

    def test_split(self) -> ImageSet:
        data = load_images(self.source)
        *_, test = split(len(data), self.val_fraction, self.seed, self.test_fraction)
        images = data.images[test]
        if self.preprocess is not None:  # a ViT fine-tuned from an imported one reads them so
            images = self.preprocess.images(images, self.channels)
        return ImageSet(images, data.labels[test], data.classes, data.source)

    def image(self, text: str) -> Tensor:
        """(C, H, W) for an image path or ``test:N``; one clear DataError for anything else."""
        return self.read(text)[0]

    def read(self, text: str) -> tuple[Tensor, str | None]:
        """(image (C, H, W), its true class or None for a file, whose class is unknown)."""
        if text.startswith("test:"):
            n = text[5:]
            if not n.isdigit():
                raise DataError(f"{text!r}: expected test:N with N a whole number, e.g. test:0")
            test = self.test_split()
            if int(n) >= len(test):
                raise DataError(
                    f"{text!r}: the test split of {self.source} has {len(test)} images "
                    f"(test:0 .. test:{len(test) - 1})"
                )
            return test.images[int(n)], self.classes[int(test.labels[int(n)])]
        if self.preprocess is not None:  # any size: resized as the imported model expects
            return self.preprocess.read(text, self.channels), None
        img = read_image(text)
        if self.channels == 1 and img.size(0) == 3 and bool((img == img[:1]).all()):
            img = img[:1]  # a gray image stored as RGB (R = G = B), as matplotlib saves one
        want = (self.channels, self.image_size, self.image_size)
        if tuple(img.shape) != want:
            raise DataError(
                f"{text} is {_size(img)}; this model reads {_size(want)} images "
                "(attnlab does not resize)"
            )
        return img, None

    def to_dict(self) -> dict:
        return {
            "type": "image",
            "source": self.source,
            "classes": self.classes,
            "image_size": self.image_size,
            "channels": self.channels,
            "seed": self.seed,
            "val_fraction": self.val_fraction,
            "test_fraction": self.test_fraction,
        } | ({"preprocess": self.preprocess.to_dict()} if self.preprocess is not None else {})

    @classmethod
    def from_dict(cls, d: dict) -> ImageTokenizer:
        return cls(**{k: v for k, v in d.items() if k != "type"})

    def to_json(self) -> str:
        return json.dumps({"attnlab": self.to_dict()}, indent=2)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")
