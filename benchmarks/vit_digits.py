"""The default ViT on the built-in 8x8 digits: held-out accuracy and training time, and a figure.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/vit_digits.py [--png docs/vit_digits_cls_attention.png]

Trains exactly what ``attnlab train --task classify --data digits --arch vit`` trains (the
default: patches 2x2, 2 layers, 4 heads, d_model 64, 600 steps of 64 images), then prints a
table of test accuracy (359 held-out images, never seen in training) and wall time.

The figure: a few test digits, each beside the attention of the [CLS] token over its 16
patches in the last layer (one head), each patch's weight spread over its 2x2 pixels.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from attnlab.inspect.recording import record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--png", default="docs/vit_digits_cls_attention.png")
    p.add_argument("--head", type=int, default=0)
    p.add_argument("--examples", type=int, default=4, help="test digits in the figure")
    args = p.parse_args()

    import torch

    from attnlab.cli import main as cli
    from attnlab.run import load_run

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()) as out:
            rc = cli(["train", "--task", "classify", "--data", "digits", "--arch", "vit",
                      "--out", str(run), "--quiet"])  # fmt: skip
        wall = time.perf_counter() - start
        assert rc == 0, out.getvalue()
        cfg = json.loads((run / "config.json").read_text())
        model, tok = load_run(run)
        recs = [record(model, tok, f"test:{i}") for i in range(args.examples)]
        truths = [tok.read(f"test:{i}")[1] for i in range(args.examples)]

    c, t = model.config, cfg["train_config"]
    rows = [
        ("data", f"digits 8x8, {cfg['n_train']} train / {cfg['n_val']} val / {cfg['n_test']} test"),
        ("model", f"{c.n_patches} patches of {c.patch_size}x{c.patch_size}, {c.n_layer} layers, "
                  f"{c.n_head} heads, d_model {c.d_model}, {model.num_params():,} parameters"),
        ("training", f"{t['max_iters']} steps x {t['batch_size']} images, lr {t['lr']:g}"),
        ("val accuracy", f"{cfg['val_accuracy']:.4f}"),
        ("test accuracy", f"{cfg['test_accuracy']:.4f} ({cfg['test_correct']}/{cfg['n_test']})"),
        ("wall time", f"{wall:.1f} s (train + final test evaluation, 1 thread)"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnlab.render.plots import heatmap

    layer = c.n_layer - 1
    fig, axes = plt.subplots(2, args.examples, figsize=(1.6 * args.examples, 3.4))
    for k, (rec, truth) in enumerate(zip(recs, truths)):
        image = rec.cache["patch_embed.patches"]  # (1, N, P*P): rebuild the picture from it
        grid, P = c.grid, c.patch_size
        img = image[0].view(grid, grid, P, P).permute(0, 2, 1, 3).reshape(grid * P, grid * P)
        w = rec.weights(f"blocks.{layer}.attn.weights")[args.head, 0, 1:]  # [CLS] -> patches
        heat = np.kron(w.view(grid, grid).numpy(), np.ones((P, P)))  # each patch over P x P
        guess = tok.classes[int(rec.logits[0, 0].argmax())]
        axes[0, k].imshow(img.numpy(), cmap="gray_r")
        axes[0, k].set_title(f"true {truth}, says {guess}", fontsize=8)
        heatmap(axes[1, k], heat, vmin=None, colorbar=False)  # the image's own range
        axes[1, k].set_title(f"[CLS] attn L{layer} H{args.head}", fontsize=8)
        for ax in axes[:, k]:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.tight_layout()
    Path(args.png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=80)
    print(f"figure: {args.png} ({Path(args.png).stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
