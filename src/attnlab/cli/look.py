"""Look-inside verbs: trace, attention, similarity, influence, explore, check.

Each verb loads a run directory, records one forward pass over the text and calls one library
function of ``attnlab.inspect``; results go to stdout (explore's: the page's path), "wrote
FILE" lines to stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from attnlab.cli import UsageError, int_at_least, output_file
from attnlab.cli.limits import check_forward_memory, config_field


def _load(args):
    from attnlab.run import load_run

    return load_run(args.run, args.device)


def _record(args):
    """(model, tokenizer, Recording): the run's ``record``, which knows its class names and
    where imported weights came from."""
    run = _load(args)
    return run.model, run.tokenizer, run.record(args.text)


def _print(result, as_json: bool = False) -> None:
    """The result on stdout: its JSON (which starts with "about"), or its terminal rendering
    after a line saying what the model is (a trace says it itself)."""
    from attnlab.inspect.trace import Trace
    from attnlab.render.display import console

    if as_json:
        sys.stdout.write(result.to_json() + "\n")
        return
    out = console()
    if result.about and result.about.get("description") and not isinstance(result, Trace):
        out.print(f"the model: {result.about['description']}.", style="italic", markup=False)
    out.print(result)


def _wrote(path: Path, what: str) -> None:
    print(f"wrote {what} {path} ({path.stat().st_size / 1024:.1f} KiB)", file=sys.stderr)


def cmd_trace(args) -> int:
    from attnlab.inspect.trace import trace

    model, tokenizer, rec = _record(args)
    result = trace(
        model, tokenizer, args.text, layer=args.layer, head=args.head, top_k=args.top, rec=rec
    )
    result.start = _start(args.start, max(map(len, rec.tokens.values()), default=0))
    _print(result, args.json)
    return 0


def _start(start: int, n: int) -> int:
    """--start: the first key column of the terminal tables, one of the text's n tokens."""
    if start >= max(1, n):
        raise UsageError(f"--start {start}: the text has {n} tokens (0..{n - 1})")
    return start


def cmd_attention(args) -> int:
    from attnlab.inspect.attention import attention, attention_grid

    if args.all and args.png is None:
        raise UsageError("--all draws the grid of every layer x head into --png FILE; give --png")
    png = output_file(args.png, ".png", "--png")
    _, _, rec = _record(args)
    if args.all:  # the grid's summary, not one head's table: the picture is the result
        grid = attention_grid(rec, name=args.map, title=f"{args.run}: {args.text!r}")
        grid.save_png(png)
        if args.json:
            sys.stdout.write(
                json.dumps(
                    {"about": grid.about, "png": str(png), **grid.to_dict()}, ensure_ascii=False
                )
                + "\n"
            )
        else:
            print(f"{png}: attention grid, {grid.summary()}")
        _wrote(png, "attention grid (every layer x head)")
        return 0
    amap = attention(
        rec, layer=args.layer, head=args.head, mean=args.mean, name=args.map, start=args.start
    )
    if png is not None:  # written before anything is printed: a failed write prints only itself
        amap.save_png(png)
    _print(amap, args.json)
    if png is not None:
        _wrote(png, "attention heatmap")
    return 0


def cmd_similarity(args) -> int:
    from attnlab.inspect.similarity import similarity

    png = output_file(args.png, ".png", "--png")
    _, _, rec = _record(args)
    result = similarity(rec, layer=args.layer)
    result.start = _start(args.start, max(len(ly.tokens) for ly in result.layers))
    if png is not None:  # written before anything is printed
        result.save_png(png)
    _print(result, args.json)
    if png is not None:
        _wrote(png, "similarity heatmaps")
    return 0


def cmd_influence(args) -> int:
    from attnlab.inspect.influence import influence

    out = output_file(args.csv, ".csv", "--csv")
    png = output_file(args.png, ".png", "--png")
    model, _, rec = _record(args)
    result = influence(model, rec, n_sources=args.sources, top=args.top)
    if out is not None:  # written before anything is printed
        result.to_csv(out)
    if png is not None:
        result.save_png(png)
    _print(result, args.json)
    if out is not None:
        _wrote(out, "influence table")
    if png is not None:
        _wrote(png, "influence heatmap")
    return 0


def cmd_explore(args) -> int:
    from attnlab.inspect.explorer import explore

    # the page: --html FILE, else explorer.html in the run directory
    out = output_file(args.html, ".html", "--html") or Path(args.run) / "explorer.html"
    if args.steps:  # the run's snapshots on a step slider: no text, no forward pass
        from attnlab.inspect.step_explorer import explore_steps

        if args.text is not None or args.interventions:
            what = "TEXT" if args.text is not None else "--interventions"
            raise UsageError(
                f"--steps shows the run's snapshots on their own probes: give no {what}"
            )
        explore_steps(args.run).save(out)
        _wrote(out, "step explorer")
        print(out)
        return 0
    if args.text is None:
        raise UsageError("explore needs TEXT (or --steps for the run's snapshots over training)")
    run = _load(args)
    model, rec = run.model, run.record(args.text)
    tabs = _intervention_tabs(run, args) if args.interventions else None
    page = explore(
        rec,
        model,
        title=f"attnlab explorer: {args.text}",
        max_tokens=args.max_tokens,
        start=args.start,
        tabs=tabs,
        tokenizer=run.tokenizer,
    )
    page.save(out)
    if page.data["note"]:
        print(f"attnlab: note: {page.data['note']}", file=sys.stderr)
    _wrote(out, "explorer page")
    print(out)
    return 0


def _intervention_tabs(run, args) -> dict[str, str]:
    """--interventions: the one-input interventions as extra tabs of the page."""
    from attnlab.interventions import InterventionError, explorer_tabs

    try:
        return explorer_tabs(run.subject, args.text)
    except InterventionError as e:
        raise UsageError(str(e)) from None


def cmd_check(args) -> int:
    from attnlab.inspect.check import check

    run = _load(args)
    model = run.model
    longest = config_field(model.config, "block_size", "max_len") or args.length
    check_forward_memory(model.config, next(model.parameters()).device, args.batch,
                         min(args.length, longest), "--batch", record=True)  # fmt: skip
    report = check(model, length=args.length, batch=args.batch, seed=args.seed)
    report.about = run.about
    _print(report, args.json)
    return 0 if report.ok else 1


def _run_and_text(p) -> None:
    p.add_argument("run", help="run directory (written by `attnlab train` or `import-hf`)")
    p.add_argument("text", help="the text to run through the model")


def register(sub) -> None:
    """Add this area's verbs to the `attnlab` sub-parsers."""
    pos, nonneg = int_at_least(1), int_at_least(0)

    p = sub.add_parser(
        "trace",
        help="explain one forward pass step by step",
        description="Explain one forward pass: tokens, embeddings, Q/K/V of one head, "
        "scores, mask, softmax, heads, residual, FFN, and what the model predicts: a GPT's next "
        "token, a masked LM's [MASK] fillers, a classifier's class, each decoder step of an "
        "encoder-decoder (with its cross-attention), an LSTM's alignment.",
    )
    _run_and_text(p)
    p.add_argument("--layer", type=nonneg, default=0, help="layer to open up")
    p.add_argument("--head", type=nonneg, default=0, help="head to open up")
    p.add_argument("--top", type=pos, default=5,
                   help="predictions to show: next tokens, [MASK] fillers, classes")  # fmt: skip
    p.add_argument("--start", type=nonneg, default=0,
                   help="first key shown in the token x token tables (they page to the "
                   "terminal's width from there)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the same data as JSON")
    p.set_defaults(func=cmd_trace)

    p = sub.add_parser(
        "attention",
        help="the token x token attention matrix of a layer and head",
        description="Print the attention matrix (row = query token, column = key token). "
        "--png saves a heatmap of it, or with --all a grid of every layer x head.",
    )
    _run_and_text(p)
    p.add_argument("--layer", type=nonneg, default=None, help="layer (default: 0)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--head", type=nonneg, default=None, help="head (default: 0)")
    g.add_argument("--mean", action="store_true", help="the mean over heads")
    p.add_argument(
        "--map",
        default=None,
        metavar="NAME",
        help="pick attention maps by name or part of it (e.g. cross, decoder)",
    )
    p.add_argument("--png", metavar="FILE", help="save a heatmap PNG")
    p.add_argument(
        "--all",
        action="store_true",
        help="with --png: a grid of every layer x head (prints the grid's summary)",
    )
    p.add_argument(
        "--start",
        type=nonneg,
        default=0,
        help="first key shown in the terminal table (it pages to the terminal's width from "
        "there; past 32 query rows, also the first query)",
    )
    p.add_argument("--json", action="store_true", help="print the matrix as JSON")
    p.set_defaults(func=cmd_attention)

    p = sub.add_parser(
        "similarity", help="token x token cosine similarity before and after each block"
    )
    _run_and_text(p)
    p.add_argument(
        "--layer",
        type=nonneg,
        default=None,
        help="show this layer's matrices (default: the input and the last output)",
    )
    p.add_argument("--start", type=nonneg, default=0,
                   help="first token (column) shown in the terminal's matrices")  # fmt: skip
    p.add_argument("--png", metavar="FILE",
                   help="save every layer's matrix as heatmaps (before the first, after each)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print every layer's matrices as JSON")
    p.set_defaults(func=cmd_similarity)

    p = sub.add_parser(
        "influence",
        help="how far its context moved each token, layer by layer",
        description="Per token and layer: ||h_after - h_before|| / ||h_before||, "
        "cos(h_before, h_after), the share of the update from attention and from the "
        "FFN, and the source tokens that contributed most (weight x ||W_O v||).",
    )
    _run_and_text(p)
    p.add_argument("--top", type=pos, default=20, help="rows of the ranked table to print")
    p.add_argument("--sources", type=pos, default=3, help="source tokens per row")
    p.add_argument("--csv", metavar="FILE", help="save the whole ranked table as CSV")
    p.add_argument("--png", metavar="FILE",
                   help="save how far context moved each token, layer x token, as a heatmap")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the whole table as JSON")
    p.set_defaults(func=cmd_influence)

    p = sub.add_parser(
        "explore",
        help="write a self-contained HTML explorer (no network)",
        description="An offline page to explore TEXT's attention; or, with --steps, one "
        "head's attention at every snapshot of a run (train --snapshot-every) on a step slider.",
    )
    p.add_argument("run", help="run directory (written by `attnlab train` or `import-hf`)")
    p.add_argument("text", nargs="?", help="the text to run through the model")
    p.add_argument("--steps", action="store_true",
                   help="the run's snapshots on a step slider instead of TEXT")  # fmt: skip
    p.add_argument("--html", metavar="FILE",
                   help="the page to write (default: RUN/explorer.html); its path is printed")  # fmt: skip
    p.add_argument(
        "--max-tokens",
        type=pos,
        default=128,
        help="tokens per sequence kept in the page (default 128; keeps it small)",
    )
    p.add_argument("--start", type=nonneg, default=0, help="first token of the window kept")
    p.add_argument("--interventions", action="store_true",
                   help="add tabs: logit lens, rollout, flow, DLA, integrated gradients, head "
                   "importance")  # fmt: skip
    p.set_defaults(func=cmd_explore)

    p = sub.add_parser(
        "check",
        help="conformance checks: no future leak, cache == no cache, ...",
        description="Run conformance checks on random inputs; print pass/fail and the "
        "measured difference of each; exit 1 if any fails.",
    )
    p.add_argument("run", help="run directory")
    p.add_argument("--length", type=pos, default=16, help="sequence length of the probes")
    p.add_argument("--batch", type=pos, default=2, help="batch size of the probes")
    p.add_argument("--seed", type=nonneg, default=0, help="seed of the random probe ids")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_check)
