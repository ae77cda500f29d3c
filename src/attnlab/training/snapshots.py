"""Snapshots during training: how every head's attention forms, step by step.

``Snapshots(every)`` is a Trainer callback (see ``attnlab.training.loop``): inspection that
runs during training, so it lives beside the loop, with the head scores it records
(``attnlab.training.probes``) below it; the timeline (``attnlab.inspect.timeline``) reads what
it writes, and the train verb (``attnlab.training.run``) hands it to the Trainer. Every
``every`` steps, and at the last step, it runs the model (in eval mode, without gradients) on two fixed
probes and writes ``snapshots/step-NNNNNNNN.safetensors`` into the run directory
(``RunDir.write_snapshot``, through the Trainer's ``run``):

    repeat   ``n_probe`` random token sequences r r, each r of up to 24 tokens
             (``attnlab.inspect.heads.repeated_tokens``; a model that reads no token ids has none)
    sample   a few held-out inputs of the task (``Task.sample_inputs``; None: no sample)

and, for a causal language model given ``context`` (held-out windows as long as its block,
``Task.sample_inputs``), Olsson et al.'s in-context learning score on them
(``attnlab.metrics.icl_score``: the loss of the last token minus that of the token a tenth of
the way in), in the metadata as ``icl_score`` with its positions (``icl_positions``);
and stores, per self-attention map:
    scores.<probe>.<map>    (H, K) float32   every head's scores (``attnlab.inspect.heads``;
                                              NaN where a score is undefined)
    patterns.<probe>.<map>  (H, T, T) float16 the attention of each head on the probe's first
                                              sequence, T <= 48 (see below for how many)
and, in the JSON metadata, the step, the probes' first token ids, and (a language model) the
next-token loss on each half of the repeated probe: the in-context loss ``attnlab timeline``
sets against the induction score.

Size. Scores cost 4 * K bytes per head per snapshot (K = 6 scores): nothing. Patterns cost
2 * T^2 bytes per head per probe: with T = 48, 4.5 KiB; the 16 heads of the ``baby`` preset
take 144 KiB per snapshot for both probes, the 4 heads of ``attn-only-2l`` 36 KiB. Patterns
are kept in at most ``PATTERN_BUDGET`` (4 MiB) per run: when max_iters / every snapshots would
take more, only every k-th snapshot keeps them (k chosen at the start from max_iters), the last
one always; scores are kept at every snapshot. So a run's snapshots stay under ~4 MiB plus
a few KiB per snapshot whatever the model, and grow linearly with heads x T^2 until the budget
thins them.

Snapshots survive ``--resume``: the snapshots after the checkpoint's step are removed
(``RunDir.start``) and taken again. The probes are drawn from their own seeded generator and the model runs in eval mode,
so the global RNG (and so the training) is untouched.
"""

from __future__ import annotations

import math
import time

import torch

from attnlab.training.probes import SCORES, ProbeResult, repeated_tokens, run_probe

PATTERN_BUDGET = 4 * 2**20  # bytes of attention patterns per run, at most
PATTERN_TOKENS = 48  # longest probe sequence whose pattern is stored
ICL_MIN_TOKENS = 8  # the shortest context the in-context learning score is taken over


class Snapshots:
    """The Trainer callback that takes snapshots (see the module docstring)."""

    def __init__(self, every: int, sample: torch.Tensor | None = None, sample_ids: bool = True,
                 n_probe: int = 8, seed: int = 0, context: torch.Tensor | None = None):  # fmt: skip
        if every <= 0:
            raise ValueError(f"snapshot interval must be positive, got {every}")
        self.every = every
        self.sample = None if sample is None else sample[:, :PATTERN_TOKENS]
        self.sample_ids = sample_ids
        self.n_probe, self.seed = n_probe, seed
        self.context = context if sample_ids else None  # (n, T) token ids for the ICL score
        self.repeat: torch.Tensor | None = None
        self.run = None  # the Trainer's RunDir
        self.done: set[int] = set()
        self.keep_every: int | None = None  # patterns at every k-th snapshot
        self.seconds = 0.0  # time spent taking snapshots (for the overhead benchmark)

    # -- the callback --------------------------------------------------------------------------

    def on_open(self, trainer, resumed: bool) -> None:
        if not trainer.writes:
            return
        self.run = trainer.run
        self.done = set(self.run.kept_snapshots)  # what start() kept (a resumed run's)
        self.repeat = repeated_tokens(trainer.raw_model, self.n_probe, self.seed,
                                      PATTERN_TOKENS // 2)  # fmt: skip

    def on_step(self, trainer) -> None:
        step, last = trainer.step, trainer.config.max_iters
        if not trainer.writes or step in self.done or (step % self.every and step < last):
            return
        t0 = time.perf_counter()
        self.take(trainer.raw_model, step, last)
        self.seconds += time.perf_counter() - t0

    # -- one snapshot --------------------------------------------------------------------------

    def probes(self, model) -> dict[str, ProbeResult]:
        device = next(model.parameters()).device
        out = {}
        if self.repeat is not None:
            out["repeat"] = run_probe(model, self.repeat.to(device), ids=True, repeated=True)
        if self.sample is not None:
            out["sample"] = run_probe(model, self.sample.to(device), ids=self.sample_ids)
        return out

    def take(self, model, step: int, max_iters: int) -> dict:
        """Probe ``model`` and write the snapshot of ``step``; returns its metadata."""
        results = self.probes(model)
        if self.keep_every is None:
            self.keep_every = self._keep_every(results, max_iters)
        index = step // self.every
        patterns = index % self.keep_every == 0 or step >= max_iters
        tensors: dict[str, torch.Tensor] = {}
        meta: dict = {"every": self.every, "scores": list(SCORES), "patterns": patterns,
                      "maps": {}, "tokens": {}}  # fmt: skip
        for probe, r in results.items():
            meta["maps"][probe] = list(r.maps)
            for name, weights in r.maps.items():
                s = r.scores[name]
                H = weights.size(1)
                cols = [
                    s[k] if s[k] is not None else torch.full((H,), float("nan")) for k in SCORES
                ]
                tensors[f"scores.{probe}.{name}"] = torch.stack(cols, dim=1).float().cpu()  # (H, K)
                if patterns:
                    tensors[f"patterns.{probe}.{name}"] = weights[0].half().cpu()  # (H, T, T)
            if r.loss_repeated_half is not None:
                meta["loss_first_half"] = r.loss_first_half
                meta["loss_repeated_half"] = r.loss_repeated_half
        meta.update(self.in_context(model))
        if self.repeat is not None:
            meta["tokens"]["repeat"] = self.repeat[0].tolist()
        if self.sample is not None and self.sample_ids:
            meta["tokens"]["sample"] = self.sample[0].tolist()
        self.run.write_snapshot(step, tensors, meta)
        self.done.add(step)
        return meta

    @torch.no_grad()
    def in_context(self, model) -> dict:
        """{"icl_score", "icl_positions"} on ``context`` for a causal model whose output is
        next-token logits (B, T, V); {} otherwise."""
        from attnlab.metrics import icl_score
        from attnlab.modes import evaluating

        x = self.context
        if x is None or x.size(1) < ICL_MIN_TOKENS or not model.causal:
            return {}
        x = x.to(next(model.parameters()).device)
        with evaluating(model):
            out = model(x)
        if not (torch.is_tensor(out) and out.dim() == 3 and out.size(1) == x.size(1)):
            return {}
        score, early, late = icl_score(out, x)
        return {"icl_score": score, "icl_positions": [early, late]}

    def _keep_every(self, results: dict[str, ProbeResult], max_iters: int) -> int:
        per = sum(w[0].numel() * 2 for r in results.values() for w in r.maps.values())
        n = max_iters // self.every + 1
        return max(1, math.ceil(n * per / PATTERN_BUDGET))
