"""`attnlab heads RUN`: every self-attention head's scores and kind (``attnlab.inspect.heads``);
with ``--importance``, the loss change per ablated head and the pruning curve (``Run.heads``)."""

from __future__ import annotations

import json
import sys

from attnlab.cli import UsageError, Verb, int_at_least, output_file, register
from attnlab.cli.common import load, show


def cmd_heads(args) -> int:
    if not args.importance:  # every head's scores and kind (head_scores below)
        given = [o for o, v in (("TEXT", args.text), ("--data", args.data), ("--inputs", args.inputs),
                                ("--png", args.png), ("--no-prune", args.no_prune)) if v]  # fmt: skip
        if given:
            raise UsageError(f"{given[0]} goes with --importance; without it, heads scores every "
                             "head on repeated random tokens and the run's held-out sample")  # fmt: skip
        return head_scores(args)
    if args.all or args.sequences != 16:
        raise UsageError("--sequences and --all go with the head scores, not --importance")
    args._png = output_file(args.png, ".png", "--png")
    given = [x for x in (args.text, args.data, args.inputs) if x is not None]
    if len(given) > 1:
        raise UsageError("--importance measures the loss on TEXT, on --data FILE (a GPT: windows "
                         "of a corpus), on --inputs FILE (one input per line) or, given none, "
                         "on the run's held-out split: give one at most")  # fmt: skip
    run = load(args)
    from attnlab.interventions.importance import check_rankable

    check_rankable(run.subject)  # nothing to rank, or nothing to rank by: before any data is read
    if args.data is not None:
        from attnlab.cli.limits import check_forward_memory, config_field

        c = run.model.config
        check_forward_memory(c, next(run.model.parameters()).device, args.windows,
                             config_field(c, "block_size") or 1, "--windows")  # fmt: skip
    result = run.heads(args.text, importance=True, data=args.data, inputs=args.inputs,
                       windows=args.windows, mode=args.mode, prune=not args.no_prune,
                       quiet=args.quiet)  # fmt: skip
    return show(result, args)


def head_scores(args) -> int:
    """``attnlab heads RUN`` without --importance: every head's scores and kind."""
    from attnlab.cli.limits import check_forward_memory, config_field
    from attnlab.inspect.heads import heads_of_run
    from attnlab.render.display import console
    from attnlab.run import load_run
    from attnlab.rundir import read_run_config
    from attnlab.runtime import resolve_device

    c = read_run_config(args.run).get("config") or {}  # sized before the model is loaded
    check_forward_memory(c, resolve_device(args.device), args.sequences,
                         config_field(c, "block_size", "max_len") or 1, "--sequences", record=True)  # fmt: skip
    run = load_run(args.run, args.device)
    report = heads_of_run(run, n=args.sequences, seed=args.seed)
    if args.json:  # what the model is, then the list of heads; everything else with --all
        out = report.to_dict() if args.all else {"heads": report.rows}
        sys.stdout.write(json.dumps({"about": run.about, **out}, indent=2) + "\n")
    else:
        console().print(report)
    return 0


def add(sub) -> None:
    p = sub.add_parser("heads", help="every head's scores (previous-token, induction, ...) and "
                       "kind; --importance: the loss without it",
                       description="Without --importance: score every self-attention head on "
                       "random token sequences repeated once (and on a held-out sample of the "
                       "run's data): previous-token, duplicate-token, induction, first-token "
                       "(sink), self, entropy, each in [0, 1]; name each head after the score "
                       "over its threshold; Q/K/V composition between consecutive layers. "
                       "--importance: the loss change when each head is ablated "
                       "(a table and a heatmap), then pruning by that ranking with the loss "
                       "after each removal (a curve). The loss is measured on TEXT, --data or "
                       "--inputs; given none, on the run's held-out split, as training "
                       "measured it.")  # fmt: skip
    p.add_argument("run", help="run directory")
    p.add_argument("text", nargs="?", help="measure on this input")
    mode = p.add_argument_group("what to compute")
    mode.add_argument("--importance", action="store_true",
                      help="loss change per ablated head, and the pruning curve")  # fmt: skip
    p.add_argument("--data", metavar="FILE", help="a GPT: measure on windows of this corpus")
    p.add_argument("--inputs", metavar="FILE", help="measure on these inputs, one per line")
    p.add_argument("--windows", type=int, default=16, help="--data: windows")
    p.add_argument("--mode", choices=("zero", "mean", "resample"), default="zero",
                   help="how a head is ablated: zero, its mean over the batch and positions of "
                   "the intact run (every mean recorded before anything is ablated, so the "
                   "pruning curve's later heads keep their clean means), or resampled")  # fmt: skip
    p.add_argument("--no-prune", action="store_true", help="skip the pruning curve")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--png", metavar="FILE", help="heatmap and pruning curve")
    p.add_argument("--json", action="store_true",
                   help="print the result as JSON (the scores: [{layer, head, scores, kind}])")  # fmt: skip
    p.add_argument("--sequences", type=int_at_least(1), default=16,
                   help="scores: random sequences r r")  # fmt: skip
    p.add_argument("--seed", type=int_at_least(0), default=0, help="scores: their seed")
    p.add_argument("--all", action="store_true",
                   help="scores with --json: also the sample scores, losses and composition")  # fmt: skip
    p.set_defaults(func=cmd_heads)


VERB = register(Verb("heads", 200, add))
