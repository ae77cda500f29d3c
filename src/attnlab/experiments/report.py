"""What an experiment hands back: claims (a published figure beside attnlab's, with the rule
that decides whether it reproduces), tables, pictures and the runs it trained; written as
``figures.json`` and an offline ``report.html``, and summarised in the terminal.

No conclusion is written by hand. A ``Claim`` holds the per-seed values and an explicit
criterion (a threshold every seed must meet); its ``verdict`` and ``sentence`` are computed from
those numbers, so a changed number changes the sentence.
"""

from __future__ import annotations

import html
import json
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.experiments.stats import spread

OPS = {">=": ("at least", lambda v, t: v >= t), "<=": ("at most", lambda v, t: v <= t),
       ">": ("above", lambda v, t: v > t), "<": ("below", lambda v, t: v < t)}  # fmt: skip


def fmt(v: float, unit: str = "") -> str:
    """A value as the report prints it: a fraction as a percentage (unit "%"), else 3 figures."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if unit == "%":
        return f"{100 * v:.0f}%"
    if unit == "count":
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:+.3f}" if unit == "signed" else f"{v:.3f}"


def value_range(values: list[float], unit: str = "", short: bool = False) -> str:
    """'0.41' for one value or equal ones; '0.38 to 0.45 (mean 0.41)' for a range, or
    '0.38..0.45' when ``short`` (a table's cell)."""
    s = spread(values)
    if s["n"] == 0:
        return "n/a"
    lo, mean, hi = (fmt(s[k], unit) for k in ("min", "mean", "max"))
    if lo == hi:
        return lo
    return f"{lo}..{hi}" if short else f"{lo} to {hi} (mean {mean})"


@dataclass
class Claim:
    """A published finding beside attnlab's measurement of it.

    ``values`` maps each seed to the measured value; the finding reproduces when every seed's
    value stands in relation ``op`` to ``threshold`` (e.g. >= 0.2)."""

    key: str
    measure: str  # what the value is, as a noun phrase
    published: str  # the published figure or claim, with its source
    values: dict[int, float]
    op: str
    threshold: float
    unit: str = ""  # "%": fractions shown as percentages; "signed": with a sign
    # seed -> whether the models it trained learned their task (``Report.judge``); a seed
    # whose models did not cannot judge the finding. None: not judged (every seed counts).
    learned: dict[int, bool] | None = None
    bar: str = ""  # what learning its task means, in words (the bar each model had to pass)

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"unknown comparison {self.op!r}")

    def met(self) -> dict[int, bool]:
        test = OPS[self.op][1]
        return {s: (not math.isnan(v)) and test(v, self.threshold) for s, v in self.values.items()}

    @property
    def unlearned(self) -> list[int]:
        """The seeds whose models did not learn their task."""
        return [s for s, ok in (self.learned or {}).items() if not ok]

    @property
    def judged(self) -> bool:
        """Can the numbers judge the finding: did every seed's models learn their task?"""
        return not self.unlearned

    @property
    def reproduces(self) -> bool:
        met = self.met()
        return self.judged and bool(met) and all(met.values())

    @property
    def criterion(self) -> str:
        return f"{self.measure} {OPS[self.op][0]} {fmt(self.threshold, self.unit)} in every seed"

    @property
    def verdict(self) -> str:
        if not self.judged:
            return "models too small to judge"
        return "reproduces" if self.reproduces else "does not reproduce"

    def sentence(self) -> str:
        """One sentence made from the numbers: the measured range, how many seeds meet the
        criterion, and the verdict; or, where some seed's models did not learn their task,
        that they are too small to judge it (and the bar they missed)."""
        met = self.met()
        k, n = sum(met.values()), len(met)
        measured = value_range(list(self.values.values()), self.unit)
        word = "seed" if n == 1 else "seeds"
        head = f"{self.measure[0].upper()}{self.measure[1:]} is {measured} over {n} {word}"
        if not self.judged:
            which = ", ".join(map(str, self.unlearned))
            whose = "seed" if len(self.unlearned) == 1 else "seeds"
            return (f"{head}; the models of {whose} {which} did not learn their task ({self.bar}), "
                    "so they are too small to judge the finding.")  # fmt: skip
        return (f"{head}; {k} of {n} {OPS[self.op][0]} {fmt(self.threshold, self.unit)}, so the "
                f"finding {self.verdict} here.")  # fmt: skip

    def to_dict(self) -> dict:
        s = spread(list(self.values.values()))
        return {"key": self.key, "measure": self.measure, "published": self.published,
                "measured": {"per_seed": {str(k): v for k, v in self.values.items()}, **s},
                "criterion": self.criterion, "op": self.op, "threshold": self.threshold,
                "judged": self.judged, "learned_bar": self.bar,
                "learned": {str(k): v for k, v in (self.learned or {}).items()},
                "reproduces": self.reproduces, "sentence": self.sentence()}  # fmt: skip


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list]
    caption: str = ""

    def to_dict(self) -> dict:
        return {"title": self.title, "header": self.header, "rows": self.rows,
                "caption": self.caption}  # fmt: skip

    def lines(self, width: int = 80) -> list[str]:
        """The table as plain text columns where they fit ``width``; where they do not, each
        row as "heading: value" pairs wrapped to it (a number is never cut)."""
        cells = [[str(c) for c in self.header]] + [[str(c) for c in r] for r in self.rows]
        n = len(self.header)
        widths = [max(len(r[i]) for r in cells) for i in range(n)]
        if sum(widths) + 2 * (n - 1) <= width:
            return [self.title] + [
                "  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in cells
            ]
        wrap = textwrap.TextWrapper(width=width, subsequent_indent="    ", break_on_hyphens=False)
        out = wrap.wrap(self.title)
        for r in cells[1:]:  # a row: "  a: 1; b: 2;" then "    c: 3", no pair split
            pairs = [f"{h}: {c}" if h else c for h, c in zip(self.header, r)]
            line = "  " + pairs[0]
            for pair in pairs[1:]:
                if len(line) + 2 + len(pair) > width:
                    out += wrap.wrap(line + ";")
                    line = "    " + pair
                else:
                    line += "; " + pair
            out += wrap.wrap(line)
        return out


@dataclass
class Report:
    name: str
    title: str
    citation: str
    method: str  # how attnlab measures it, in a paragraph
    settings: dict = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    pictures: list[tuple[str, str]] = field(default_factory=list)  # (caption, <img> html)
    runs: list[tuple[str, str]] = field(default_factory=list)  # (label, path relative to out)
    notes: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)  # every measurement, for figures.json
    models: list[dict] = field(default_factory=list)  # each trained model, judged (recipe.judge)

    def judge(self, models: list[dict]) -> None:
        """Mark each claim with whether each seed's models learned their task (``models``:
        ``{"name", "seed", "learned", "figure", "bar"}`` per trained model; a model no bar
        applies to has ``learned`` None). A seed one of whose models did not learn cannot
        judge a finding: its claims say the models are too small to judge it."""
        self.models = list(models)
        for c in self.claims:
            learned, bars = {}, []
            for seed in c.values:
                mine = [m for m in models if m["seed"] == seed and m["learned"] is not None]
                learned[seed] = all(m["learned"] for m in mine)
                bars += [m["bar"] for m in mine if not m["learned"]]
            if not all(learned.values()):
                c.learned, c.bar = learned, "; ".join(dict.fromkeys(bars))

    def to_dict(self) -> dict:
        return {"experiment": self.name, "title": self.title, "citation": self.citation,
                "method": self.method, "settings": self.settings,
                "claims": [c.to_dict() for c in self.claims],
                "tables": [t.to_dict() for t in self.tables],
                "pictures": [{"caption": caption, "file": picture_file(i)}
                             for i, (caption, _) in enumerate(self.pictures, 1)],
                "runs": [{"label": label, "path": p} for label, p in self.runs],
                "models": self.models, "notes": self.notes,
                "measurements": self.data}  # fmt: skip

    def write(self, out: Path) -> tuple[Path, Path]:
        """OUT/figures.json, OUT/report.html, and each picture as OUT/figure-N.png (to put in
        a page or a paper of one's own)."""
        from attnlab.files import atomic_write, atomic_write_text

        out.mkdir(parents=True, exist_ok=True)
        for i, (_, img) in enumerate(self.pictures, 1):
            png = _png_bytes(img)
            if png is not None:
                atomic_write(out / picture_file(i), lambda tmp, b=png: Path(tmp).write_bytes(b))
        js, page = out / "figures.json", out / "report.html"
        atomic_write_text(js, json.dumps(_finite(self.to_dict()), indent=1, ensure_ascii=False))
        atomic_write_text(page, self.html())
        return js, page

    def html(self) -> str:
        from attnlab.render.display import table_html

        e = html.escape
        parts = [f"<h1>{e(self.title)}</h1>", f"<p><i>{e(self.citation)}</i></p>",
                 f"<p>{e(self.method)}</p>", "<h2>Published and measured</h2>"]  # fmt: skip
        for published, claims in self.by_finding().items():
            parts.append(f"<h3>{e(published)}</h3>")  # once, however many claims test it
            rows = [[c.measure, value_range(list(c.values.values()), c.unit), c.criterion,
                     c.verdict] for c in claims]  # fmt: skip
            parts.append(table_html(["measured", "attnlab (range over seeds)", "criterion",
                                     "verdict"], rows))  # fmt: skip
            parts.append("<ul>" + "".join(f"<li>{e(c.sentence())}</li>" for c in claims)
                         + "</ul>")  # fmt: skip
        if self.models:
            rows = [[m["name"], m["seed"], m["figure"], m["bar"] or "-",
                     {True: "yes", False: "no", None: "-"}[m["learned"]]]
                    for m in self.models]  # fmt: skip
            parts.append(table_html(["model", "seed", "held-out", "the bar", "learned its task"],
                                    rows, "The models: a finding is judged only on models that "
                                    "learned their task"))  # fmt: skip
        for t in self.tables:
            parts.append(table_html(t.header, t.rows, t.title, t.caption))
        for caption, img in self.pictures:
            parts.append(f"<figure>{img}<figcaption>{e(caption)}</figcaption></figure>")
        if self.runs:
            links = "".join(f'<li><a href="{e(p)}/config.json">{e(label)}</a>: <code>{e(p)}</code>'
                            "</li>" for label, p in self.runs)  # fmt: skip
            parts.append("<h2>Models</h2><p>Every model is a run directory: open it with any "
                         f"verb (<code>attnlab eval DIR</code>, <code>attnlab heads DIR</code>)."
                         f"</p><ul>{links}</ul>")  # fmt: skip
        settings = ", ".join(f"{k}: {v}" for k, v in self.settings.items())
        parts.append(f"<h2>Settings</h2><p>{e(settings)}</p>")
        if self.notes:
            parts.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in self.notes) + "</ul>")
        body = "\n".join(parts)
        return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(self.title)}</title>"
                "<style>body{font-family:sans-serif;max-width:60em;margin:1em auto;padding:0 1em}"
                "img{max-width:100%}</style></head><body>\n" + body + "\n</body></html>\n")  # fmt: skip

    def by_finding(self) -> dict[str, list[Claim]]:
        """The claims grouped by the published finding they test, in order."""
        found: dict[str, list[Claim]] = {}
        for c in self.claims:
            found.setdefault(c.published, []).append(c)
        return found

    def lines(self, width: int = 80) -> list[str]:
        """The terminal summary: each published finding once, the sentences of the claims
        that test it, and the tables, at most ``width`` columns."""
        wrap = textwrap.TextWrapper(width=width, subsequent_indent="  ", break_on_hyphens=False)
        out = wrap.wrap(f"{self.title} ({self.citation})") + [""]
        for published, claims in self.by_finding().items():
            out += wrap.wrap(f"published: {published}")
            for c in claims:
                out += wrap.wrap(f"attnlab:   {c.sentence()}")
            out += [""]
        for t in self.tables:
            out += t.lines(width) + [""]
        for n in self.notes:
            out += wrap.wrap(f"note: {n}")
        return out


def picture_file(i: int) -> str:
    return f"figure-{i}.png"


def _png_bytes(img: str) -> bytes | None:
    """The PNG inside an inline ``<img src="data:image/png;base64,...">`` (None: not one)."""
    import base64
    import re

    m = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', img)
    return base64.b64decode(m.group(1)) if m else None


def _finite(x):
    """JSON has no nan: written as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x
