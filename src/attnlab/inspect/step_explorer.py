"""The explorer of a run's snapshots: one head's attention at every snapshot, on a step slider.

    page = explore_steps("runs/induction")      # attnlab explore RUN --steps --html F
    page.save("steps.html")                      # one file, no network

The page shows, for the probe chosen (the repeated random tokens r r, or the held-out sample),
the layer and head chosen, and the step on the slider: the attention matrix (row = query,
column = key, labelled with the probe's tokens), and below it the head's six scores over
training with the slider's step marked. Press play to watch the head form.

Size: each pattern is stored in the page as one byte per weight (round(255 w), base64), so a
snapshot costs H x T^2 bytes per map and probe (T <= 48): 4 heads x 41 snapshots x 2 probes of
48 x 48 take ~1 MiB. Snapshots whose patterns the run did not keep (the 4 MiB budget of
``attnlab.training.snapshots``) still show their scores.
"""

from __future__ import annotations

import base64
from importlib import resources
from pathlib import Path

import numpy as np

from attnlab import rundir
from attnlab.inspect.explorer import Explorer
from attnlab.inspect.heads import SCORES
from attnlab.inspect.recording import InspectError
from attnlab.inspect.timeline import timeline
from attnlab.render.display import script_json
from attnlab.rundir import RunDir


def _tokens(run_dir: Path, ids: list[int] | None) -> list[str] | None:
    if ids is None:
        return None
    tok = rundir.read_tokenizer_files(run_dir)
    tok = getattr(tok, "target", tok)  # an encoder-decoder's probes are decoder tokens
    if tok is None:
        return [str(i) for i in ids]
    return [tok.decode([i]) for i in ids]


def step_data(run_dir: str | Path) -> dict:
    """Everything the page draws: per probe, the snapshot steps, each map's heads' scores over
    the steps, and the patterns of the snapshots that kept them."""
    run_dir = Path(run_dir)
    snapshots = RunDir(run_dir, writer=False)
    steps = snapshots.snapshot_steps()
    if not steps:
        raise InspectError(f"{run_dir} has no snapshots: train it with --snapshot-every N "
                           "(--task induction takes them by default)")  # fmt: skip
    probes = {}
    for probe in ("repeat", "sample"):
        try:
            tl = timeline(run_dir, probe)
        except InspectError:
            continue
        if tl.probe != probe:  # no repeated probe: timeline fell back to the sample
            continue
        frames, tokens = [], None
        for s in steps:
            meta, tensors = snapshots.read_snapshot(s, keys=(f"patterns.{probe}.",))
            tokens = tokens or (meta.get("tokens") or {}).get(probe)
            if not tensors:
                continue
            maps = {}
            for key, w in tensors.items():
                q = np.rint(np.clip(w.float().numpy(), 0, 1) * 255).astype(np.uint8)  # (H, T, S)
                maps[key[len(f"patterns.{probe}.") :]] = [
                    base64.b64encode(h.tobytes()).decode("ascii") for h in q
                ]
            frames.append({"step": s, "maps": maps})
        if not frames:
            continue
        first = next(iter(frames[-1]["maps"].values()))
        T = int(round(len(base64.b64decode(first[0])) ** 0.5))
        heads = [{"name": h["name"], "map": h["map"], "head": h["head"],
                  "scores": h["scores"]} for h in tl.heads]  # fmt: skip
        probes[probe] = {
            "steps": tl.steps, "frames": frames, "T": T, "heads": heads,
            "tokens": _tokens(run_dir, tokens) if tokens else [str(i) for i in range(T)],
            "loss_repeated_half": tl.in_context.get("loss_repeated_half"),
        }  # fmt: skip
    if not probes:
        raise InspectError(f"{run_dir}: its snapshots keep no attention patterns")
    return {"title": f"attnlab: {run_dir.name} over training", "scores": list(SCORES),
            "probes": probes}  # fmt: skip


def explore_steps(run_dir: str | Path) -> Explorer:
    """The step-slider page of a run's snapshots (see the module docstring)."""
    data = step_data(run_dir)

    def document() -> str:
        page = resources.files("attnlab.inspect").joinpath("step_explorer.html").read_text("utf-8")
        return page.replace("__ATTNLAB_DATA__", script_json(data))

    return Explorer(data, document)
