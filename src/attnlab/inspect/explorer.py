"""A self-contained HTML page to explore a recording: no network, no CDN, inline JS and CSS.

The page holds a layer and head selector, a head view (token-to-token lines, hover a token to
see only its lines), the selected matrix (attention weights, or the scaled scores before the
softmax), what the model predicts, the influence bars of the selected layer, a Q·K neuron view
and a model view (the grid of every map x head; click one to select it). It says what the model
is; for a ViT it shows the image, each patch's thumbnail beside its token, and where [CLS] (or
the hovered patch) looks on the image. It is driven purely by the ``Recording``'s attention maps
and labels, so encoder self-attention and encoder-decoder cross-attention (queries and keys from
different stacks, labelled as such) work unchanged.

The neuron view: for one head and one query token, the recorded query vector q and every key
vector k dimension by dimension, their elementwise products q_d k_d, and the sum
q·k = sum_d q_d k_d, times 1/sqrt(d_k): the scaled score, the number the softmax reads. It reads
the ``q`` and ``k`` hooks (after rotary, where a model has it) and applies where the recorded
``scores`` are exactly q·k/sqrt(d_k) (checked here, per map, when the page is built); elsewhere
(an LSTM's additive attention) the page says why not in one line. Where the page knows the
run and input it was made from (``attnlab explore``, ``attnlab serve``) and the model has a
residual graph, the view names the ``attnlab why`` command that splits the same score by
writer instead of by dimension: which embeddings, heads and feed-forwards on the query side and
on the key side make it.

The prediction: what ``trace`` ends with (the next tokens, each [MASK]'s fillers, the classes,
the translation and each decoder step's next token), read from its steps' data; it needs the
tokenizer.

Size: q and k are stored as little-endian float32 in base64 (exact, 5.3 characters a number),
with one bit per (query, key) saying whether the query may see the key. Where the softmax of
q·k/sqrt(d_k) over those keys reproduces the recorded weights (to 1e-5, checked here), the page
computes the weights itself and carries no others: its size grows as tokens x width, not
tokens squared. Elsewhere (no q and k, or a window that cuts off keys a query sees) the weights
are stored as integers in thousandths (3 decimals). Long inputs are cut to a window of
``max_tokens`` tokens per stack (default 128, the page says so), and ``start`` pages through
the rest; rows then show only the keys inside the window.
"""

from __future__ import annotations

import base64
import html as html_lib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from attnlab.attention import MultiHeadAttention
from attnlab.inspect.influence import influence, influence_bars
from attnlab.inspect.recording import InspectError, Recording
from attnlab.inspect.similarity import layer_label
from attnlab.render.display import Result, script_json

SCALE = 1000  # weights stored as round(w * SCALE): 3 decimals
MAX_TOKENS = 128
TOP_K = 5  # predictions shown per position
SCORE_TOL = 1e-5  # q·k/sqrt(d_k) must match the recorded scores to this (relative to max(1, |s|))
NO_QK = (
    "no Q·K neuron view for this attention: it records no per-head query and key vectors "
    "(q, k), so its score is not a dot product q·k/√d_k to split by dimension (an LSTM's "
    "additive score v·tanh(W_q h + W_k s) is one such); `attnlab trace` shows its scores."
)


@dataclass
class Explorer(Result):
    """The explorer page: ``data`` (what it draws) and ``html``, the complete document that
    embeds it, written out the first time it is read (``make_html``): the workbench reads only
    the data, and the document of a 24-layer model's maps is megabytes of JSON."""

    data: dict
    make_html: Callable[[], str] = field(repr=False, compare=False)

    @cached_property
    def html(self) -> str:
        return self.make_html()

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
        heads = sum(m["H"] for m in self.data["maps"])
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


def _b64(x: np.ndarray) -> str:
    """An array as little-endian float32 bytes in base64 (the page decodes it exactly)."""
    return base64.b64encode(np.ascontiguousarray(x, dtype="<f4").tobytes()).decode("ascii")


def _neuron(rec: Recording, info, model, windows) -> dict:
    """What the Q·K neuron view of one map needs: q (H, T, d_k) and k (H_kv, S, d_k) inside the
    windows as float32, 1/sqrt(d_k), the keys each query may see (recorded weight > 0), and how
    far the recorded scores are from q·k/sqrt(d_k); or ``why`` it does not apply."""
    path = info.module_path
    q, k, s = (rec.cache.get(f"{path}.{n}") for n in ("q", "k", "scores"))
    if q is None or k is None or q.dim() != 4 or k.dim() != 4:
        return {"why": NO_QK}
    qa, qb = windows[info.query_stack]
    ka, kb = windows[info.key_stack]
    q = q[0, :, qa:qb].double()  # (H, T, d_k)
    k = k[0, :, ka:kb].double()  # (H_kv, S, d_k)
    H, Hk, D = q.shape[0], k.shape[0], q.shape[-1]
    if Hk == 0 or H % Hk or k.shape[-1] != D:
        return {"why": NO_QK}
    scale = 1.0 / math.sqrt(D)
    if s is None:
        return {"why": "no Q·K neuron view for this attention: it records q and k but not the "
                       "scores to check q·k/√d_k against."}  # fmt: skip
    mine = (q @ k.repeat_interleave(H // Hk, 0).transpose(-1, -2)) * scale  # (H, T, S)
    recorded = s[0, :, qa:qb, ka:kb].double()  # (H, T, S) scaled, before the mask
    err = float((mine - recorded).abs().max()) if mine.numel() else 0.0
    if mine.shape != recorded.shape or err > SCORE_TOL * max(1.0, float(recorded.abs().max())):
        return {"why": "no Q·K neuron view for this attention: its recorded scores are not "
                       f"q·k/√d_k (they differ by up to {err:.3g}): it scores otherwise, e.g. "
                       "with another scale or a cap."}  # fmt: skip
    w = rec.weights(info.name)[:, qa:qb, ka:kb].double()  # (H, T, S)
    sees = (w > 0).any(0)  # (T, S): masked keys have weight exactly 0 in every head
    all_keys = (ka, kb) == (0, len(rec.tokens[info.key_stack]))
    # the page derives the weights as the model does, softmax over the keys a query may see,
    # when that reproduces the recorded ones (so it need not carry them); a window that cuts off
    # keys a query sees, or an attention that weighs otherwise, keeps its rounded weights
    werr = float((_softmax_seen(mine, sees) - w).abs().max()) if w.numel() else 0.0
    derived = werr <= SCORE_TOL
    module = model.get_submodule(path) if model is not None else None
    return {
        "D": D,
        "scale": scale,
        "group": H // Hk,  # query heads per key head (1 without grouped-query attention)
        "q": [_b64(h.numpy()) for h in q],
        "k": [_b64(h.numpy()) for h in k],
        "sees": base64.b64encode(np.packbits(sees.numpy().reshape(-1)).tobytes()).decode("ascii"),
        "all_keys": all_keys,
        "derived": derived,  # the page computes the weights from q, k and ``sees``
        "wcheck": werr,  # max |that softmax - recorded weight| over the map
        "check": err,  # max |q·k/sqrt(d_k) - recorded score| over the map, float64 from float32
        "rotary": _rotary(module),
    }


def _rotary(module) -> bool | None:
    """Whether the attention module rotates q and k (None: no module to read)."""
    if module is None:
        return None
    return isinstance(module, MultiHeadAttention) and module.rotary is not None


def _softmax_seen(scores, sees):
    """Softmax of (H, T, S) scores over the keys ``sees`` (T, S) allows; zeros where none."""
    masked = scores.masked_fill(~sees, float("-inf"))
    top = masked.amax(-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).min)  # (H, T, 1)
    e = (masked - top).exp()
    return e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).tiny)


def _prediction(rec: Recording, model, tokenizer, top_k: int = TOP_K) -> dict:
    """What the model predicts, from the data of ``trace``'s closing steps: a list of sections
    (a title and up to ``top_k`` labels with probabilities, at a position when it has one),
    the decoded output text when there is one, and the steps' own explanation."""
    if model is None or tokenizer is None:
        return {"sections": [], "note": "no prediction: the page was built without the model's "
                                        "tokenizer (explore(rec, model, tokenizer))"}  # fmt: skip
    from attnlab.inspect.trace import trace

    try:
        tr = trace(model, tokenizer, rec.text, top_k=top_k, rec=rec)
    except (ValueError, KeyError, IndexError, AttributeError) as e:  # ValueError: AttnlabError
        return {"sections": [], "note": f"no prediction: {e}"}
    only = next(iter(rec.tokens)) if len(rec.tokens) == 1 else None
    out: dict = {"sections": [], "note": "", "meaning": []}

    def add(title, items, name, p, stack=None, at=None, **more):
        sec = {"title": title, "items": [{"label": str(x[name]), "p": round(float(x[p]), 6)}
                                         for x in items]}  # fmt: skip
        if stack is not None and at is not None:  # the query token the prediction is read at
            sec.update(stack=stack, at=int(at))
        out["sections"].append({**sec, **more})

    for step in tr.steps:
        x = step.extra
        if "predictions" in x:
            add(step.title, x["predictions"], "token", "prob", only, len(tr.tokens) - 1)
        elif "masks" in x:
            for f in x["masks"]:
                at = f[0]["position"]
                word = f" ({rec.tokens[only][at]})" if only is not None else ""
                add(f"position {at}{word}", f, "token", "p", only, at)
            if not x["masks"]:
                out["note"] = f"{step.title}: {step.meaning}"
        elif "classes" in x:
            truth = {"truth": str(x["truth"])} if x.get("truth") is not None else {}
            add(step.title, x["classes"], "label", "prob", **truth)
        elif "decoder_steps" in x:
            fed = [r["fed"] for r in x["decoder_steps"]]
            stack = next((s for s, t in rec.tokens.items() if t == fed), None)
            for r in x["decoder_steps"]:
                add(f"step {r['step']}: fed {r['fed']}", r["next"], "token", "prob", stack,
                    r["step"])  # fmt: skip
        elif x.get("translation") is not None:
            out["output"] = str(x["translation"])
        elif step.name == "output" and not x:  # an encoder with no prediction head
            out["note"] = f"{step.title}: {step.meaning}"
            continue
        else:
            continue
        out["meaning"].append(step.meaning)
    if not out["sections"] and not out.get("output") and not out["note"]:
        out["note"] = "this model's trace names no prediction"
    return out


def explorer_data(
    rec: Recording,
    model=None,
    title: str = "",
    max_tokens: int = MAX_TOKENS,
    start: int = 0,
    tokenizer=None,
    why: dict | None = None,
) -> dict:
    """Everything the page draws, as plain JSON-able data. ``why`` ({"run": RUN, "text":
    TEXT}, what the page was made from): the neuron view names the ``attnlab why`` command that
    splits the selected score by writer, where the model has a residual graph to split it by."""
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
        neuron = _neuron(rec, info, model, windows)
        # the weights themselves only where the page cannot derive them from q and k
        ints = None if neuron.get("derived") else np.rint(np.clip(w, 0.0, 1.0) * SCALE)
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
                "H": int(w.shape[0]),
                **(
                    {}
                    if ints is None
                    else {"w": [h.astype(np.int64).reshape(-1).tolist() for h in ints]}
                ),
                "neuron": neuron,
                "module": info.module_path,  # its heads are MODULE.headH (attnlab why --head)
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
        from attnlab.render.images import png_data_uri

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
        "prediction": _prediction(rec, model, tokenizer),
        # a residual model's score splits by writer (`attnlab why`); an LSTM's has no writers
        "why": why if why and model is not None and model.residual else None,
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
    blob = script_json(data)
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
    tokenizer=None,
    why: dict | None = None,
) -> Explorer:
    """Build the explorer page for ``rec`` (``model`` adds the W_O-weighted influence sources
    and says whether q and k are rotated; with ``tokenizer`` too, the page shows what the model
    predicts; ``tabs`` adds tabs of other results, see ``page``; ``why``: see
    ``explorer_data``)."""
    if title is None:
        title = "attnlab explorer: " + " | ".join(_joined(t) for t in rec.tokens.values())
    data = explorer_data(rec, model, title, max_tokens, start, tokenizer, why)
    return Explorer(data, lambda: page(data, tabs))
