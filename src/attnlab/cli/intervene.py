"""Intervention verbs: ablate, patch, lens, attribute, heads.

Each verb parses its arguments, loads the run, calls one function of ``attnlab.interventions``
and prints the result (a table, or ``--json``); ``--png FILE`` also draws it. Bad input (a
head or layer that does not exist, an edit that never fires, inputs that do not line up) is
one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys

from attnlab.cli import UsageError, int_at_least, output_file
from attnlab.cli.limits import GAUSS_LEGENDRE_MAX


def _ints(text: str | None, option: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected integers separated by commas") from None


def _run(args):
    """The run (``attnlab.run.Run``): each verb calls its method, which the Python API shares."""
    from attnlab.run import load_run

    return load_run(args.run, args.device)


def _show(result, args) -> int:
    """Write --png (before printing, so a failed write prints only its error), then print."""
    from attnlab.render.display import console

    png = getattr(args, "_png", None)
    if png is not None:
        result.save_png(png)
    if getattr(result, "warning", None):
        print(f"attnlab: warning: {result.warning}", file=sys.stderr)
    if args.json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        console().print(result)
    if png is not None:
        print(f"wrote {png} ({png.stat().st_size / 1024:.1f} KiB)", file=sys.stderr)
    return 0


def cmd_ablate(args) -> int:

    args._png = output_file(args.png, ".png", "--png")
    chosen = [x for x in (args.head, args.site, args.context or None) if x]
    if len(chosen) != 1:
        raise UsageError("say what to ablate: --head L.H[,L.H...], --site HOOK_NAME or --context")
    positions, neurons = _ints(args.positions, "--positions"), _ints(args.neurons, "--neurons")
    if neurons is not None and args.site is None:
        raise UsageError("--neurons picks units of one activation: give it with --site")
    result = _run(args).ablate(args.text, args.head, site=args.site, context=args.context,
                               positions=positions, neurons=neurons, mode=args.mode,
                               reference=args.reference, top=args.top, position=args.position)  # fmt: skip
    return _show(result, args)


def cmd_patch(args) -> int:
    args._png = output_file(args.png, ".png", "--png")
    result = _run(args).patch(args.clean, args.corrupt, args.target, foil=args.foil, by=args.by,
                              position=args.position, reverse=args.reverse,
                              positions=_ints(args.positions, "--positions"))  # fmt: skip
    return _show(result, args)


def cmd_lens(args) -> int:
    from attnlab.interventions import fit_tuned_lens
    from attnlab.interventions.lens import describe_fit

    args._png = output_file(args.png, ".png", "--png")
    if args.train_tuned:
        if args.data is None:
            raise UsageError("--train-tuned needs --data FILE (the text to fit the probes on)")
        if args.max_tokens < 2:
            raise UsageError(f"--max-tokens must be at least 2, got {args.max_tokens}")
        if args.ridge < 0:
            raise UsageError(f"--ridge must be >= 0, got {args.ridge}")
        if args.png and args.text is None:
            raise UsageError("--png draws the lens of TEXT: give TEXT too")
    elif args.text is None:
        raise UsageError("give TEXT to read with the lens (or --train-tuned --data FILE)")
    elif args.data is not None:
        raise UsageError("--data is for --train-tuned")
    run = _run(args)
    if args.train_tuned:
        tuned = fit_tuned_lens(run.subject, args.data, args.max_tokens, args.ridge,
                               quiet=args.quiet)  # fmt: skip
        files = tuned.save(args.run)
        print("held-out mean KL(final || lens), nats:\n" + describe_fit(tuned), file=sys.stderr)
        for f in files:
            print(f"wrote {f}", file=sys.stderr)
        if args.text is None:
            if args.json:
                out = {"about": run.about, **tuned.meta}
                sys.stdout.write(__import__("json").dumps(out, indent=2) + "\n")
            else:
                print(describe_fit(tuned))
            return 0
    return _show(run.lens(args.text, tuned=args.tuned or args.train_tuned), args)


def cmd_attribute(args) -> int:
    args._png = output_file(args.png, ".png", "--png")
    if args.method in ("dla", "ig", "grad") and args.target is None:
        raise UsageError(f"--method {args.method} attributes a token's logit: give --target TOKEN")
    if args.method == "ig" and args.rule == "gauss-legendre" and args.steps > GAUSS_LEGENDRE_MAX:
        raise UsageError(f"--steps must be at most {GAUSS_LEGENDRE_MAX} with --rule "
                         "gauss-legendre (its nodes cost steps^3 to find, and 256 already "
                         f"integrate exactly to degree 511), got {args.steps}; --rule riemann "
                         "takes more")  # fmt: skip
    if args.method in ("rollout", "flow") and (args.target or args.foil):
        raise UsageError(f"--method {args.method} follows attention only: it takes no --target "
                         "(pick the output with --position)")  # fmt: skip
    result = _run(args).attribute(args.text, args.method, args.target, foil=args.foil,
                                  position=args.position, steps=args.steps, rule=args.rule,
                                  stack=args.stack, residual=args.residual)  # fmt: skip
    return _show(result, args)


def cmd_heads(args) -> int:
    if not args.importance:  # every head's scores and kind (cli/timeline.py)
        from attnlab.cli.timeline import cmd_head_scores

        given = [o for o, v in (("TEXT", args.text), ("--data", args.data), ("--inputs", args.inputs),
                                ("--png", args.png), ("--no-prune", args.no_prune)) if v]  # fmt: skip
        if given:
            raise UsageError(f"{given[0]} goes with --importance; without it, heads scores every "
                             "head on repeated random tokens and the run's held-out sample")  # fmt: skip
        return cmd_head_scores(args)
    if args.all or args.sequences != 16:
        raise UsageError("--sequences and --all go with the head scores, not --importance")
    args._png = output_file(args.png, ".png", "--png")
    given = [x for x in (args.text, args.data, args.inputs) if x is not None]
    if len(given) > 1:
        raise UsageError("--importance measures the loss on TEXT, on --data FILE (a GPT: windows "
                         "of a corpus), on --inputs FILE (one input per line) or, given none, "
                         "on the run's held-out split: give one at most")  # fmt: skip
    run = _run(args)
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
    return _show(result, args)


def register(sub) -> None:
    """Add the intervention verbs to the `attnlab` sub-parsers."""

    def common(p, text: bool = True) -> None:
        p.add_argument("run", help="run directory (trained or imported)")
        if text:
            p.add_argument("text", help="the input: text, or for a ViT an image file or test:N")
        p.add_argument("--png", metavar="FILE", help="also draw the result into a PNG")
        p.add_argument("--json", action="store_true", help="print the result as JSON")

    def position(p) -> None:
        p.add_argument("--position", type=int, default=None,
                       help="output position the metric reads (default: the last; a masked "
                       "LM: the first [MASK]; an encoder-decoder: where the output is TARGET)")  # fmt: skip

    p = sub.add_parser("ablate", help="knock out heads (or any activation): loss change",
                       description="Ablate heads, an LSTM's context vector, or any named "
                       "activation (--site), and print the change in the loss and in the top "
                       "predictions. The result says how many values the ablation changed.")  # fmt: skip
    common(p)
    p.add_argument("--head", metavar="L.H[,L.H...]",
                   help="heads: 1.2 (one stack); encoder.0.1, decoder.1.0, cross.1.3")  # fmt: skip
    p.add_argument("--site", metavar="HOOK", help="any hook name, e.g. blocks.0.mlp.hidden")
    p.add_argument("--context", action="store_true", help="an LSTM decoder's context vector")
    p.add_argument("--positions", metavar="P,...", help="ablate only these positions")
    p.add_argument("--neurons", metavar="N,...", help="with --site: only these units")
    p.add_argument("--mode", choices=("zero", "mean", "resample"), default="zero",
                   help="zero: zeros; mean: the mean over the positions of the clean "
                   "(unablated) run of --reference (or of the text), every mean recorded "
                   "before anything is ablated; resample: values from --reference (or the text "
                   "shuffled)")  # fmt: skip
    p.add_argument("--reference", metavar="TEXT",
                   help="mean/resample: the input to take values from")  # fmt: skip
    p.add_argument("--top", type=int, default=5, help="top predictions to show")
    position(p)
    p.set_defaults(func=cmd_ablate)

    p = sub.add_parser("patch", help="activation patching from a clean into a corrupt input",
                       description="Copy one activation at a time from the clean run into the "
                       "corrupt one; recovered = (patched - corrupt) / (clean - corrupt) of the "
                       "logit of TARGET (minus FOIL's). Attribution patching (the gradient "
                       "approximation) is reported beside it, with its error.")  # fmt: skip
    common(p, text=False)
    p.add_argument("--clean", required=True, metavar="TEXT", help="the input that gives TARGET")
    p.add_argument("--corrupt", required=True, metavar="TEXT",
                   help="the input the clean activations are patched into")  # fmt: skip
    p.add_argument("--target", required=True, metavar="TOKEN", help="the token whose logit")
    p.add_argument("--foil", metavar="TOKEN", help="metric = logit(TARGET) - logit(FOIL)")
    p.add_argument("--by", choices=("position", "head"), default="position",
                   help="layer x position (the residual stream) or layer x head")  # fmt: skip
    p.add_argument("--reverse", action="store_true",
                   help="patch the corrupt run's activations into the clean run (noising)")  # fmt: skip
    p.add_argument("--positions", metavar="P,...",
                   help="--by position: patch only these positions (exact patching runs one "
                   "forward pass per layer x position)")  # fmt: skip
    position(p)
    p.set_defaults(func=cmd_patch)

    p = sub.add_parser("lens", help="the logit lens (or tuned lens) at every layer",
                       description="Read every residual stream point with the model's own "
                       "head: the top token per layer x position and the KL divergence to the "
                       "final distribution. --train-tuned --data FILE fits the tuned lens (one "
                       "affine probe per layer, in closed form) and saves it in the run.")  # fmt: skip
    p.add_argument("run", help="run directory")
    p.add_argument("text", nargs="?", help="the input to read")
    p.add_argument("--tuned", action="store_true", help="use the run's tuned lens")
    p.add_argument("--train-tuned", action="store_true", help="fit the tuned lens and save it")
    p.add_argument("--data", metavar="FILE", help="--train-tuned: text to fit on")
    p.add_argument("--max-tokens", type=int, default=32768, help="--train-tuned: tokens used")
    p.add_argument("--ridge", type=float, default=1e-3, help="--train-tuned: ridge strength")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--png", metavar="FILE", help="draw the KL heatmap with the top tokens")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_lens)

    p = sub.add_parser("attribute", help="attribute an output: dla, rollout, flow, ig, grad",
                       description="dla: split TARGET's logit into embeddings, heads, MLPs and "
                       "biases (LayerNorm scales frozen). rollout/flow: attention paths with the "
                       "residual term (Abnar & Zuidema 2020). ig/grad: integrated gradients or "
                       "input x gradient on the input embeddings, with IG's completeness "
                       "error.")  # fmt: skip
    common(p)
    p.add_argument("--method", required=True, choices=("dla", "rollout", "flow", "ig", "grad"),
                   help="how (above)")  # fmt: skip
    p.add_argument("--target", metavar="TOKEN", help="dla, ig, grad: the token whose logit")
    p.add_argument("--foil", metavar="TOKEN", help="attribute logit(TARGET) - logit(FOIL)")
    p.add_argument("--steps", type=int, default=64, help="ig: integration steps")
    p.add_argument("--rule", choices=("gauss-legendre", "riemann"), default="gauss-legendre",
                   help="ig: quadrature rule")  # fmt: skip
    p.add_argument("--stack", choices=("encoder", "decoder"), default=None,
                   help="rollout/flow of an encoder-decoder: which self-attention (default decoder)")  # fmt: skip
    p.add_argument("--residual", type=float, default=0.5,
                   help="rollout/flow: weight of the identity in A' = (1 - r) A + r I")  # fmt: skip
    position(p)
    p.set_defaults(func=cmd_attribute)

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
