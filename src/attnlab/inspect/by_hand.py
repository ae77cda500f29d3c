"""Attention by hand: your own X, W_Q, W_K, W_V walked through the steps of ``trace``.

The notes work attention out on hand-sized numbers: "I like to eat apples" as a 5 x M matrix X,
three weight matrices, and every product in between. ``walk`` does the same with numbers you
type, paste or draw at random (the notes' 6 x 16 embedding with d_q = d_k = 24, d_v = 28):

    X (N, M)        one row per token
    Q = X W_Q       (N, d_k)        W_Q (M, d_k)
    K = X W_K       (N, d_k)        W_K (M, d_k): d_q = d_k, or Q K^T has no meaning
    V = X W_V       (N, d_v)        W_V (M, d_v): d_v may differ
    Q K^T (N, N) -> x 1/sqrt(d_k) (/ temperature) -> mask -> softmax over keys -> weights V

The attention itself is attnlab's own: ``attnlab.attention.reference_attention``, the path
``scaled_dot_product_attention`` takes when it returns the weights, so the weights and the
output are the numbers the models compute. The switches (no scale, no causal mask, a
temperature, padding) change what that function is given; ``attnlab.inspect.what_if`` shows
what each changes.

Matrices are read from JSON (a list of rows), CSV or whitespace-separated rows (``;`` also
ends a row, so a small matrix can be typed on one line: ``"1 0; 0 1"``); a row may start with
its label (the token), and a first line of labels is a header.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from attnlab.inspect.recording import InspectError
from attnlab.inspect.trace import Step
from attnlab.render.display import (
    Result,
    heatmap_html,
    matrix_table,
    preview_text,
    rounded,
    show_token,
)

# hand-sized: what a person reads and a terminal shows (past these, use a real run)
MAX_TOKENS = 256
MAX_WIDTH = 1024
MAX_MATRIX_BYTES = 8 << 20  # a matrix file read whole: 8 MiB is ~500k numbers as text
PAD = "<pad>"


class MatrixError(InspectError):
    """A matrix that cannot be read or does not fit the others: one line, exit 2."""


# ---------------------------------------------------------------------------------------------
# Reading matrices
# ---------------------------------------------------------------------------------------------


def _number(cell: str) -> float | None:
    try:
        v = float(cell)
    except ValueError:
        return None
    return v


def parse_matrix(text: str, name: str = "matrix") -> tuple[np.ndarray, list[str] | None]:
    """``text`` as a matrix (R, C) of float64 and its row labels (None if it has none).

    JSON: a list of rows (``[[1, 2], [3, 4]]``), or {"rows": labels, "values": rows}. Else CSV
    or whitespace-separated numbers, one row a line (``;`` also ends a row); a row may start
    with a label that is not a number, and a first line with no number at all is a header."""
    s = text.strip()
    if not s:
        raise MatrixError(f"{name} is empty: give rows of numbers")
    if s[0] in "[{":
        return _from_json(s, name)
    lines = [ln.strip() for ln in re.split(r"[\n;]", s) if ln.strip()]
    sep = "," if any("," in ln for ln in lines) else None
    rows, labels = [], []
    for n, line in enumerate(lines):
        cells = [c.strip() for c in (line.split(sep) if sep else line.split())]
        cells = [c for c in cells if c != ""]
        values = [_number(c) for c in cells]
        if n == 0 and all(v is None for v in values):
            continue  # a header of labels
        label = None
        if values and values[0] is None:
            label, cells, values = cells[0], cells[1:], values[1:]
        bad = next((c for c, v in zip(cells, values) if v is None), None)
        if bad is not None:
            raise MatrixError(f"{name}: row {len(rows) + 1} has {bad!r}, which is not a number")
        rows.append(values)
        labels.append(label)
    return _checked(rows, name), _labels(labels, name)


def _from_json(s: str, name: str) -> tuple[np.ndarray, list[str] | None]:
    try:
        data = json.loads(s)
    except json.JSONDecodeError as e:
        raise MatrixError(f"{name}: not valid JSON ({e.msg} at line {e.lineno})") from None
    labels = None
    if isinstance(data, dict):
        if "values" not in data:
            raise MatrixError(f'{name}: a JSON object needs "values" (rows of numbers)')
        labels, data = data.get("rows"), data["values"]
        if labels is not None and not (isinstance(labels, list)
                                       and all(isinstance(t, str) for t in labels)):  # fmt: skip
            raise MatrixError(f'{name}: "rows" must be a list of labels (strings)')
    if not isinstance(data, list) or not all(isinstance(r, list) for r in data):
        raise MatrixError(f"{name}: JSON must be a list of rows, each a list of numbers")
    rows = []
    for i, r in enumerate(data, 1):
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in r):
            raise MatrixError(f"{name}: row {i} holds something that is not a number")
        rows.append([float(v) for v in r])
    return _checked(rows, name), labels


def _checked(rows: list[list[float]], name: str) -> np.ndarray:
    if not rows or not rows[0]:
        raise MatrixError(f"{name} has no numbers")
    widths = {len(r) for r in rows}
    if len(widths) > 1:
        first = len(rows[0])
        bad = next(i for i, r in enumerate(rows, 1) if len(r) != first)
        got = len(rows[bad - 1])
        raise MatrixError(f"{name}: row {bad} has {got} number{'s' * (got != 1)}, row 1 has "
                          f"{first}")  # fmt: skip
    m = np.asarray(rows, dtype=np.float64)
    if not np.isfinite(m).all():
        raise MatrixError(f"{name}: every entry must be a finite number (no inf or nan)")
    if m.shape[0] > MAX_WIDTH or m.shape[1] > MAX_WIDTH:
        raise MatrixError(f"{name} is {m.shape[0]} x {m.shape[1]}: a hand-sized matrix has at "
                          f"most {MAX_WIDTH} rows and columns (a real run: attnlab trace)")  # fmt: skip
    return m


def _labels(labels: list[str | None], name: str) -> list[str] | None:
    if all(x is None for x in labels):
        return None
    if any(x is None for x in labels):
        raise MatrixError(f"{name}: label every row or none (row {labels.index(None) + 1} has "
                          "no label)")  # fmt: skip
    return [str(x) for x in labels]


def read_matrix(source: str, name: str = "matrix") -> tuple[np.ndarray, list[str] | None]:
    """A matrix from ``source``: the path of a file (JSON, CSV or whitespace), or the matrix
    itself as text (``"1 2; 3 4"``). See ``parse_matrix``."""
    path = Path(source)
    if "\n" not in source and len(source) < 4096 and path.is_file():
        size = path.stat().st_size
        if size > MAX_MATRIX_BYTES:
            raise MatrixError(f"{name} {source}: {size:,} bytes, past the {MAX_MATRIX_BYTES:,} "
                              "a hand-sized matrix may take")  # fmt: skip
        return parse_matrix(path.read_text(encoding="utf-8"), f"{name} ({source})")
    looks_like_path = not re.search(r"[\d\[]", source) or source.endswith((".csv", ".json", ".txt"))
    if looks_like_path and not path.exists():
        raise MatrixError(f"{name} {source}: no such file, and not a matrix of numbers")
    return parse_matrix(source, name)


# ---------------------------------------------------------------------------------------------
# The matrices of one walk
# ---------------------------------------------------------------------------------------------


@dataclass
class HandMatrices:
    """X (N, M) with its N token labels, W_Q and W_K (M, d_k), W_V (M, d_v); ``check``ed on
    construction: every mismatch is one line naming the shapes."""

    tokens: list[str]
    x: np.ndarray
    w_q: np.ndarray
    w_k: np.ndarray
    w_v: np.ndarray
    source: str = "given"  # "given", or how they were drawn ("random, seed 123")

    def __post_init__(self):
        self.x, self.w_q, self.w_k, self.w_v = (np.asarray(a, dtype=np.float64) for a in
                                                (self.x, self.w_q, self.w_k, self.w_v))  # fmt: skip
        self.tokens = [str(t) for t in self.tokens]
        self.check()

    @property
    def n(self) -> int:
        return self.x.shape[0]

    @property
    def d_k(self) -> int:
        return self.w_q.shape[1]

    @property
    def d_v(self) -> int:
        return self.w_v.shape[1]

    def check(self) -> None:
        def shape(a):
            return " x ".join(map(str, a.shape))

        for name, a in (("X", self.x), ("W_Q", self.w_q), ("W_K", self.w_k), ("W_V", self.w_v)):
            if a.ndim != 2 or 0 in a.shape:
                raise MatrixError(f"{name} must be a matrix with rows and columns, got shape "
                                  f"{a.shape}")  # fmt: skip
            if not np.isfinite(a).all():
                raise MatrixError(f"{name}: every entry must be a finite number")
        N, M = self.x.shape
        if N > MAX_TOKENS or M > MAX_WIDTH:
            raise MatrixError(f"X is {shape(self.x)}: a hand-sized X has at most {MAX_TOKENS} "
                              f"tokens and {MAX_WIDTH} columns (a real run: attnlab trace)")  # fmt: skip
        if len(self.tokens) != N:
            raise MatrixError(f"{len(self.tokens)} token labels for the {N} rows of X "
                              f"({shape(self.x)}): give one label per row")  # fmt: skip
        for name, w in (("W_Q", self.w_q), ("W_K", self.w_k), ("W_V", self.w_v)):
            if w.shape[0] != M:
                hint = ("; yours looks stored as (d, M), like torch.nn.Linear's weight: give "
                        "its transpose" if w.shape[1] == M else "")  # fmt: skip
                raise MatrixError(f"X is {shape(self.x)} but {name} is {shape(w)}: X {name} "
                                  f"needs {name} to have M = {M} rows{hint}")  # fmt: skip
            if w.shape[1] > MAX_WIDTH:
                raise MatrixError(f"{name} is {shape(w)}: at most {MAX_WIDTH} columns")
        if self.w_q.shape[1] != self.w_k.shape[1]:
            raise MatrixError(f"W_Q is {shape(self.w_q)} and W_K is {shape(self.w_k)}: Q K^T "
                              "needs d_q = d_k (the same number of columns)")  # fmt: skip

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "X": self.x.tolist(), "W_Q": self.w_q.tolist(),
                "W_K": self.w_k.tolist(), "W_V": self.w_v.tolist(), "source": self.source}  # fmt: skip


def token_labels(text: str | None, n: int | None = None) -> list[str]:
    """Labels for X's rows: ``text`` split at whitespace ("I like to eat apples": 5 tokens,
    as the notes count them), or t0 .. t{n-1}."""
    if text is not None:
        tokens = text.split()
        if not tokens:
            raise MatrixError("--tokens has no tokens: give words separated by spaces")
        return tokens
    if n is None:
        raise MatrixError("give the tokens (or X, or its number of rows)")
    return [f"t{i}" for i in range(n)]


INITS = {  # how random weights are drawn, and the words for it
    "linear": "W ~ U(-1/sqrt(M), 1/sqrt(M)), as torch starts an nn.Linear",
    "rand": "W ~ U[0, 1), torch.rand",
}


def random_matrices(n: int | None = None, m: int = 16, d_k: int = 24, d_v: int | None = None,
                    seed: int = 0, tokens: list[str] | str | None = None,
                    init: str = "linear") -> HandMatrices:  # fmt: skip
    """X (n, m) and W_Q, W_K (m, d_k), W_V (m, d_v) from one generator seeded with ``seed``:
    X from N(0, 1) (what ``nn.Embedding`` starts from); the weights as an untrained
    ``nn.Linear(M, d)`` starts, uniform in (-1/sqrt(M), 1/sqrt(M)) (``init="linear"``, as one
    note builds its W_q), or uniform in [0, 1) (``init="rand"``, ``torch.rand`` as another note
    draws them: all positive, so the scores are large and the softmax saturates). ``tokens``
    (a list, or text split at whitespace) labels the rows and gives n; ``d_v`` defaults to
    ``d_k``."""
    if init not in INITS:
        raise MatrixError(f"unknown init {init!r}: {' or '.join(INITS)}")
    if isinstance(tokens, str):
        tokens = token_labels(tokens)
    labels = list(tokens) if tokens is not None else token_labels(None, n)
    n = len(labels)
    d_v = d_k if d_v is None else d_v
    for what, v, most in (("tokens", n, MAX_TOKENS), ("M", m, MAX_WIDTH), ("d_k", d_k, MAX_WIDTH),
                          ("d_v", d_v, MAX_WIDTH)):  # fmt: skip
        if not 1 <= v <= most:
            raise MatrixError(f"{what} must be in 1..{most} for matrices by hand, got {v}")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, m, generator=g, dtype=torch.float64)  # (N, M)
    bound = 1 / math.sqrt(m) if init == "linear" else None

    def weights(d: int) -> torch.Tensor:  # (M, d)
        u = torch.rand(m, d, generator=g, dtype=torch.float64)  # U[0, 1)
        return u if bound is None else (2 * u - 1) * bound

    w_q, w_k, w_v = weights(d_k), weights(d_k), weights(d_v)
    return HandMatrices(labels, x.numpy(), w_q.numpy(), w_k.numpy(), w_v.numpy(),
                        f"random: X ~ N(0, 1), {INITS[init]}; seed {seed}")  # fmt: skip


def matrices_from(bundle: dict, name: str = "matrices") -> HandMatrices:
    """HandMatrices from a dict with "X", "W_Q", "W_K", "W_V" (and "tokens"): what
    ``HandMatrices.to_dict`` and a walk's JSON (under "inputs") hold."""
    if "inputs" in bundle and isinstance(bundle["inputs"], dict):
        bundle = bundle["inputs"]
    missing = [k for k in ("X", "W_Q", "W_K", "W_V") if k not in bundle]
    if missing:
        raise MatrixError(f"{name}: no {', '.join(missing)} (it needs X, W_Q, W_K and W_V, and "
                          "may give tokens)")  # fmt: skip
    got = {k: _from_json(json.dumps(bundle[k]), f"{name} {k}")[0]
           for k in ("X", "W_Q", "W_K", "W_V")}  # fmt: skip
    tokens = bundle.get("tokens")
    if tokens is None:
        tokens = token_labels(None, got["X"].shape[0])
    elif isinstance(tokens, str):
        tokens = token_labels(tokens)
    elif not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)):
        raise MatrixError(f'{name}: "tokens" must be a list of labels or a text')
    return HandMatrices(tokens, got["X"], got["W_Q"], got["W_K"], got["W_V"])


def read_bundle(path: str) -> HandMatrices:
    """HandMatrices from a JSON file (``matrices_from``)."""
    p = Path(path)
    if not p.is_file():
        raise MatrixError(f"{path}: no such file")
    if p.stat().st_size > 4 * MAX_MATRIX_BYTES:
        raise MatrixError(f"{path}: {p.stat().st_size:,} bytes is not hand-sized")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise MatrixError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise MatrixError(f"{path}: expected a JSON object with X, W_Q, W_K and W_V")
    return matrices_from(data, path)


DEFAULT_M, DEFAULT_D_K = 8, 3  # random sizes when nothing says otherwise: fit 80 columns


def hand_matrices(tokens: list[str] | str | None = None, x=None, w_q=None, w_k=None, w_v=None,
                  *, matrices: HandMatrices | None = None, n: int | None = None,
                  m: int | None = None, d_k: int | None = None, d_v: int | None = None,
                  seed: int = 0, init: str = "linear") -> HandMatrices:  # fmt: skip
    """The matrices a walk reads: ``matrices`` whole (``tokens`` relabels its rows), or each of
    X (N, M), W_Q, W_K (M, d_k), W_V (M, d_v) given (arrays, or rows as lists) or drawn at
    random from ``seed`` (``random_matrices``; ``init``), the sizes taken from what is given,
    else from ``tokens`` (a list of labels, or text split at whitespace) or ``n``, ``m``,
    ``d_k``, ``d_v`` (defaults ``DEFAULT_M``, ``DEFAULT_D_K``; d_v = d_k). What ``attnlab
    walk`` and the workbench's by-hand panel both walk."""
    given = {"--x": x, "--wq": w_q, "--wk": w_k, "--wv": w_v}
    if isinstance(tokens, str):
        tokens = token_labels(tokens)
    if matrices is not None:
        clash = [k for k, v in given.items() if v is not None]
        if clash:
            raise MatrixError(f"--matrices holds X, W_Q, W_K and W_V: give {', '.join(clash)} "
                              "without it, or edit the file")  # fmt: skip
        if tokens is None:
            return matrices
        mm = matrices
        return HandMatrices(tokens, mm.x, mm.w_q, mm.w_k, mm.w_v, mm.source)
    x, w_q, w_k, w_v = (None if a is None else np.asarray(a, dtype=np.float64)
                        for a in (x, w_q, w_k, w_v))  # fmt: skip
    for name, a in (("X", x), ("W_Q", w_q), ("W_K", w_k), ("W_V", w_v)):
        if a is not None and (a.ndim != 2 or 0 in a.shape):
            raise MatrixError(f"{name} must be a matrix with rows and columns, got shape "
                              f"{a.shape}")  # fmt: skip
    if x is not None:
        size = x.shape[0]
    elif tokens is not None:
        size = len(tokens)
    elif n is not None:
        size = n
    else:
        raise MatrixError("give X (--x), the tokens (--tokens \"I like to eat apples\") or how "
                          "many there are (--n)")  # fmt: skip
    if n is not None and n != size:
        raise MatrixError(
            f"--n {n}, but "
            + (f"X has {size} rows" if x is not None else f"--tokens gives {size} tokens")
        )
    width = next((a.shape[0] for a in (w_q, w_k, w_v) if a is not None), None)
    width = x.shape[1] if x is not None else (width or m or DEFAULT_M)
    d_k = next((a.shape[1] for a in (w_q, w_k) if a is not None), None) or d_k or DEFAULT_D_K
    d_v = w_v.shape[1] if w_v is not None else (d_v or d_k)
    drawn = random_matrices(size, width, d_k, d_v, seed, tokens or None, init)
    picked = [a if a is not None else b for a, b in ((x, drawn.x), (w_q, drawn.w_q),
                                                      (w_k, drawn.w_k), (w_v, drawn.w_v))]  # fmt: skip
    random_ones = [k[2:].upper().replace("W", "W_") for k, v in given.items() if v is None]
    source = ("given" if not random_ones else drawn.source if len(random_ones) == 4 else
              f"{', '.join(random_ones)} {drawn.source}, the rest given")  # fmt: skip
    return HandMatrices(tokens or drawn.tokens, *picked, source)


# ---------------------------------------------------------------------------------------------
# The walk
# ---------------------------------------------------------------------------------------------


@dataclass
class Settings:
    """What the attention is given: the 1/sqrt(d_k) scale, the causal mask, a softmax
    temperature, and ``pad`` padding positions (the text batched with one ``pad`` tokens
    longer) hidden by a padding mask or not."""

    scale: bool = True
    causal: bool = True
    temperature: float = 1.0
    pad: int = 0
    padding_mask: bool = True

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise MatrixError(f"the temperature must be a positive number, got {self.temperature}")
        if not 0 <= self.pad <= MAX_TOKENS:
            raise MatrixError(f"pad must be in 0..{MAX_TOKENS}, got {self.pad}")

    def factor(self, d_k: int) -> float:
        """What the scores are multiplied by: 1/sqrt(d_k) (or 1), divided by the temperature."""
        return (1 / math.sqrt(d_k) if self.scale else 1.0) / self.temperature

    def to_dict(self) -> dict:
        return {"scale": self.scale, "causal": self.causal, "temperature": self.temperature,
                "pad": self.pad, "padding_mask": self.padding_mask}  # fmt: skip


def attention_mask(n: int, pad: int, causal: bool, padding_mask: bool) -> torch.Tensor | None:
    """(T, T) True = may attend, T = n + pad: the causal mask and/or the padding mask over the
    ``pad`` pad positions (None: no mask at all). With the causal mask the pads come first
    (``pad_left``), else after the n tokens."""
    from attnlab.attention import causal_mask, combine_masks

    T = n + pad
    real = torch.arange(T) >= pad if pad_left(causal) else torch.arange(T) < n  # (T,)
    keys = real[None, :] if (pad and padding_mask) else None  # (1, T)
    return combine_masks(causal_mask(T) if causal else None, keys)


def pad_left(causal: bool) -> bool:
    """Where the pads go: before the text under a causal mask (a batch is padded on the left
    to generate from; pads on the right would come after every token, where the causal mask
    hides them anyway), after it otherwise."""
    return causal


def attend(q, k, v, mask, factor: float, bias=None, cap=None):
    """attnlab's reference attention on float64 tensors: (output, weights, scores), scores
    being Q K^T x ``factor`` (+ bias, capped) before the mask."""
    from attnlab.attention import reference_attention

    return reference_attention(q, k, v, mask, scale=factor, bias=bias, cap=cap)


def entropy_bits(w: np.ndarray) -> np.ndarray:
    """Each row's entropy -sum p log2 p, in bits: 0 when one key takes all the weight,
    log2(S) when the row is uniform over S keys (a row of zeros: 0)."""
    w = np.asarray(w, dtype=np.float64)
    logs = np.log2(np.where(w > 0, w, 1.0))
    return -(w * logs).sum(-1) + 0.0


@dataclass
class Walk(Result):
    """The steps of attention on hand-sized matrices (``walk``); ``steps`` are ``trace``'s
    ``Step``s, so a page draws both alike."""

    matrices: HandMatrices
    settings: Settings
    tokens: list[str]  # the N tokens, then the <pad>s
    steps: list[Step] = field(default_factory=list)

    @property
    def heading(self) -> str:
        m = self.matrices
        return (f"attention by hand: N = {m.n} tokens, M = {m.x.shape[1]}, d_k = {m.d_k}, "
                f"d_v = {m.d_v}")  # fmt: skip

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step {name!r}; steps: {', '.join(s.name for s in self.steps)}")

    def to_dict(self) -> dict:
        return {"inputs": self.matrices.to_dict(), "settings": self.settings.to_dict(),
                "tokens": self.tokens, "steps": [s.to_dict() for s in self.steps]}  # fmt: skip

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        parts = [Text(self.heading, style="bold"), Text(f"the matrices: {self.matrices.source}",
                                                        style="italic"), Text("")]  # fmt: skip
        for n, s in enumerate(self.steps, 1):
            shape = " x ".join(map(str, s.shape)) if s.shape else "-"
            parts.append(Text(f"[{n}] {s.title}   shape ({shape})", style="bold cyan"))
            parts.append(indented(s.meaning))
            if s.lines:
                parts.append(indented("\n".join(s.lines)))
            elif s.value is not None and s.value.ndim == 2 and s.rows is not None:
                square = s.cols == s.rows
                parts.append(matrix_table(
                    s.value, s.rows, s.cols or s.rows, heat=square, col_tokens=square,
                    row_name="queries" if square else "tokens",
                    col_name="keys" if square else "columns", max_lines=200))  # fmt: skip
            elif s.value is not None:
                parts.append(Text(preview_text(s.value)))
            parts.append(Text(""))
        return Group(*parts)

    def _repr_html_(self) -> str:
        import html

        out = [f"<h4>{html.escape(self.heading)}</h4>"]
        for n, s in enumerate(self.steps, 1):
            shape = " x ".join(map(str, s.shape))
            out.append(f"<div><b>[{n}] {html.escape(s.title)}</b> <code>({shape})</code><br>"
                       f"<i>{html.escape(s.meaning)}</i></div>")  # fmt: skip
            if s.lines:
                out.append(f"<pre>{html.escape(chr(10).join(s.lines))}</pre>")
            elif s.value is not None and s.value.ndim == 2 and s.rows is not None:
                square = s.cols == s.rows
                out.append(heatmap_html(s.value, s.rows, s.cols or s.rows, limit=64,
                                        diverging=True, col_tokens=square))  # fmt: skip
        return "\n".join(out)


class indented:  # noqa: N801  a renderable, used as a function
    """``text`` wrapped at the width it is printed at, every line indented by ``by`` (and no
    trailing spaces, which rich's Padding would add)."""

    def __init__(self, text: str, by: int = 4, style: str = ""):
        self.text, self.by, self.style = text, by, style

    def __rich_console__(self, console, options):
        import textwrap

        from rich.text import Text

        width = max(20, options.max_width - self.by)
        for para in self.text.split("\n"):
            for line in textwrap.wrap(para, width, break_on_hyphens=False) or [""]:
                yield Text(" " * self.by + line, style=self.style)


def _cols(n: int) -> list[str]:
    return [str(j) for j in range(n)]


def walk(matrices: HandMatrices, settings: Settings | None = None, **switches) -> Walk:
    """Attention on ``matrices``, one step at a time, with real numbers (module doc). The
    switches are ``Settings``' fields: ``scale``, ``causal``, ``temperature``, ``pad``,
    ``padding_mask``."""
    s = settings or Settings(**switches)
    m = matrices
    N, M = m.x.shape
    T = N + s.pad
    left = pad_left(s.causal)
    pads, zeros = [PAD] * s.pad, np.zeros((s.pad, M))  # a pad's row of X: zeros
    tokens = pads + m.tokens if left else m.tokens + pads
    x = np.concatenate([zeros, m.x] if left else [m.x, zeros])  # (T, M)
    X = torch.as_tensor(x)
    q = X @ torch.as_tensor(m.w_q)  # (T, d_k)
    k = X @ torch.as_tensor(m.w_k)  # (T, d_k)
    v = X @ torch.as_tensor(m.w_v)  # (T, d_v)
    mask = attention_mask(N, s.pad, s.causal, s.padding_mask)
    factor = s.factor(m.d_k)
    out, weights, scores = attend(q, k, v, mask, factor)
    steps: list[Step] = []
    add = steps.append
    add(Step("tokens", "tokens", (T,),
             f"N = {N} tokens, one row of X each" + (
                 f", and {s.pad} padding positions {'before' if left else 'after'} them: the "
                 f"text is batched with one {s.pad} tokens longer, so it is filled out to the "
                 "same length (a pad's row of X is zeros)" if s.pad else "") + ".",
             lines=["  ".join(show_token(t) for t in tokens)]))  # fmt: skip
    add(Step("X", "X, the embedding matrix", x.shape,
             f"one row of M = {M} numbers per token (N x M).", x, tokens, _cols(M)))  # fmt: skip
    xx = x @ x.T  # (T, T)
    add(Step("similarity_dot", "X X^T: how alike the token vectors are", xx.shape,
             "entry (i, j) is the dot product of token i's and token j's rows of X: large when "
             "they point the same way and are long.", xx, tokens, tokens))  # fmt: skip
    from attnlab.inspect.similarity import cosine_matrix

    cos = cosine_matrix(x)
    add(Step("similarity_cosine", "cosine similarity of the token vectors", cos.shape,
             "the dot product of the rows divided by their lengths: 1 on the diagonal, 1 for "
             "the same direction, 0 for unrelated, -1 for opposite (a zero row: 0).", cos,
             tokens, tokens))  # fmt: skip
    for name, w, what in (("W_Q", m.w_q, "d_k"), ("W_K", m.w_k, "d_k"), ("W_V", m.w_v, "d_v")):
        add(Step(name, name, w.shape,
                 f"learned weights M x {what} = {M} x {w.shape[1]} (here: {m.source}).", w,
                 _cols(M), _cols(w.shape[1])))  # fmt: skip
    for name, t, what in (("Q", q, "what each token is looking for"),
                          ("K", k, "what each token offers to be found by"),
                          ("V", v, "what each token passes on when it is attended to")):  # fmt: skip
        a = t.numpy()
        add(Step(name, f"{name} = X W_{name}", a.shape,
                 f"{T} x {M} times {M} x {a.shape[1]}: one row per token, {what}.", a, tokens,
                 _cols(a.shape[1])))  # fmt: skip
    raw = (q @ k.T).numpy()  # (T, T)
    add(Step("raw_scores", "Q K^T", raw.shape,
             "entry (i, j) is query i . key j: how well token j matches what token i looks for "
             f"(d_q = d_k = {m.d_k} numbers multiplied and added).", raw, tokens, tokens))  # fmt: skip
    add(Step("scaled_scores", _scale_title(s, m.d_k), raw.shape, _scale_meaning(s, m.d_k),
             scores.numpy(), tokens, tokens))  # fmt: skip
    sc = scores.numpy()
    if mask is None:
        add(Step("no_mask", "no mask", (),
                 "every token may read every token, before and after it (a causal model would "
                 "hide the later ones; the switch --no-causal took that mask away)."))  # fmt: skip
    else:
        keep = torch.broadcast_to(mask, (T, T)).numpy()
        masked = np.where(keep, sc, -np.inf)
        add(Step("masked_scores", _mask_title(s), masked.shape, _mask_meaning(s, N), masked,
                 tokens, tokens))  # fmt: skip
    w = weights.numpy()
    sums = w.sum(-1)
    add(Step("weights", "softmax over the keys", w.shape,
             f"exp of each score over the sum of its row's: every row sums to 1 (here "
             f"{sums.min():.6f}..{sums.max():.6f}); a hidden key weighs 0.", w, tokens, tokens,
             extra={"row_sums": rounded(sums, 6), "entropy_bits": rounded(entropy_bits(w), 4),
                    "max_weight": rounded(w.max(-1), 4)}))  # fmt: skip
    z = out.numpy()
    add(Step("z", "weights V: the weighted sum", z.shape,
             f"each token's new vector is the average of the {T} value rows, weighted by its "
             f"row of weights: {T} x {T} times {T} x {m.d_v}.", z, tokens, _cols(m.d_v)))  # fmt: skip
    return Walk(m, s, tokens, steps)


def _scale_title(s: Settings, d_k: int) -> str:
    t = f" / temperature {s.temperature:g}" if s.temperature != 1 else ""
    if s.scale:
        return f"scaled by 1/sqrt(d_k) = 1/sqrt({d_k}) = {1 / math.sqrt(d_k):.4f}{t}"
    return "not scaled (no 1/sqrt(d_k))" + t


def _scale_meaning(s: Settings, d_k: int) -> str:
    if s.scale:
        text = (f"a dot product of {d_k} numbers grows like sqrt({d_k}); dividing by it keeps the "
                "scores near 1 so the softmax does not put all the weight on one key.")  # fmt: skip
    else:
        text = ("the raw dot products go into the softmax: the larger d_k, the more one key "
                "takes all the weight.")  # fmt: skip
    if s.temperature != 1:
        text += f" Dividing by a temperature of {s.temperature:g} makes the weights " + (
            "flatter (more even)." if s.temperature > 1 else "sharper (more peaked)."
        )
    return text


def _mask_title(s: Settings) -> str:
    parts = (["causal mask"] if s.causal else []) + (["padding mask"] if s.pad and
                                                     s.padding_mask else [])  # fmt: skip
    return " and ".join(parts)


def _mask_meaning(s: Settings, n: int) -> str:
    bits = []
    if s.causal:
        bits.append("a token may not read the tokens after it: the scores right of the diagonal "
                    "become -inf")  # fmt: skip
    if s.pad and s.padding_mask:
        first = 0 if pad_left(s.causal) else n
        bits.append(f"no token may read the {s.pad} pad positions (keys {first}.."
                    f"{first + s.pad - 1} become -inf)")  # fmt: skip
    return "; ".join(bits) + ", so after the softmax they weigh 0."
