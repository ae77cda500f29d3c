"""The vision transformer: patch embedding, shapes, unmasked attention, recording, run dirs,
and the image data it trains on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.config import ConfigError
from attnlab.data import DataError
from attnlab.data import images as im
from attnlab.inspect import check
from attnlab.models.vit import ViT, ViTConfig, patchify
from attnlab.run import load_run
from attnlab.rundir import save_model


def tiny(**kw) -> ViT:
    cfg = dict(image_size=8, patch_size=2, channels=1, n_classes=10, n_layer=2, n_head=2)
    return ViT(ViTConfig(**{**cfg, "d_model": 16, **kw})).eval()


RANDOM_CONFIGS = [  # (image_size, patch_size, channels)
    (8, 2, 1),
    (8, 4, 3),
    (6, 3, 2),
    (4, 1, 1),
    (12, 4, 3),
]


def test_patch_embedding_matches_a_hand_computation():
    """x_n = W flatten(patch_n) + b, patches row by row, numbers channel, row, column."""
    P, C, S = 2, 2, 4
    model = tiny(image_size=S, patch_size=P, channels=C)
    pe = model.patch_embed
    img = torch.randn(1, C, S, S)
    out = pe(img)[0]  # (N, d)
    grid = S // P
    for n in range(grid * grid):
        r, c = divmod(n, grid)
        flat = torch.tensor(
            [
                float(img[0, ch, r * P + i, c * P + j])
                for ch in range(C)
                for i in range(P)
                for j in range(P)
            ]
        )
        want = pe.proj.weight @ flat + pe.proj.bias
        torch.testing.assert_close(out[n], want, rtol=1e-5, atol=1e-5)


def test_patchify_of_a_known_image():
    img = torch.arange(16.0).view(1, 1, 4, 4)  # pixel value = 4 * row + col
    patches = patchify(img, 2)[0]  # (4, 4)
    assert patches.tolist() == [
        [0, 1, 4, 5],
        [2, 3, 6, 7],
        [8, 9, 12, 13],
        [10, 11, 14, 15],
    ]


@pytest.mark.parametrize("size,patch,channels", RANDOM_CONFIGS)
def test_patch_embedding_equals_a_strided_conv2d(size, patch, channels):
    pe = tiny(image_size=size, patch_size=patch, channels=channels).patch_embed
    x = torch.randn(3, channels, size, size)
    conv = pe.as_conv2d()(x)  # (B, d, grid, grid)
    torch.testing.assert_close(pe(x), conv.flatten(2).transpose(1, 2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size,patch,channels", RANDOM_CONFIGS)
def test_shapes(size, patch, channels):
    model = tiny(image_size=size, patch_size=patch, channels=channels, n_classes=7)
    B, N = 3, (size // patch) ** 2
    logits, cache = model(torch.rand(B, channels, size, size), record=True)
    assert logits.shape == (B, 7)
    assert cache["patch_embed.patches"].shape == (B, N, channels * patch * patch)
    assert cache["embed"].shape == (B, N, 16)
    for layer in range(2):
        assert cache[f"blocks.{layer}.attn.weights"].shape == (B, 2, N + 1, N + 1)
        assert cache[f"blocks.{layer}.resid_post"].shape == (B, N + 1, 16)
    assert len(model.token_labels()) == N + 1


def test_cls_attends_over_every_patch_without_a_mask():
    model = tiny()
    x = torch.rand(2, 1, 8, 8)
    _, cache = model(x, record=True)
    for layer in range(2):
        w = cache[f"blocks.{layer}.attn.weights"]  # (B, H, 17, 17)
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
        assert (w > 0).all(), "no key is masked: softmax weights are all positive"
    # Change only the last patch (bottom-right 2x2): [CLS] and the first patch both move.
    y = x.clone()
    y[:, :, 6:, 6:] += 1.0
    _, other = model(y, record=True)
    moved = (other["blocks.0.resid_post"] - cache["blocks.0.resid_post"]).abs().amax(-1)  # (B, 17)
    assert (moved[:, :2] > 1e-4).all(), "earlier positions see a later patch (not causal)"


def test_recording_does_not_change_the_output():
    model = tiny()
    x = torch.rand(4, 1, 8, 8)
    plain = model(x)
    recorded, cache = model(x, record=True)
    torch.testing.assert_close(plain, recorded, rtol=1e-5, atol=1e-5)
    assert "blocks.1.attn.weights" in cache and "class_logits" in cache


def test_wrong_image_shape_is_a_clear_error():
    with pytest.raises(ValueError, match=r"expected images \(B, 1, 8, 8\)"):
        tiny()(torch.rand(2, 1, 16, 16))


@pytest.mark.parametrize(
    "bad,needle",
    [
        (dict(image_size=10, patch_size=3), "divisible by patch_size"),
        (dict(n_classes=1), "n_classes"),
        (dict(d_model=10, n_head=3), "divisible by n_head"),
        (dict(channels=0), "channels"),
        (dict(dropout=1.0), "dropout"),
    ],
)
def test_config_validates_itself(bad, needle):
    with pytest.raises(ConfigError, match=needle):
        ViTConfig(**bad)


def test_config_round_trips_through_json():
    c = ViTConfig(image_size=12, patch_size=4, channels=3, n_classes=5, d_ff=40)
    assert ViTConfig.from_json(c.to_json()) == c


def test_token_labels():
    labels = tiny().token_labels()
    assert labels[0] == "[CLS]" and labels[1] == "r0c0" and labels[6] == "r1c1"
    assert labels[-1] == "r3c3" and not any(" " in t for t in labels)


def test_conformance_checks_pass():
    report = check(tiny())
    assert report.ok
    assert report["recording == no recording"].passed
    assert report["fused == reference attention"].passed
    assert report["future leak"].passed is None  # not causal: skipped


def test_run_dir_round_trip_is_bit_exact(tmp_path):
    model = tiny(channels=3, image_size=4, n_classes=3)
    tok = im.ImageTokenizer("digits", ["a", "b", "c"], 4, 3, seed=5, val_fraction=0.1)
    save_model(tmp_path / "run", model, tok)
    loaded, tok2 = load_run(tmp_path / "run")
    for (k, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), k
    x = torch.rand(5, 3, 4, 4)
    assert torch.equal(model(x), loaded(x))
    assert isinstance(tok2, im.ImageTokenizer) and tok2.to_dict() == tok.to_dict()


# -- data ------------------------------------------------------------------------------------


def test_split_is_disjoint_complete_and_seeded():
    tr, va, te = im.split(500, 0.1, seed=3)
    every = torch.cat([tr, va, te])
    assert sorted(every.tolist()) == list(range(500))
    assert len(te) == 100 and len(va) == 50
    again = im.split(500, 0.1, seed=3)
    assert all(torch.equal(a, b) for a, b in zip((tr, va, te), again))
    assert not torch.equal(te, im.split(500, 0.1, seed=4)[2])


def test_random_batches_resume_where_they_left_off():
    X, Y = torch.rand(50, 1, 4, 4), torch.arange(50)
    a = im.RandomImageBatches(X, Y, 8, seed=1)
    for _ in range(3):
        next(a)
    b = im.RandomImageBatches(X, Y, 8, seed=1)
    b.load_state_dict(a.state_dict())
    xa, ya = next(a)
    xb, yb = next(b)
    assert torch.equal(ya, yb) and torch.equal(xa, X[ya])
    assert len(set(ya.tolist())) == 8, "no image twice in one batch"


def test_digits_are_8x8_in_unit_range():
    pytest.importorskip("sklearn")
    d = im.load_digits()
    assert d.images.shape == (1797, 1, 8, 8) and d.labels.shape == (1797,)
    assert float(d.images.min()) >= 0.0 and float(d.images.max()) == 1.0
    assert d.classes == [str(i) for i in range(10)]


def _save(path, array):
    import matplotlib.image as mpimg

    path.parent.mkdir(parents=True, exist_ok=True)
    mpimg.imsave(path, array, cmap="gray" if array.ndim == 2 else None, vmin=0, vmax=1)


def test_image_folder(tmp_path):
    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        for i in range(3):
            _save(tmp_path / label / f"{i}.png", rng.random((6, 6, 3)))
    d = im.load_images(str(tmp_path))
    assert d.images.shape == (6, 3, 6, 6) and d.classes == ["cat", "dog"]
    assert d.labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert float(d.images.min()) >= 0.0 and float(d.images.max()) <= 1.0


def test_image_folder_with_mixed_sizes_is_refused(tmp_path):
    _save(tmp_path / "a" / "0.png", np.zeros((6, 6, 3)))
    _save(tmp_path / "b" / "0.png", np.zeros((8, 8, 3)))
    with pytest.raises(DataError, match="same size"):
        im.load_images(str(tmp_path))


def test_image_tokenizer_reads_gray_pngs_and_refuses_other_sizes(tmp_path):
    tok = im.ImageTokenizer("digits", [str(i) for i in range(10)], 8, 1, 0, 0.1)
    img = np.random.default_rng(1).random((8, 8))
    _save(tmp_path / "g.png", img)  # matplotlib stores gray as RGBA with R = G = B
    x = tok.image(str(tmp_path / "g.png"))
    assert x.shape == (1, 8, 8)
    assert np.abs(x[0].numpy() - img).max() < 2 / 255  # the 8-bit gray colormap only
    _save(tmp_path / "big.png", np.zeros((16, 16)))
    with pytest.raises(DataError, match="16x16"):
        tok.image(str(tmp_path / "big.png"))
    with pytest.raises(DataError, match="no such image file"):
        tok.image(str(tmp_path / "missing.png"))
