"""Cross-attention alignment of trained `dates` runs: does the month word feed the month digits?

    python benchmarks/dates_alignment.py runs/dates-transformer runs/dates-lstm-attention \
        --text "saturday 21 nov 2026" --png docs/dates_cross_attention.png

For each run: translate the text greedily, record a teacher-forced pass on (text, translation)
(``attnlab.inspect.record``), and draw the cross-attention map, rows = the output character each
decoder step produced, columns = source characters. A Transformer map is the mean over heads
of one decoder layer (``--layer``, default the last); an LSTM has one map. Prints, per run,
the share of the month digits' attention that falls on the month word (or the character
right after it).
"""

from __future__ import annotations

import argparse
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from attnlab.data.tasks import MONTH_ABBR, MONTHS  # noqa: E402
from attnlab.inspect.recording import record  # noqa: E402
from attnlab.render.plots import heatmap  # noqa: E402
from attnlab.run import load_run  # noqa: E402


def cross_map(rec: dict, layer: int | None):
    """(T, S) cross-attention weights of the recording, averaged over heads."""
    names = sorted(k for k in rec.cache if k.endswith(("cross.weights", "decoder.attn.weights")))
    names = [
        n for n in names if "cross" in n
    ] or names  # a Transformer's decoder self-attn is not it
    if not names:
        raise SystemExit("this run has no cross-attention (an LSTM without attention?)")
    name = names[-1] if layer is None else names[layer]
    return rec.cache[name][0].mean(0), name  # (T, S)


def month_share(w, src: str, out_tokens: list[str]) -> float:
    """Attention from output positions 5-6 (the month digits of YYYY-MM-DD) onto the month word
    and the character after it: a left-to-right LSTM encoder's state there is the first that has
    read the whole word, so that is where its attention lands."""
    months = set(MONTHS) | set(MONTH_ABBR)
    m = next((m for m in re.finditer(r"[a-zA-Z]+", src) if m.group().lower() in months), None)
    if m is None or len(out_tokens) < 7:
        return float("nan")
    return float(w[5:7, m.start() : m.end() + 1].sum(-1).mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("runs", nargs="+")
    p.add_argument("--text", default="saturday 21 nov 2026")
    p.add_argument("--layer", type=int, default=None)
    p.add_argument("--png", default="docs/dates_cross_attention.png")
    args = p.parse_args()
    fig, axes = plt.subplots(1, len(args.runs), figsize=(5.2 * len(args.runs), 3.6), squeeze=False)
    for ax, run in zip(axes[0], args.runs):
        model, tok = load_run(run)
        rec = record(model, tok, args.text)
        w, name = cross_map(rec, args.layer)
        rows = rec.extra["predicted"]
        cols = rec.tokens["encoder"]
        arch = (
            "Transformer" if model.model_type == "seq2seq" else f"LSTM ({model.config.attention})"
        )
        heatmap(ax, w.numpy(), rows, cols, title=f"{arch}: {name}", cmap="Blues", vmin=0.0,
                vmax=1.0, colorbar=True, aspect="auto", fontsize=7, title_size=8,
                xtick_rotation=0, xlabel=f"source: {args.text!r}",
                ylabel=f"output: {rec.extra['translation']}")  # fmt: skip
        share = month_share(w, args.text, rows)
        print(f"| {run} | {arch} | {rec.extra['translation']} | {share:.0%} |")
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
