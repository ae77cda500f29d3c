"""ViT: a vision transformer (Dosovitskiy et al., "An Image is Worth 16x16 Words", 2020).

    images (B, C, H, W)
      -> cut into N = (H / P) * (W / P) patches of P x P pixels, each flattened to C*P*P numbers
      -> a linear projection of every patch to d_model: the patch embeddings    (B, N, C_model)
      -> prepend a learnable [CLS] vector, add learned position embeddings      (B, N + 1, C_model)
      -> n_layer pre-norm blocks, every token attending to every other (no mask)
      -> final LayerNorm -> a linear classifier on the [CLS] position           (B, n_classes)

A patch plays the part a word plays in a text transformer: the model never sees pixels
except through this one projection. Nothing is causal and nothing is padded.

Recorded activations (``forward(images, record=True)``) use the names every attnlab model
uses: ``patches`` (the flattened patches), ``embed``, ``pos``, ``blocks.N.attn.weights``
(B, H, N + 1, N + 1), ..., ``ln_f``, ``class_logits`` (B, n_classes), named like the
encoder's classification head.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab import hooks
from attnlab.blocks import ACTIVATIONS, block_parameters, block_stack
from attnlab.config import BaseConfig, ConfigError
from attnlab.hooks import Hook
from attnlab.models.declare import InputError, ModelKind, Prepared, Unembed, class_id, register


@dataclasses.dataclass
class ViTConfig(BaseConfig):
    image_size: int = 8  # square images, image_size x image_size pixels
    patch_size: int = 2  # square patches; image_size must be a multiple of it
    channels: int = 1  # 1 = grayscale, 3 = RGB
    n_classes: int = 10  # 0: no classifier (Hugging Face's ViTModel), the output is a vector
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    d_ff: int | None = None  # None = 4 * d_model
    dropout: float = 0.0
    bias: bool = True
    norm_first: bool = True  # ViT is pre-norm
    activation: str = "gelu"
    ln_eps: float = 1e-6
    pooler: bool = False  # tanh(W h_[CLS] + b) after the final norm (Hugging Face's ViTModel)

    def validate(self) -> None:
        self._positive("image_size", "patch_size", "channels", "n_layer", "n_head", "d_model")
        self._positive_or_none("d_ff")
        self._divisible("image_size", "patch_size")
        if self.n_classes < 2 and self.n_classes != 0:
            raise ConfigError(f"n_classes must be 0 (no classifier) or at least 2, "
                              f"got {self.n_classes}")  # fmt: skip
        self._divisible("d_model", "n_head")
        self._one_of("activation", ACTIVATIONS)
        self._fraction("dropout")
        self._positive("ln_eps")

    def estimate_parameters(self) -> int:
        """About how many parameters a ViT of this config has, from its sizes alone: the
        blocks, the patch projection, [CLS] and position embeddings, and the class head."""
        c = self.d_model
        n = self.n_layer * block_parameters(c, self.d_ff or 4 * c)
        n += self.patch_size * self.patch_size * self.channels * c
        return n + (self.n_patches + 2) * c + c * self.n_classes

    @property
    def grid(self) -> int:
        """Patches per side: image_size / patch_size."""
        return self.image_size // self.patch_size

    @property
    def n_patches(self) -> int:
        return self.grid * self.grid

    @property
    def patch_dim(self) -> int:
        """Numbers in one flattened patch: channels * patch_size^2."""
        return self.channels * self.patch_size * self.patch_size


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """(B, C, H, W) -> (B, N, C*P*P): the non-overlapping P x P patches, row by row.

    Patch n covers rows P*(n // (W/P)) ... and columns P*(n % (W/P)) ...; inside a patch the
    numbers are ordered channel, then row, then column (``F.unfold``'s order).
    """
    cols = F.unfold(images, kernel_size=patch_size, stride=patch_size)  # (B, C*P*P, N)
    return cols.transpose(1, 2)  # (B, N, C*P*P)


class PatchEmbedding(nn.Module):
    """x_n = W flatten(patch_n) + b: one shared linear map from a patch's pixels to d_model.

    Written as unfold + Linear to read like the paper. A ``Conv2d(C, d_model, kernel_size=P,
    stride=P)`` whose weight is ``proj.weight.view(d_model, C, P, P)`` computes the same thing
    (that is how most implementations write it; ``as_conv2d`` builds one, the tests compare).
    """

    def __init__(self, c: ViTConfig):
        super().__init__()
        self.patch_size = c.patch_size
        self.proj = nn.Linear(c.patch_dim, c.d_model, bias=c.bias)
        self.hook_patches = Hook()

    def forward(self, images: Tensor) -> Tensor:
        patches = self.hook_patches(patchify(images, self.patch_size))  # (B, N, C*P*P)
        return self.proj(patches)  # (B, N, d_model)

    def as_conv2d(self) -> nn.Conv2d:
        """The equivalent strided convolution (same weights, reshaped)."""
        d, P = self.proj.out_features, self.patch_size
        channels = self.proj.in_features // (P * P)
        conv = nn.Conv2d(channels, d, P, stride=P, bias=self.proj.bias is not None)
        with torch.no_grad():
            conv.weight.copy_(self.proj.weight.view(d, channels, P, P))
            if self.proj.bias is not None:
                conv.bias.copy_(self.proj.bias)
        return conv


@register
class ViT(ModelKind, nn.Module):
    """Vision transformer classifier. ``forward(images)`` -> logits (B, n_classes)."""

    config_class = ViTConfig
    model_type = "vit"
    causal = False  # every patch sees every other patch (read by `attnlab check`)
    uses_padding = False  # every image has the same number of patches

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = c = config
        self.patch_embed = PatchEmbedding(c)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model))  # (1, 1, C)
        self.pos_embed = nn.Parameter(torch.zeros(1, c.n_patches + 1, c.d_model))  # (1, N+1, C)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = block_stack(c, causal=False)
        self.ln_f = nn.LayerNorm(c.d_model, eps=c.ln_eps, bias=c.bias)
        self.head = nn.Linear(c.d_model, c.n_classes) if c.n_classes else None
        self.pooler = nn.Linear(c.d_model, c.d_model) if c.pooler else None
        for name in ("embed", "embed_cls", "pos", "ln_f", "pooled", "class_logits"):
            setattr(self, f"hook_{name}", Hook())
        self.apply(self._init_weights)
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.pos_embed, std=0.02)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, images: Tensor, record: bool = False):
        """images (B, C, H, W) -> logits (B, n_classes); with ``record=True``, (logits, cache).

        Without a classifier (``n_classes`` 0) the output is the [CLS] vector (B, C): pooled,
        tanh(W h + b), when the model has a pooler, else the final norm's."""
        if record:
            with hooks.record(self) as acts:
                logits = self.forward(images)
            return logits, acts
        c = self.config
        want = (c.channels, c.image_size, c.image_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != want:
            raise ValueError(
                f"expected images (B, {', '.join(map(str, want))}), got {tuple(images.shape)}"
            )
        B = images.size(0)
        x = self.hook_embed(self.patch_embed(images))  # (B, N, C) one vector per patch
        x = self.hook_embed_cls(torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1))
        # (B, N + 1, C): [CLS] first, then the patches
        x = self.drop(x + self.hook_pos(self.pos_embed))  # (1, N + 1, C) broadcast over B
        for block in self.blocks:
            x = block(x)  # no mask: every token attends to all N + 1
        x = self.hook_ln_f(self.ln_f(x))
        if self.head is not None:
            return self.hook_class_logits(self.head(x[:, 0]))  # (B, n_classes) from [CLS] alone
        if self.pooler is not None:
            return self.hook_pooled(torch.tanh(self.pooler(x[:, 0])))  # (B, C)
        return x[:, 0]  # (B, C)

    kind = "vit"

    def describe(self) -> str:
        """What this model is, in one sentence (the look-inside verbs start with it)."""
        c = self.config
        return (f"vision transformer ({c.n_layer} layers, {c.n_head} heads, width {c.d_model}): "
                f"the {c.image_size}x{c.image_size} image is cut into {c.grid}x{c.grid} = "
                f"{c.n_patches} patches of {c.patch_size}x{c.patch_size} pixels, each patch a "
                "token, after a [CLS] token; every token attends to every other, and the class "
                f"(one of {c.n_classes}) is read from [CLS]")  # fmt: skip

    # -- the inspection protocol (see attnlab.inspect.recording) ----------------------------------

    def token_labels(self) -> list[str]:
        """'[CLS]', then 'r<row>c<col>' for each patch, row by row from the top left (patch n
        is at row n // grid, column n % grid)."""
        g = self.config.grid
        return ["[CLS]"] + [f"r{n // g}c{n % g}" for n in range(g * g)]

    # -- the declaration (attnlab.models.declare) ---------------------------------------------

    reads = "image"  # a file path, or test:N for the N-th image of the run's test split

    @property
    def predicts(self) -> str:
        """A class, or nothing for a ViT without a classifier (Hugging Face's ViTModel)."""
        return "class" if self.head is not None else "nothing"

    tokenizer_fields = (  # a ViT's "tokenizer" reads images and names the classes (data.images)
        ("n_classes", "vocab_size", "tokenizer.json"),
        ("image_size", "image_size", "tokenizer.json"),
        ("channels", "channels", "tokenizer.json"),
    )
    gradient_site = "patch_embed.patches"
    examples = (dict(image_size=8, patch_size=2, channels=1, n_classes=10, n_layer=2, n_head=2,
                     d_model=16, dropout=0.0),)  # fmt: skip
    gradient_first_token = 1  # [CLS] has no pixels

    @classmethod
    def default_task(cls, config: dict) -> str | None:
        return "vision"

    gradient_note = "attributions of each patch's pixels, baseline a black image"
    hook_points = {
        "patch_embed.patches": "the flattened pixels of each patch (B, N, P*P*channels)",
        "embed": "patch embeddings (B, N, C)",
        "embed_cls": "[CLS] followed by the patch embeddings (B, N + 1, C)",
        "pos": "position embeddings of [CLS] and every patch (1, N + 1, C)",
        "blocks.{i}.resid_pre": "the residual stream entering block i",
        "blocks.{i}.attn.weights": "attention probabilities (B, H, N + 1, N + 1)",
        "blocks.{i}.attn.z": "each head's output before the projection",
        "blocks.{i}.resid_post": "the residual stream leaving block i",
        "ln_f": "the final normalised states",
        "class_logits": "class logits (B, n_classes), read from [CLS]",
    }

    def prepare(self, tokenizer, text: str, like: Prepared | None = None, decode=None) -> Prepared:
        """The image ``text`` names, (1, C, H, W); one output, the class read at [CLS], whose
        target is the image's true class when the split names it, else the model's answer."""
        if tokenizer is None or not hasattr(tokenizer, "read"):
            raise InputError("this run has no image tokenizer (tokenizer.json), so it cannot "
                             "read an image")  # fmt: skip
        from attnlab.data import DataError

        try:
            image, label = tokenizer.read(text)  # (C, H, W)
        except DataError as e:
            raise InputError(str(e)) from None
        x = image[None].to(next(self.parameters()).device)
        labels, n = self.token_labels(), self.config.n_patches + 1
        classes = list(tokenizer.classes)
        p = Prepared(text, (x,), ["[CLS]"], [0], labels, torch.full((1,), -100), 0,
                     {"image": image, "label": label, "grid": self.config.grid},
                     {"": labels}, {"": list(range(n))},
                     {"image": image.cpu(), "patch_size": self.config.patch_size,
                      "truth": label, "classes": classes})  # fmt: skip
        if self.head is None:
            return p  # no classifier: nothing to predict, no target
        with torch.no_grad():
            pred = int(self.forward_logits(x)[0, 0].argmax())
        truth = classes.index(label) if label is not None and classes else pred
        p.targets = torch.tensor([truth])
        return p

    def _no_head(self) -> InputError:
        return InputError("this ViT has no classifier (a Hugging Face ViTModel): it predicts "
                          "nothing; trace, attention, similarity, influence and explore read "
                          "it")  # fmt: skip

    def forward_logits(self, images: Tensor) -> Tensor:
        if self.head is None:
            raise self._no_head()
        return self(images)[:, None]  # (B, 1, n_classes): one output position, [CLS]

    def record_logits(self, args: tuple) -> Tensor | None:
        if self.head is None:
            self(*args)  # runs (and records) the blocks; the output is no prediction
            return None
        return self.forward_logits(*args)

    def readout(self, h: Tensor, stack: str | None = None) -> Tensor:
        if self.head is None:
            raise self._no_head()
        return self.head(self.ln_f(h)[:, 0])[:, None]

    def dla_embeddings(self, cache, position: int) -> list[tuple[str, Tensor]]:
        return [("cls_token", self.cls_token[0, 0]), ("pos", self.pos_embed[0, 0])]

    def dla_readout(self) -> list:
        if self.head is None:
            raise self._no_head()
        return [Unembed(self.head.weight, self.head.bias, "head.bias")]

    def output_name(self, tokenizer, classes, i: int) -> str:
        return classes[i] if classes and i < len(classes) else str(i)

    def output_id(self, tokenizer, classes, token: str) -> int:
        return class_id(classes, self.config.n_classes, token)

    def probe_inputs(self, batch: int = 2, seed: int = 0, length: int = 16) -> Tensor:
        """Random images in [0, 1] (batch, C, H, W) for ``attnlab check`` and the head scores
        (``length``: the image's size decides it)."""
        c = self.config
        g = torch.Generator().manual_seed(seed)
        x = torch.rand(batch, c.channels, c.image_size, c.image_size, generator=g)
        return x.to(next(self.parameters()).device)
