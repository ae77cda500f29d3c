"""A self-contained HTML page to explore a recording: no network, no CDN, inline JS and CSS.

The page holds a layer and head selector, a head view (token-to-token lines, hover a token to
see only its lines), the selected matrix, the influence bars of the selected layer, and a model
view (the grid of every map x head; click one to select it). It says what the model is; for a
ViT it shows the image, each patch's thumbnail beside its token, and where [CLS] (or the hovered
patch) looks on the image. It is driven purely by the
``Recording``'s attention maps and labels, so encoder self-attention and encoder-decoder
cross-attention (queries and keys from different stacks, labelled as such) work unchanged.

Size: weights are stored as integers in thousandths (3 decimals). Long inputs are cut to a
window of ``max_tokens`` tokens per stack (default 128, the page says so), and ``start`` pages
through the rest; rows then show only the keys inside the window.
"""

from __future__ import annotations

import html as html_lib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from attnlab.inspect.display import Result
from attnlab.inspect.influence import influence, influence_bars
from attnlab.inspect.recording import InspectError, Recording
from attnlab.inspect.similarity import layer_label

SCALE = 1000  # weights stored as round(w * SCALE): 3 decimals
MAX_TOKENS = 128


@dataclass
class Explorer(Result):
    """The explorer page: ``html`` (a complete document) and the ``data`` it embeds."""

    html: str
    data: dict

    @property
    def size(self) -> int:
        """Bytes of the page as UTF-8."""
        return len(self.html.encode("utf-8"))

    def save(self, path: str | Path) -> Path:
        from attnlab.files import atomic_write_text

        path = Path(path)
        atomic_write_text(path, self.html)
        return path

    def __rich__(self):
        n_maps = len(self.data["maps"])
        heads = sum(len(m["w"]) for m in self.data["maps"])
        line = f"explorer: {n_maps} attention maps, {heads} heads, {self.size / 1024:.0f} KiB"
        return line + (f"\n{self.data['note']}" if self.data["note"] else "")

    def to_dict(self) -> dict:
        return self.data

    def _repr_html_(self) -> str:
        # An iframe keeps the page's script and styles apart from the notebook's.
        return (
            f'<iframe srcdoc="{html_lib.escape(self.html, quote=True)}" '
            'style="width:100%;height:760px;border:1px solid #ddd"></iframe>'
        )


def _window(n: int, start: int, max_tokens: int) -> tuple[int, int]:
    a = max(0, min(start, max(0, n - max_tokens)))
    return a, min(n, a + max_tokens)


def explorer_data(
    rec: Recording, model=None, title: str = "", max_tokens: int = MAX_TOKENS, start: int = 0
) -> dict:
    """Everything the page draws, as plain JSON-able data."""
    if max_tokens < 1:
        raise InspectError("max_tokens must be at least 1")
    if not rec.maps():
        about = f" ({rec.description})" if rec.description else ""
        raise InspectError(f"this model has no attention maps to explore{about}; try trace")
    windows = {s: _window(len(t), start, max_tokens) for s, t in rec.tokens.items()}
    notes = []
    for s, (a, b) in windows.items():
        n = len(rec.tokens[s])
        if (a, b) != (0, n):
            what = f"{s} tokens" if s else "tokens"
            notes.append(
                f"showing {what} {a}..{b - 1} of {n} (the page is capped at {max_tokens} per "
                "sequence to stay small; pass --start to page, --max-tokens to raise the cap). "
                "Rows show only the keys inside this window."
            )
    stacks = {
        s: {"tokens": rec.tokens[s][a:b], "offset": a, "total": len(rec.tokens[s])}
        for s, (a, b) in windows.items()
    }
    maps = []
    for info in rec.maps():
        qa, qb = windows[info.query_stack]
        ka, kb = windows[info.key_stack]
        w = rec.weights(info.name).numpy()[:, qa:qb, ka:kb]  # (H, T, S) inside the window
        ints = np.rint(np.clip(w, 0.0, 1.0) * SCALE).astype(np.int64)
        prefix = info.module_path.rsplit(".", 1)[0] + "." if "." in info.module_path else ""
        maps.append(
            {
                "name": info.name,
                "label": info.label,
                "kind": info.kind,
                "layer": info.layer,
                "block": layer_label(prefix) if prefix else "",
                "qstack": info.query_stack,
                "kstack": info.key_stack,
                "T": int(w.shape[1]),
                "S": int(w.shape[2]),
                "w": [h.reshape(-1).tolist() for h in ints],
            }
        )
    bars = []
    if rec.blocks():
        bars = influence_bars(influence(model, rec))
        for b in bars:
            stack = next((s for s, t in rec.tokens.items() if t == b["tokens"]), "")
            a, e = windows.get(stack, (0, len(b["tokens"])))
            b["tokens"], b["rel_change"] = b["tokens"][a:e], b["rel_change"][a:e]
    top = max((v for b in bars for v in b["rel_change"]), default=1.0)
    image = None
    if rec.extra.get("image") is not None:  # a ViT: the image its patch tokens come from
        from attnlab.inspect.images import png_data_uri

        img = rec.extra["image"]
        image = {"src": png_data_uri(img), "patch": int(rec.extra["patch_size"]),
                 "grid": int(img.shape[-1]) // int(rec.extra["patch_size"]),
                 "truth": rec.extra.get("truth")}  # fmt: skip
    return {
        "title": title,
        "about": rec.about,
        "note": " ".join(notes),
        "scale": SCALE,
        "stacks": stacks,
        "maps": maps,
        "influence": bars,
        "influence_max": top,
        "image": image,
    }


def page(data: dict, tabs: dict[str, str] | None = None) -> str:
    """The HTML document with ``data`` inlined (``</`` escaped so it cannot close the script).

    ``tabs`` (title -> a self-contained HTML fragment, e.g. a result's ``_repr_html_``) adds a
    tab per entry beside the attention views, which become the first tab."""
    template = (
        resources.files("attnlab.inspect").joinpath("explorer.html").read_text(encoding="utf-8")
    )
    nav = panes = ""
    if tabs:
        ids = [f"pane-{i}" for i in range(len(tabs))]
        buttons = ['<button class="on" data-pane="pane-attention">attention</button>'] + [
            f'<button data-pane="{i}">{html_lib.escape(t)}</button>' for i, t in zip(ids, tabs)
        ]
        nav = f'<div id="tabs">{"".join(buttons)}</div>'
        panes = "".join(f'<div id="{i}" class="tabpane" style="display:none">{body}</div>'
                        for i, body in zip(ids, tabs.values()))  # fmt: skip
    blob = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    # the fragments go in first: the data blob may itself contain the placeholder text
    out = template.replace("<!--ATTNLAB_TABS_NAV-->", nav)
    out = out.replace("<!--ATTNLAB_TABS_PANES-->", panes)
    return out.replace("__ATTNLAB_DATA__", blob)


def _joined(tokens: list[str]) -> str:
    if len(tokens) > 120:
        return f"{len(tokens)} tokens"
    return ("" if all(len(t) <= 1 for t in tokens) else " ").join(tokens)


def explore(
    rec: Recording,
    model=None,
    title: str | None = None,
    max_tokens: int = MAX_TOKENS,
    start: int = 0,
    tabs: dict[str, str] | None = None,
) -> Explorer:
    """Build the explorer page for ``rec`` (``model`` adds the W_O-weighted influence sources;
    ``tabs`` adds tabs of other results, see ``page``)."""
    if title is None:
        title = "attnlab explorer: " + " | ".join(_joined(t) for t in rec.tokens.values())
    data = explorer_data(rec, model, title, max_tokens, start)
    return Explorer(page(data, tabs), data)
