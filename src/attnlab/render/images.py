"""A ViT's image in the pictures: its patches as thumbnails beside the attention matrix (the
image under [CLS]'s attention is ``attnlab.render.plots.overlay``), and as a PNG ``data:`` URI
for the explorer page.

A ViT's tokens are [CLS] then the patches row by row from the top left: token n >= 1 is the
patch at row (n - 1) // grid, column (n - 1) % grid, of ``patch`` x ``patch`` pixels.
"""

from __future__ import annotations

import base64
import io

import numpy as np


def as_hwc(image) -> np.ndarray:
    """(C, H, W) tensor or array in [0, 1] -> (H, W) gray or (H, W, 3) RGB array for drawing."""
    a = np.asarray(image.detach().cpu() if hasattr(image, "detach") else image, dtype=np.float32)
    a = np.clip(a, 0.0, 1.0)
    return a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0)


def patch_of(image: np.ndarray, n: int, patch: int) -> np.ndarray:
    """Pixels of patch n (0-based, row by row) of an (H, W[, 3]) image."""
    grid = image.shape[1] // patch
    r, c = divmod(n, grid)
    return image[r * patch : (r + 1) * patch, c * patch : (c + 1) * patch]


def png_data_uri(image, scale: int = 1) -> str:
    """The image as a PNG ``data:`` URI (gray images with a gray colour map), for HTML."""
    import matplotlib.image as mpimg

    a = as_hwc(image)
    if scale > 1:
        a = np.repeat(np.repeat(a, scale, axis=0), scale, axis=1)
    buf = io.BytesIO()
    mpimg.imsave(buf, a, cmap="gray" if a.ndim == 2 else None, vmin=0.0, vmax=1.0, format="png")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def patch_ticks(ax, image: np.ndarray, patch: int, queries: list[str], keys: list[str]) -> None:
    """Put each patch's thumbnail beside its row (left) and column (top) of a token x token
    matrix drawn with ``imshow``; [CLS] keeps its text label."""
    from matplotlib.offsetbox import AnnotationBbox, OffsetImage

    cmap = "gray" if image.ndim == 2 else None
    zoom = max(1.0, 14.0 / patch)
    for axis, labels in (("y", queries), ("x", keys)):
        for i, label in enumerate(labels):
            if not _is_patch(label):
                continue
            box = OffsetImage(patch_of(image, int(_index(label, image, patch)), patch),
                              zoom=zoom, cmap=cmap, norm=None)  # fmt: skip
            box.get_children()[0].set_clim(0.0, 1.0)
            xy, offset = ((-0.5, i), (-52, 0)) if axis == "y" else ((i, -0.5), (0, 12))
            ax.add_artist(AnnotationBbox(box, xy, xybox=offset, xycoords="data",
                                         boxcoords="offset points", frameon=False,
                                         annotation_clip=False))  # fmt: skip


def _is_patch(label: str) -> bool:
    return label.startswith("r") and "c" in label and label[1:].replace("c", "", 1).isdigit()


def _index(label: str, image: np.ndarray, patch: int) -> int:
    """'r1c2' -> the patch number, row by row."""
    r, c = label[1:].split("c")
    return int(r) * (image.shape[1] // patch) + int(c)
