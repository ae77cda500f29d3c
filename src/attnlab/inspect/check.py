"""Conformance checks any model can be put through (``attnlab check RUN``).

Each check runs the model on random token ids, measures one difference that must be (near)
zero, and passes when it is within tolerance:

- future leak (causal models): change the input at position j; outputs before j must not move
  (``attnlab.checks.find_future_leak``);
- KV cache == no cache (models with ``new_cache``): decoding a prefix then one token at a time
  gives the logits of one full forward pass;
- decoding == full pass (a GPT): ``start``/``step``, the path ``generate`` takes (its fast
  restatement of the forward pass where that applies), a prompt then one token per step,
  gives the log-probabilities of one full forward pass (an encoder-decoder's KV cache check
  already decodes through ``start``/``step``);
- fused == reference attention: every ``MultiHeadAttention`` with ``use_fused = False`` (the
  step-by-step path) gives the same outputs as the fused kernel;
- recording == no recording: recording every activation does not change the outputs;
- padding invariance (models with ``uses_padding``): appending pad tokens changes no output at
  a real position;
- eval determinism: two forward passes in eval mode give identical outputs;
- residual graph == forward (models with a residual stream): the graph the model declares
  (``attnlab.models.graph``: its writers, from each block's declared residual steps) adds up
  to every recorded point of every stream, the norms that sit on a stream frozen.

A model with half-precision weights (imported from bfloat16) computes in them: its tolerances
are a few rounding steps of its outputs (``_tolerance``), not float32's.

What a model declares for these (``attnlab.models.declare.ModelKind``): ``causal``,
``kv_cache``, ``decoded_by``, ``uses_padding`` and ``pad_id``, ``residual``, and its probes:
``probe_inputs`` (the random inputs every check runs on), ``probe_forward`` (what runs them),
``cache_difference`` and ``padding_difference`` (a kind's own measures of two checks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attnlab import hooks
from attnlab.attention import MultiHeadAttention
from attnlab.checks import find_future_leak
from attnlab.decoding import decoder_for
from attnlab.inspect.recording import max_positions, output_tensor
from attnlab.models.graph import Parts, walk
from attnlab.modes import evaluating
from attnlab.render.display import Result, table_html


@dataclass
class CheckResult:
    name: str
    passed: bool | None  # None = not applicable to this model (skipped)
    diff: float | None  # the measured difference
    tol: float | None
    detail: str = ""

    @property
    def status(self) -> str:
        return "skip" if self.passed is None else ("PASS" if self.passed else "FAIL")

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "status": self.status,
            "passed": self.passed,
            "diff": self.diff,
            "tol": self.tol,
            "detail": self.detail,
        }


@dataclass
class CheckReport(Result):
    results: list[CheckResult]

    @property
    def ok(self) -> bool:
        """No check failed (skipped checks do not count)."""
        return all(r.passed is not False for r in self.results)

    def __getitem__(self, name: str) -> CheckResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def __rich__(self):
        from rich.text import Text

        from attnlab.render.tables import FitTable

        table = FitTable(title="conformance checks")
        for col, just in (
            ("check", "left"),
            ("result", "left"),
            ("difference", "right"),
            ("tolerance", "right"),
            ("detail", "left"),
        ):
            table.add_column(col, justify=just, wrap=col == "detail")
        colour = {"PASS": "green", "FAIL": "bold red", "skip": "dim"}
        for r in self.results:
            table.add_row(
                r.name, Text(r.status, style=colour[r.status]), _num(r.diff), _num(r.tol), r.detail
            )
        n_fail = sum(r.passed is False for r in self.results)
        table.caption = "all checks passed" if self.ok else f"{n_fail} check(s) FAILED"
        return table

    def to_dict(self) -> dict:
        return {"ok": self.ok, "checks": [r.to_dict() for r in self.results]}

    def _repr_html_(self) -> str:
        n_fail = sum(r.passed is False for r in self.results)
        rows = [[r.name, r.status, _num(r.diff), _num(r.tol), r.detail] for r in self.results]
        return table_html(["check", "result", "difference", "tolerance", "detail"], rows,
                          "conformance checks",
                          "all checks passed" if self.ok else f"{n_fail} check(s) FAILED")  # fmt: skip


def _num(x) -> str:
    return "-" if x is None else f"{x:.3g}"


@torch.no_grad()
def check_future_leak(model, ids, tol: float = 1e-5) -> CheckResult:
    if not model.causal:
        return CheckResult("future leak", None, None, None, "model is not causal")
    report = find_future_leak(model.probe_forward, ids, atol=tol)
    detail = str(report)
    return CheckResult("future leak", not report.leaks, report.max_diff, tol, detail)


@torch.no_grad()
def check_kv_cache(model, ids, tol: float = 1e-4) -> CheckResult:
    diff = model.cache_difference(ids)  # e.g. an encoder-decoder's own probe
    if diff is not None:
        diff = float(diff)
        return CheckResult("KV cache == no cache", diff <= tol, diff, tol, "model's own probe")
    if not model.kv_cache:  # declared (attnlab.models.declare)
        return CheckResult("KV cache == no cache", None, None, None, "model has no KV cache")
    full = output_tensor(model(ids))  # (B, T, V)
    B, T = ids.shape
    cache = model.new_cache(B, T)
    first = max(1, T // 2)
    parts = [output_tensor(model(ids[:, :first], cache=cache))]
    for t in range(first, T):
        parts.append(output_tensor(model(ids[:, t : t + 1], cache=cache)))  # one new token per step
    inc = torch.cat(parts, dim=1)  # (B, T, V)
    diff = float((inc - full).abs().max())
    return CheckResult(
        "KV cache == no cache",
        diff <= tol,
        diff,
        tol,
        f"prefix of {first}, then {T - first} single-token steps",
    )


@torch.no_grad()
def check_decoding(model, ids, tol: float = 1e-4) -> CheckResult:
    name = "decoding == full pass"
    if not model.decodes:
        return CheckResult(name, None, None, None, "model does not decode")
    dec = decoder_for(model)
    if not dec.continues_prompt:  # it decodes from a source: its KV cache check steps through it
        return CheckResult(name, None, None, None, "an encoder-decoder: the KV cache check")
    B, T = ids.shape
    first = max(1, T // 2)
    full = torch.log_softmax(output_tensor(model(ids)).float(), dim=-1)[:, first - 1 :]
    state = dec.start(ids[:, :first], T - first + 1)
    steps = [dec.step(state, ids[:, first - 1])]  # the prompt, in one pass
    steps += [dec.step(state, ids[:, t]) for t in range(first, T)]  # then one token per step
    diff = float((torch.stack(steps, dim=1) - full).abs().max())
    detail = f"prompt of {first}, then {T - first} single-token steps ({dec.path(state)})"
    return CheckResult(name, diff <= tol, diff, tol, detail)


@torch.no_grad()
def check_fused_reference(model, ids, tol: float = 1e-4) -> CheckResult:
    mhas = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if not mhas:
        return CheckResult(
            "fused == reference attention", None, None, None, "no MultiHeadAttention modules"
        )
    fn = model.probe_forward
    before = [m.use_fused for m in mhas]
    try:
        for m in mhas:
            m.use_fused = True
        fused = fn(ids)
        for m in mhas:
            m.use_fused = False
        ref = fn(ids)
    finally:
        for m, b in zip(mhas, before):
            m.use_fused = b
    diff = float((fused - ref).abs().max())
    return CheckResult(
        "fused == reference attention", diff <= tol, diff, tol, f"{len(mhas)} attention modules"
    )


@torch.no_grad()
def check_recording(model, ids, tol: float = 1e-4) -> CheckResult:
    fn = model.probe_forward
    plain = fn(ids)
    with hooks.record(model) as cache:
        recorded = fn(ids)
    diff = float((plain - recorded).abs().max())
    return CheckResult(
        "recording == no recording", diff <= tol, diff, tol, f"{len(cache)} activations recorded"
    )


@torch.no_grad()
def check_residual_graph(model, ids, tol: float = 1e-4) -> CheckResult:
    """Every stream of the residual graph, rebuilt from its writers' outputs (each head's
    z W_O, each feed-forward's output, through the norms the blocks declare), is what the
    forward pass recorded at each point, relative to its largest magnitude."""
    name = "residual graph == forward"
    if not model.residual:
        return CheckResult(name, None, None, None, "model has no residual stream")
    graph = model.graph()
    with hooks.record(model) as cache:
        model.probe_forward(ids)
    diff = 0.0
    for stack in graph.stacks:
        embed = next(w for w in graph.writers if w.stack == stack and w.kind == "embed")
        try:
            parts = Parts()
            parts.add(embed.name, graph.output(cache, embed))
            diff = max(diff, walk(model, stack, parts, cache))
        except KeyError as e:  # a point the declared blocks record was never reached
            return CheckResult(name, False, None, tol, f"the forward pass recorded no {e}: it "
                               "does not run the blocks it declares")  # fmt: skip
    detail = (f"{len(graph.writers)} writers, {len(graph.readers)} readers, "
              f"{len(graph.edges())} edges")  # fmt: skip
    return CheckResult(name, diff <= tol, diff, tol, detail)


@torch.no_grad()
def check_padding(model, ids, tol: float = 1e-4, n_pad: int = 3) -> CheckResult:
    if not model.uses_padding:
        return CheckResult("padding invariance", None, None, None, "model does not use padding")
    diff = model.padding_difference(ids)
    if diff is not None:
        diff = float(diff)
        return CheckResult(
            "padding invariance", diff <= tol, diff, tol, "model's own padding probe"
        )
    pad = model.pad_id
    if pad is None:
        return CheckResult(
            "padding invariance", False, None, tol, "uses_padding is set but pad_id is missing"
        )
    limit = max_positions(model)
    B, T = ids.shape
    if limit is not None and T + n_pad > limit:
        ids, T = ids[:, : limit - n_pad], limit - n_pad
    fn = model.probe_forward
    plain = fn(ids)
    padded = torch.cat(
        [ids, torch.full((B, n_pad), int(pad), dtype=ids.dtype, device=ids.device)], dim=1
    )
    out = fn(padded)[:, :T]  # the real positions only
    diff = float((out - plain).abs().max())
    return CheckResult("padding invariance", diff <= tol, diff, tol, f"{n_pad} pad tokens appended")


@torch.no_grad()
def check_determinism(model, ids) -> CheckResult:
    fn = model.probe_forward
    diff = float((fn(ids) - fn(ids)).abs().max())
    return CheckResult(
        "eval determinism", diff == 0.0, diff, 0.0, "two forward passes in eval mode"
    )


HALF_STEPS = 4  # a half-precision model's tolerance: this many rounding steps of its outputs


@torch.no_grad()
def _tolerance(model: nn.Module, ids, tol: float = 1e-4) -> float:
    """``tol`` for a float32 model. A model whose weights are in half precision (a run imported
    from bfloat16 weights) computes in it, so two orders of the same sums differ by its
    rounding: HALF_STEPS of its steps (eps) at the largest output's magnitude."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    if dtype not in (torch.bfloat16, torch.float16):
        return tol
    largest = float(model.probe_forward(ids).float().abs().max())
    return max(tol, HALF_STEPS * torch.finfo(dtype).eps * largest)


def check(model: nn.Module, length: int = 16, batch: int = 2, seed: int = 0) -> CheckReport:
    """Run every conformance check on ``model`` (in eval mode; its mode is restored after)."""
    with evaluating(model):
        ids = model.probe_inputs(batch, seed, length)  # token ids; a ViT's: random images
        tol = _tolerance(model, ids)
        results = [
            check_future_leak(model, ids),
            check_kv_cache(model, ids, tol),
            check_decoding(model, ids, tol),
            check_fused_reference(model, ids, tol),
            check_recording(model, ids, tol),
            check_padding(model, ids, tol),
            check_determinism(model, ids),
            check_residual_graph(model, ids, tol),
        ]
    return CheckReport(results)
