"""Each decoder step's attention over the source, and several models side by side.

The notes draw an LSTM encoder-decoder translating "let's go" to "vamos": at the first output
step it takes 40% of the encoding of "let's" and 60% of "go". ``source_attention`` reads that
picture off any encoder-decoder run: one row per decoder step (the token it is fed, the token
it outputs), one column per source token, each row the step's weights over the source:

    LSTM with attention   its one alignment a_t = softmax_s(e_ts)
    Transformer           its cross-attention, the mean over heads and over the layers that
                          read the source (or one layer, one head)

``words=True`` adds up the weights of the tokens of each word of the source (the word
tokenizer writes "let's" as let ' s; a BPE or character model splits words further), so the
columns are the words a person reads. ``side_by_side`` puts several models' rows together:
the notes' picture for the LSTM and the Transformer on the same input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnlab.inspect.recording import InspectError, Recording
from attnlab.render.display import Result, heatmap_html, matrix_table, rounded, show_token

SPECIAL = re.compile(r"^(<[^<>\s]+>|\[[A-Z]+\]|</s>)$")  # <eos>, <pad>, [CLS], [SEP], </s>
MARKERS = ("Ġ", "▁", "##", "Ċ")  # how BPE and WordPiece vocabularies mark a word's edge


@dataclass
class SourceAttention(Result):
    """One model's attention over the source at each decoder step: ``weights`` (T, S) over the
    ``source`` columns (tokens, or words), row t fed ``fed[t]`` and outputting ``next[t]``."""

    label: str  # what was read: "LSTM alignment", "cross-attention, mean of 2 layers x 4 heads"
    source: list[str]
    fed: list[str]
    next: list[str]
    weights: np.ndarray  # (T, S)
    output: str = ""  # the greedy translation
    tokens: list[str] = field(default_factory=list)  # the source tokens (when grouped in words)
    token_weights: np.ndarray | None = None  # (T, S_tokens) before grouping
    about: dict = field(default_factory=dict)

    @property
    def rows(self) -> list[str]:
        return [f"{show_token(f)}→{show_token(n)}" for f, n in zip(self.fed, self.next)]

    @property
    def heading(self) -> str:
        return f"{self.about.get('kind', 'model')}: {self.label}; output {self.output!r}"

    def to_dict(self) -> dict:
        d = {"label": self.label, "source": self.source, "output": self.output,
             "steps": [{"step": t, "fed": f, "next": n, "weights": rounded(w, 5)}
                       for t, (f, n, w) in enumerate(zip(self.fed, self.next, self.weights))]}  # fmt: skip
        if self.token_weights is not None:
            d["tokens"] = self.tokens
            d["token_weights"] = rounded(self.token_weights, 5)
        return d

    def __rich__(self):
        from rich.console import Group

        from attnlab.inspect.by_hand import indented

        return Group(indented(self.heading, 0, "italic"),
                     matrix_table(self.weights, self.rows, self.source, row_name="decoder steps",
                                  col_name="source"))  # fmt: skip

    def _repr_html_(self) -> str:
        return heatmap_html(self.weights, self.rows, self.source, self.heading)


def word_groups(text: str, tokens: list[str]) -> list[tuple[str, list[int]]]:
    """The source ``tokens`` grouped by the whitespace-separated words of ``text``: (the word,
    the indices of its tokens), in order; a special token (<eos>, [CLS]) is a group of its own.
    A token that cannot be found in the text, in order, is an InspectError."""
    spans = [(m.start(), m.end(), m.group()) for m in re.finditer(r"\S+", text)]
    groups: list[tuple[str, list[int]]] = []
    where: dict[int, int] = {}  # word index -> group index
    cursor, low = 0, text.lower()
    for i, tok in enumerate(tokens):
        if SPECIAL.match(tok):
            groups.append((tok, [i]))
            continue
        piece = tok
        for mark in MARKERS:
            piece = piece.replace(mark, "")
        piece = piece.strip()
        if not piece:  # a bare word-edge marker: part of the next word
            piece_at = cursor
        else:
            piece_at = text.find(piece, cursor)
            if piece_at < 0:
                piece_at = low.find(piece.lower(), cursor)
            if piece_at < 0:
                raise InspectError(f"words=True could not find the token {tok!r} in "
                                   f"{text!r} (after character {cursor}): show tokens instead")  # fmt: skip
        word = next((n for n, (a, b, _) in enumerate(spans) if a <= piece_at < b),
                    len(spans) - 1 if spans else 0)  # fmt: skip
        if word not in where:
            where[word] = len(groups)
            groups.append((spans[word][2] if spans else tok, []))
        groups[where[word]][1].append(i)
        cursor = piece_at + len(piece)
    return groups


def source_attention(rec: Recording, tokenizer=None, layer: int | None = None,
                     head: int | None = None, words: bool = False,
                     text: str | None = None) -> SourceAttention:  # fmt: skip
    """Each decoder step's weights over the source tokens of ``rec`` (an encoder-decoder's
    recording: its greedy output fed back, as ``trace`` shows it). Every map that reads the
    source, mean over heads and maps; ``layer`` picks one map by its block, ``head`` one head.
    ``words``: the tokens of each word of ``text`` added up."""
    maps = [m for m in rec.maps() if m.kind == "cross"]
    if not maps:
        raise InspectError(f"this {rec.about.get('kind', 'model')} model has no attention over a "
                           "source: each decoder step's source attention is an encoder-"
                           "decoder's (--task seq2seq, any --arch but lstm)")  # fmt: skip
    if layer is not None:
        picked = [m for m in maps if m.layer == layer]
        if not picked:
            have = sorted({m.layer for m in maps if m.layer is not None})
            raise InspectError(f"no layer {layer} reads the source; "
                               + (f"layers {', '.join(map(str, have))} do" if have else
                                  "this model's one attention has no layers (leave out layer)"))  # fmt: skip
        maps = picked
    n_heads = maps[0].n_heads
    if head is not None and not 0 <= head < n_heads:
        raise InspectError(f"no head {head}; the source attention has heads 0..{n_heads - 1}")
    per_map = [rec.weights(m.name).double().numpy() for m in maps]  # each (H, T, S)
    w = np.mean([p[head] if head is not None else p.mean(0) for p in per_map], axis=0)  # (T, S)
    src, fed = list(rec.tokens[maps[0].key_stack]), list(rec.tokens[maps[0].query_stack])
    nxt = _next_tokens(rec, tokenizer, fed)
    if n_heads == 1 and len(maps) == 1 and maps[0].layer is None:
        label = "its alignment over the source"
    else:
        layers = "" if len(maps) == 1 else f" of {len(maps)} layers"
        one = f"layer {maps[0].layer}" if len(maps) == 1 and maps[0].layer is not None else ""
        label = (f"cross-attention {one}".strip() + (f", head {head}" if head is not None else
                 f", mean of {n_heads} heads") + layers)  # fmt: skip
    out = SourceAttention(label, src, fed, nxt, w, str(rec.extra.get("translation", "")),
                          about=dict(rec.about))  # fmt: skip
    if words:
        if text is None:
            raise InspectError("words=True needs the source text")
        groups = word_groups(text, src)
        out.tokens, out.token_weights = src, w
        out.source = [g for g, _ in groups]
        out.weights = np.stack([w[:, idx].sum(-1) for _, idx in groups], axis=-1)  # (T, W)
    return out


def _next_tokens(rec: Recording, tokenizer, fed: list[str]) -> list[str]:
    """The token each decoder step outputs: the next token fed (the recording feeds the greedy
    output back), and at the last step the greedy choice that ended it, the argmax of its
    logits over the tokens greedy decoding may pick (not <pad>, not the start token)."""
    logits = rec.cache.get("decoder.logits", rec.logits)
    last = "<eos>"
    if logits is not None and hasattr(tokenizer, "target_tokens"):
        lg = logits[0, -1].clone()  # (V,)
        for name in ("PAD", "BOS"):
            i = getattr(tokenizer, name, None)
            if isinstance(i, int) and 0 <= i < lg.numel() and i != getattr(tokenizer, "EOS", -1):
                lg[i] = float("-inf")
        last = tokenizer.target_tokens([int(lg.argmax())])[0]
    return fed[1:] + [last]


@dataclass
class SideBySide(Result):
    """Several models' ``SourceAttention`` on one source text (``models`` names each)."""

    text: str
    models: list[str]
    results: list[SourceAttention]

    def to_dict(self) -> dict:
        """{"text", "models": [{"model", "about", ...SourceAttention.to_dict()}]}, after the one
        model's "about" when there is one (what every verb's JSON starts with)."""
        models = [{"model": name, "about": r.about, **r.to_dict()}
                  for name, r in zip(self.models, self.results)]  # fmt: skip
        first = {"about": self.results[0].about} if len(self.results) == 1 else {}
        return {**first, "text": self.text, "models": models}

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        parts = [Text(f"each decoder step's attention over {self.text!r} (row: fed→output)",
                      style="bold")]  # fmt: skip
        for name, r in zip(self.models, self.results):
            parts += [Text(""), Text(name, style="bold cyan"), r]
        return Group(*parts)

    def _repr_html_(self) -> str:
        import html

        cells = "".join(f"<div><b>{html.escape(n)}</b>{heatmap_html(r.weights, r.rows, r.source, r.heading)}</div>"
                        for n, r in zip(self.models, self.results))  # fmt: skip
        return f'<div style="display:flex;gap:1.5em;flex-wrap:wrap">{cells}</div>'

    def figure(self):
        """One heatmap per model, side by side, each cell's weight written in it."""
        import matplotlib.pyplot as plt

        from attnlab.render.plots import heatmap

        n = len(self.results)
        widths = [0.75 * len(r.source) + 0.5 for r in self.results]  # inches of matrix
        label = 0.09 * max(len(x) for r in self.results for x in r.rows) + 0.9  # tick labels
        height = 0.55 * max(len(r.fed) for r in self.results) + 1.9
        fig, axes = plt.subplots(1, n, figsize=(sum(widths) + n * label + 1.0, height),
                                 squeeze=False, width_ratios=widths, layout="constrained")  # fmt: skip
        for ax, name, r in zip(axes[0], self.models, self.results):
            heatmap(ax, r.weights, r.rows, r.source, vmin=0.0, vmax=1.0, annotate=True,
                    title=f"{name}\n{r.label}", xlabel="source", ylabel="step: fed→output",
                    xtick_rotation=0, aspect="auto", colorbar=ax is axes[0][-1],
                    colorbar_label="weight", fontsize=9)  # fmt: skip
            for t in ax.get_yticklabels():  # the shared helper centres them on the tick
                t.set_horizontalalignment("right")
        fig.suptitle(f"each decoder step's attention over {self.text!r}", fontsize=10)
        return fig

    def save_png(self, path: str | Path) -> Path:
        from attnlab.render.plots import save_png

        return save_png(self.figure(), path)


def side_by_side(results: list[SourceAttention], models: list[str] | None = None,
                 text: str = "") -> SideBySide:  # fmt: skip
    """Several ``source_attention`` results on the same ``text``, named by ``models`` (default:
    each model's kind)."""
    names = models or [r.about.get("kind", f"model {i}") for i, r in enumerate(results)]
    return SideBySide(text, list(names), list(results))
