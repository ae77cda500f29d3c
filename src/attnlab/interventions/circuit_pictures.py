"""Pictures of a circuit: the graph (PNG), the faithfulness curve (PNG), and an offline HTML page
that draws the graph with its edge weights and lets a user pick k on a slider.

The graph's nodes are the model's components, in forward order left to right: the
embeddings, each head (top to bottom within its layer), each feed-forward, the logits. An edge
w -> r of the circuit is drawn from the writer into the component whose input r is, coloured
by which input it is (query, key, value, feed-forward, logits) and as wide as its |score|
(solid: positive, dashed: negative). A key/value head that grouped-query attention shares is
one reader: its edges go into a small node of its own (kvJ) beside the heads it serves. With
edges per position, a unit's positions are summed into its edge, and the label says how many.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

COLOURS = {"q": "#1f77b4", "k": "#d62728", "v": "#2ca02c", "mlp": "#9467bd", "readout": "#222222"}
INPUT_WORDS = {"q": "query", "k": "key", "v": "value", "mlp": "feed-forward input",
               "readout": "logits"}  # fmt: skip
MAX_NODES_ALL = 120  # with more components than this, only those the circuit touches are drawn


def _component(kind: dict) -> tuple[str, str]:
    """(the writer's component, the reader's component) of a unit's kind record."""
    w, r = kind["writer"], kind["reader"]
    if kind["input"] == "readout":
        return w, r
    if kind["input"] == "mlp":
        return w, r[: -len("mlp_in")] + "mlp_out"
    head = r.rsplit(".", 1)[0]  # blocks.1.attn.head0 or blocks.1.attn.kv0
    return w, head


def layout(result) -> dict[str, dict]:
    """Every component's place: {name: {"label", "x", "y"}}, x by forward order, y within a
    layer. Components are named as the graph names writers (a kvJ reader node as its path)."""
    names, cols = [], {}
    for kind in result.kinds:
        for c in _component(kind):
            if c not in cols:
                names.append(c)
                cols[c] = None
    order = sorted(names, key=_forward_key)
    columns: dict[tuple, list[str]] = {}
    for c in order:
        columns.setdefault(_column_key(c), []).append(c)
    keys = sorted(columns, key=lambda k: k)
    out = {}
    for x, key in enumerate(keys):
        items = columns[key]
        for y, c in enumerate(items):
            out[c] = {"label": _label(c), "x": x, "y": y - (len(items) - 1) / 2}
    return out


def _stack_rank(name: str) -> int:
    return 0 if name.startswith("encoder.") else 1


def _forward_key(name: str):
    return (_column_key(name), _within(name))


def _column_key(name: str) -> tuple:
    """Components of one column: the embeddings, one layer's attention heads (self, then
    cross), its feed-forward, the logits."""
    rank = _stack_rank(name)
    if name.endswith("embed"):
        return (rank, -1, 0)
    if name.endswith("readout"):
        return (rank, 10**6, 0)
    parts = name.split(".")
    i = parts.index("blocks")
    layer, sub = int(parts[i + 1]), parts[i + 2]
    return (rank, layer, {"attn": 1, "cross": 2}.get(sub, 3))


def _within(name: str) -> tuple:
    last = name.rsplit(".", 1)[-1]
    if last.startswith("head"):
        return (0, int(last[4:]))
    if last.startswith("kv"):
        return (1, int(last[2:]))
    return (2, 0)


def _label(name: str) -> str:
    stack = (
        "enc " if name.startswith("encoder.") else ("dec " if name.startswith("decoder.") else "")
    )
    if name.endswith("embed"):
        return stack + "embed"
    if name.endswith("readout"):
        return "logits"
    parts = name.split(".")
    i = parts.index("blocks")
    layer, sub, last = parts[i + 1], parts[i + 2], parts[-1]
    if sub == "mlp_out":
        return f"{stack}{layer}.mlp"
    cross = "x" if sub == "cross" else ""
    who = last[4:] if last.startswith("head") else last
    return f"{stack}{cross}{layer}.{who}"


def circuit_edges(result, k: int | None = None) -> list[dict]:
    """The top ``k`` units (the circuit's by default) summed into edges between components:
    [{"from", "to", "input", "score", "units"}], largest |score| first."""
    k = result.k if k is None else k
    acc: dict[tuple, dict] = {}
    for u in result.order[:k]:
        kind = result.kinds[u]
        w, r = _component(kind)
        key = (w, r, kind["input"])
        e = acc.setdefault(key, {"from": w, "to": r, "input": kind["input"], "score": 0.0,
                                 "units": 0})  # fmt: skip
        e["score"] += float(result.scores[u])
        e["units"] += 1
    return sorted(acc.values(), key=lambda e: -abs(e["score"]))


def graph_figure(result, k: int | None = None):
    """The circuit's graph (module doc) as a matplotlib figure."""
    from matplotlib.lines import Line2D

    from attnlab.interventions.figures import new_figure

    k = result.k if k is None else k
    places = layout(result)
    edges = circuit_edges(result, k)
    touched = {e["from"] for e in edges} | {e["to"] for e in edges}
    shown = places if len(places) <= MAX_NODES_ALL else {c: places[c] for c in touched}
    xs = sorted({p["x"] for p in shown.values()})
    height = max((abs(p["y"]) for p in shown.values()), default=1)
    fig, ax = new_figure(
        figsize=(max(6.0, 1.3 * len(xs) + 2), max(3.5, 0.55 * (2 * height + 1) + 2))
    )
    top = max((abs(e["score"]) for e in edges), default=1.0) or 1.0
    for e in edges:
        a, b = places[e["from"]], places[e["to"]]
        ax.annotate("", xy=(b["x"] - 0.12, b["y"]), xytext=(a["x"] + 0.12, a["y"]),
                    arrowprops=dict(arrowstyle="-|>", color=COLOURS[e["input"]],
                                    lw=0.6 + 4.4 * abs(e["score"]) / top,
                                    ls="-" if e["score"] >= 0 else "--",
                                    connectionstyle="arc3,rad=0.12", shrinkA=4, shrinkB=4))  # fmt: skip
    for c, p in shown.items():
        on = c in touched
        ax.scatter([p["x"]], [p["y"]], s=420, zorder=3, color="#fff3c4" if on else "#f2f2f2",
                   edgecolors="#444" if on else "#bbb", linewidths=1.0)  # fmt: skip
        ax.text(p["x"], p["y"], p["label"], ha="center", va="center", fontsize=7, zorder=4,
                color="#000" if on else "#999")  # fmt: skip
    kinds = [i for i in COLOURS if any(e["input"] == i for e in edges)] or list(COLOURS)
    handles = [Line2D([0], [0], color=COLOURS[i], lw=2, label=f"into its {INPUT_WORDS[i]}"
                      if i != "readout" else "to the logits") for i in kinds]  # fmt: skip
    handles.append(Line2D([0], [0], color="#666", lw=1.5, ls="--", label="negative score"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
              frameon=False)  # fmt: skip
    ax.set_xlim(min(xs) - 0.6, max(xs) + 0.6)
    ax.set_ylim(-height - 0.8, height + 0.8)
    ax.invert_yaxis()
    ax.axis("off")
    p = next((q for q in result.curve if q.k == k), None)
    faith = f"; faithfulness {p.faithfulness:.2f} (95% CI {p.lo:.2f}..{p.hi:.2f})" if p else ""
    what = "units (edge x position)" if result.positions else "edges"
    ax.set_title(f"top {k:,} of {result.units:,} {what} by |{result.method.upper()} score|"
                 f"{faith}\n{result.metric}, {result.ablation} ablation, {result.n_pairs} pairs; "
                 "width = |score|", fontsize=8)  # fmt: skip
    fig.tight_layout()
    return fig


def curve_figure(result):
    """Faithfulness against k: the circuit's with its 95% interval, and the random sets'
    mean with their range."""
    from attnlab.interventions.figures import new_figure

    fig, ax = new_figure(figsize=(6.4, 3.8))
    k = np.array([p.k for p in result.curve])
    f = np.array([p.faithfulness for p in result.curve])
    ax.fill_between(k, [p.lo for p in result.curve], [p.hi for p in result.curve],
                    color="#1f77b4", alpha=0.2, lw=0, label="circuit: 95% CI (bootstrap)")  # fmt: skip
    ax.plot(k, f, "o-", color="#1f77b4", ms=3, label=f"top k by |{result.method.upper()} score|")
    ax.fill_between(k, [p.random_lo for p in result.curve], [p.random_hi for p in result.curve],
                    color="#999", alpha=0.25, lw=0,
                    label=f"random sets: range of {result.random_sets}")  # fmt: skip
    ax.plot(k, [p.random_mean for p in result.curve], "s--", color="#666", ms=3,
            label="random sets: mean")  # fmt: skip
    ax.axhline(1.0, color="#2ca02c", lw=0.8, ls=":")
    ax.axhline(0.0, color="#d62728", lw=0.8, ls=":")
    ax.axvline(result.k, color="#444", lw=0.8, ls="-.", label=f"the circuit: k = {result.k:,}")
    ax.set_xscale("log")
    what = "units (edge x position)" if result.positions else "edges"
    ax.set_xlabel(f"k, {what} kept (of {result.units:,})", fontsize=8)
    ax.set_ylabel("faithfulness (share of the gap)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.set_title(f"{result.metric}, {result.ablation} ablation, {result.n_pairs} pairs "
                 f"(1 = clean, 0 = every unit ablated)", fontsize=8)  # fmt: skip
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


PAGE_UNITS = 2000  # the most units the page's slider reaches


def page_data(result) -> dict:
    """What the HTML page draws: components, the top units, the curve."""
    places = layout(result)
    n = min(result.units, PAGE_UNITS)
    units = []
    for u in result.order[:n]:
        kind = result.kinds[u]
        w, r = _component(kind)
        units.append({"from": w, "to": r, "input": kind["input"], "label": result.labels[u],
                      "score": float(result.scores[u])})  # fmt: skip
    return {"nodes": places, "units": units, "k": min(result.k, n), "total": result.units,
            "curve": [p.to_dict() for p in result.curve], "colours": COLOURS,
            "inputs": INPUT_WORDS, "title": f"circuit of {result.metric} on {result.prompts}",
            "method": result.method_words(), "ablation": result.ablation_words(),
            "positions": result.positions}  # fmt: skip


def write_page(result, path) -> Path:
    """The offline page (no network: everything inline), written atomically."""
    from attnlab.files import atomic_write
    from attnlab.render.display import script_json

    text = PAGE.replace("__TITLE__", html.escape(f"circuit: {result.metric}")).replace(
        "__DATA__", script_json(page_data(result))
    )
    path = Path(path)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return path


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font: 13px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 16px; margin: 0 0 4px; } .note { color: #555; margin: 2px 0; }
#controls { margin: 10px 0; } #k { width: 420px; vertical-align: middle; }
svg { border: 1px solid #ddd; background: #fff; }
table { border-collapse: collapse; font: 12px monospace; margin-top: 8px; }
td, th { padding: 1px 8px; text-align: left; } td.n { text-align: right; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 22px; height: 3px; vertical-align: middle; margin-right: 4px; }
</style></head><body>
<h1 id="title"></h1>
<div class="note" id="method"></div><div class="note" id="ablation"></div>
<div id="controls"><label>k = <b id="kval"></b> <input type="range" id="k" min="1"></label>
<span id="faith" class="note"></span></div>
<div class="legend" id="legend"></div>
<svg id="graph"></svg>
<table id="units"></table>
<script>
const D = __DATA__;
const $ = id => document.getElementById(id);
$("title").textContent = D.title;
$("method").textContent = "method: " + D.method;
$("ablation").textContent = "ablation: " + D.ablation + (D.positions ? " (units: edges at one position)" : "");
const slider = $("k");
slider.max = D.units.length; slider.value = D.k;
const names = Object.keys(D.nodes);
const xs = names.map(n => D.nodes[n].x), ys = names.map(n => D.nodes[n].y);
const W = 110 * (Math.max(...xs) + 1) + 60, H = 44 * (Math.max(...ys) - Math.min(...ys) + 1) + 60;
const svg = $("graph"); svg.setAttribute("width", W); svg.setAttribute("height", H);
const px = n => 50 + 110 * D.nodes[n].x, py = n => 30 + 44 * (D.nodes[n].y - Math.min(...ys));
const NS = "http://www.w3.org/2000/svg";
function el(tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
for (const k in D.inputs) {
  const s = document.createElement("span");
  s.innerHTML = '<i style="background:' + D.colours[k] + '"></i>' + (k === "readout" ? "to the logits" : "into its " + D.inputs[k]);
  $("legend").appendChild(s);
}
function draw(k) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const acc = {};
  for (const u of D.units.slice(0, k)) {
    const key = u.from + "|" + u.to + "|" + u.input;
    if (!acc[key]) acc[key] = {from: u.from, to: u.to, input: u.input, score: 0, units: 0};
    acc[key].score += u.score; acc[key].units += 1;
  }
  const edges = Object.values(acc);
  const top = Math.max(1e-12, ...edges.map(e => Math.abs(e.score)));
  const on = new Set(); edges.forEach(e => { on.add(e.from); on.add(e.to); });
  for (const e of edges) {
    const x1 = px(e.from) + 14, y1 = py(e.from), x2 = px(e.to) - 14, y2 = py(e.to);
    const mx = (x1 + x2) / 2, my = (y1 + y2) / 2 - 0.12 * (x2 - x1);
    const p = el("path", {d: `M${x1},${y1} Q${mx},${my} ${x2},${y2}`, fill: "none",
      stroke: D.colours[e.input], "stroke-width": 0.6 + 5 * Math.abs(e.score) / top,
      "stroke-dasharray": e.score < 0 ? "5,3" : ""});
    p.appendChild(el("title", {}, `${D.nodes[e.from].label} -> ${D.nodes[e.to].label} (${D.inputs[e.input]}): ${e.score.toFixed(4)}` + (e.units > 1 ? ` over ${e.units} units` : "")));
    svg.appendChild(p);
  }
  for (const n of names) {
    const lit = on.has(n);
    svg.appendChild(el("circle", {cx: px(n), cy: py(n), r: 15, fill: lit ? "#fff3c4" : "#f4f4f4", stroke: lit ? "#444" : "#ccc"}));
    svg.appendChild(el("text", {x: px(n), y: py(n) + 4, "text-anchor": "middle", "font-size": 10, fill: lit ? "#000" : "#aaa"}, D.nodes[n].label));
  }
  $("kval").textContent = k + " of " + D.total;
  let best = null;
  for (const c of D.curve) if (c.k <= k && (!best || c.k > best.k)) best = c;
  $("faith").textContent = best ? `faithfulness at k = ${best.k}: ${best.faithfulness.toFixed(3)} (95% CI ${best.lo.toFixed(2)}..${best.hi.toFixed(2)}); random sets of ${best.k}: ${best.random_mean.toFixed(3)}` : "";
  const t = $("units"); t.innerHTML = "<tr><th>#</th><th>unit</th><th>score</th></tr>";
  D.units.slice(0, Math.min(k, 60)).forEach((u, i) => {
    const r = t.insertRow(); r.insertCell().textContent = i + 1;
    r.insertCell().textContent = u.label;
    const c = r.insertCell(); c.textContent = (u.score >= 0 ? "+" : "") + u.score.toFixed(4); c.className = "n";
  });
}
slider.addEventListener("input", () => draw(+slider.value));
draw(+slider.value);
</script></body></html>
"""
