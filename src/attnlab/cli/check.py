"""`attnlab check RUN`: conformance checks on random inputs (no future leak, cache == no
cache, ...); exit 1 if any fails (``Run.check``)."""

from __future__ import annotations

from attnlab.cli import Verb, int_at_least, register
from attnlab.cli.common import load, print_result
from attnlab.cli.limits import check_forward_memory, config_field


def cmd_check(args) -> int:
    run = load(args)
    model = run.model
    longest = config_field(model.config, "block_size", "max_len") or args.length
    check_forward_memory(model.config, next(model.parameters()).device, args.batch,
                         min(args.length, longest), "--batch", record=True)  # fmt: skip
    report = run.check(length=args.length, batch=args.batch, seed=args.seed)
    print_result(report, args.json)
    return 0 if report.ok else 1


def add(sub) -> None:
    pos, nonneg = int_at_least(1), int_at_least(0)

    p = sub.add_parser(
        "check",
        help=VERB.help,
        description="Run conformance checks on random inputs; print pass/fail and the "
        "measured difference of each; exit 1 if any fails.",
    )
    p.add_argument("run", help="run directory")
    p.add_argument("--length", type=pos, default=16, help="sequence length of the probes")
    p.add_argument("--batch", type=pos, default=2, help="batch size of the probes")
    p.add_argument("--seed", type=nonneg, default=0, help="seed of the random probe ids")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_check)


VERB = register(
    Verb(
        "check",
        100,
        add,
        dtype=None,
        help="conformance checks: no future leak, cache == no cache, ...",
    )
)
