"""The known result, measured: `attnlab train --task induction` with its defaults, over seeds.

    OMP_NUM_THREADS=1 python benchmarks/induction.py --seeds 1,2,3 [--keep runs/induction-bench]

For each seed, trains with the defaults (no tuning flag but --seed) in a subprocess, timing its
wall clock and CPU time (user + system of the child), then reads the run back through the
library, as the verbs do:
    heads      the best previous-token score in layer 0 and induction score in layer 1, and the
               heads named so (``attnlab heads``)
    eval       the in-context loss: next-token loss on the first half and on the repeated half
               of 64 sequences r r (r of 32 random tokens), and with the named induction heads,
               the named previous-token heads, zero-ablated (``attnlab eval --ablate``, through
               ``attnlab.interventions.ablate``)
    timeline   the step where the induction score rose fastest and the step where the
               repeated-half loss fell fastest (``attnlab timeline``)
    composition  K-, Q- and V-composition (Elhage et al.) of the previous-token head with the
               induction heads, beside the other layer-0 head's
and checks the issue's acceptance lines. Prints one markdown table row per seed and the load
average, since a shared machine inflates wall times (CPU time is what to compare).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def train(out: Path, seed: int, extra: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of `attnlab train --task induction --seed S` (a fresh process)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "attnlab", "train", "--task", "induction",
                        "--seed", str(seed), "--out", str(out), "--quiet", *extra],
                       env=env, text=True, capture_output=True)  # fmt: skip
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        sys.exit(f"seed {seed}: train failed: {r.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def measure(run: Path) -> dict:
    from attnlab.inspect.heads import heads_of_run
    from attnlab.inspect.timeline import timeline
    from attnlab.interventions import ablate
    from attnlab.run import load_run
    from attnlab.tasks import open_task

    report = heads_of_run(run)
    rows = report.rows
    ind = [r["name"] for r in rows if r["kind"] == "induction"]
    prev = [r["name"] for r in rows if r["kind"] == "previous-token"]
    best = lambda layer, score: max(r["scores"][score] for r in rows if r["layer"] == layer)  # noqa: E731
    task = open_task(run, with_data=True)
    model, _ = load_run(run)
    clean = task.evaluate_in_context(model)
    lnv = clean["ln_vocab"]

    def ablated(heads: list[str]) -> dict | None:
        if not heads:
            return None
        with ablate(model, heads=",".join(heads), mode="zero"):
            return task.evaluate_in_context(model)

    ablate_ind, ablate_prev = ablated(ind), ablated(prev)
    tl = timeline(run)
    rise, fall = tl.fastest.get("induction"), tl.fastest.get("in-context loss")
    comp = report.composition or []
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    circuit = [c for c in comp if c["writer"] in prev and c["reader"] in ind]
    others = [c for c in comp if c["writer"] not in prev and c["reader"] in ind]
    rep = clean["loss_repeated_half"]
    out = {
        "prev_l0": best(0, "previous-token"), "ind_l1": best(1, "induction"),
        "prev_heads": prev, "ind_heads": ind,
        "first": clean["loss_first_half"], "repeated": rep, "ln_v": lnv,
        "ablate_ind": ablate_ind["loss_repeated_half"] if ablate_ind else None,
        "ablate_prev": ablate_prev["loss_repeated_half"] if ablate_prev else None,
        "rise_step": rise["step"] if rise else None, "fall_step": fall["step"] if fall else None,
        "every": tl.every,
        **{f"{k}_circuit": mean([c[k] for c in circuit]) for k in "QKV"},
        **{f"{k}_other": mean([c[k] for c in others]) for k in "QKV"},
    }  # fmt: skip
    out["accept"] = {
        "heads >= 0.5": out["prev_l0"] >= 0.5 and out["ind_l1"] >= 0.5,
        "repeated < 25% ln V": rep < 0.25 * lnv,
        "ablation halfway back": ablate_ind is not None
        and out["ablate_ind"] - rep >= 0.5 * (lnv - rep),
        "rise within one interval of fall": None not in (rise, fall)
        and abs(out["rise_step"] - out["fall_step"]) <= tl.every,
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--keep", help="keep the runs in this directory")
    ap.add_argument("--json", action="store_true", help="also print every figure as JSON")
    ap.add_argument("extra", nargs="*", help="more `attnlab train` flags (after --)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="induction-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    print("| seed | wall s | CPU s | load | prev L0 | ind L1 | heads (prev; ind) | first half | "
          "repeated half | ablate ind | ablate prev | rise / fall step | K / Q / V (prev->ind) "
          "| K / Q / V (other->ind) | acceptance |")  # fmt: skip
    print("|" + "---|" * 15)
    results = {}
    for seed in seeds:
        out = root / f"seed-{seed}"
        wall, cpu = train(out, seed, args.extra)
        load = os.getloadavg()[0]
        m = measure(out)
        results[seed] = {"wall": wall, "cpu": cpu, "load": load, **m}
        f = lambda x: "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"  # noqa: E731
        ok = all(m["accept"].values())
        print(f"| {seed} | {wall:.0f} | {cpu:.0f} | {load:.1f} | {f(m['prev_l0'])} | "
              f"{f(m['ind_l1'])} | {', '.join(m['prev_heads'])}; {', '.join(m['ind_heads'])} | "
              f"{f(m['first'])} | {f(m['repeated'])} | {f(m['ablate_ind'])} | "
              f"{f(m['ablate_prev'])} | {m['rise_step']} / {m['fall_step']} (every "
              f"{m['every']}) | {f(m['K_circuit'])} / {f(m['Q_circuit'])} / "
              f"{f(m['V_circuit'])} | {f(m['K_other'])} / {f(m['Q_other'])} / "
              f"{f(m['V_other'])} | {'pass' if ok else 'FAIL: ' + str(m['accept'])} |",
              flush=True)  # fmt: skip
    print(f"\nln V = {results[seeds[0]]['ln_v']:.3f}; runs in {root}")
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
