"""The known circuit, found: on induction models (`attnlab train --task induction --seed S`),
which heads compose, how well EAP and EAP-IG rank edges against exact patching, and how much
of the clean - corrupt gap a circuit of 5% of the edges recovers beside random sets.

    for s in 1 2 3; do
      attnlab train --task induction --n-head 8 --d-model 128 --seed $s --max-iters 600 --out ind8h$s
    done
    PYTHONPATH=src python benchmarks/circuits_induction.py ind8h1 ind8h2 ind8h3
    PYTHONPATH=src python benchmarks/circuits_induction.py --positions ind1   # per position
    PYTHONPATH=src python benchmarks/circuits_induction.py --acdc 0.01 mix4l1  # see below

Two layers of 8 heads (the induction task's attention-only model with ``--n-head 8``) have 257
edges, so 5% of them (12) is a circuit of several edges; the preset's 2 heads have 29, where 5%
is one edge. Per run: the previous-token heads (layer-0 heads attending to t - 1 more than 0.5)
and the induction heads (last-layer heads attending to the token after the earlier occurrence
more than 0.5), both read from the attention on the clean pairs; the top K-composition pair
(``interventions.weights``); on ``--pairs`` induction pairs (128) r r vs r' r (12 tokens, the metric
logit(r[0]) - logit(r'[0]) at the last position), every unit (an edge, or with ``--positions``
an edge at one position) scored by exact patching, EAP and EAP-IG (5 steps):

- the Spearman correlation of EAP's and EAP-IG's scores with exact patching's over the 50 units
  exact patching ranks highest, and beside it the same for exact patching on a second set of
  as many pairs (seed 1): how far exact patching's own top-50 ranking reproduces, the ceiling
  any approximation can reach on this statistic (32 pairs left it at 0.85-0.91: too few for the
  top 50 of 257 edges to hold their order);
- the same over the units whose exact score is distinguishable from 0 across the pairs (its
  mean more than 2 standard errors from 0), at most 50: the ranking of the effects that exist;
- the faithfulness of EAP-IG's top 5% of units with its bootstrap 95% CI, and the mean of 20
  random sets of that size (corrupt ablation);
- with ``--acdc TAU`` instead (for the 4-layer models of ``benchmarks/repeat_mix.py``): ACDC's
  circuit found on one set of pairs, its faithfulness on another set with a bootstrap CI,
  random sets and EAP-IG's top edges of its size, the heads' roles in every layer and the top
  K-composition pair;
- under "noising", the same agreement figures and circuit with every method's scores taken
  the other way round (``--direction noising``): exact patching moves one unit alone in the
  clean run, EAP takes the gradient at the clean run, EAP-IG's points start there.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from attnlab import hooks
from attnlab.interventions.circuits import (
    Prepared,
    bootstrap,
    faithfulness,
    find_circuit,
    run_acdc,
)
from attnlab.interventions.edges import Circuits, Edges, score_batch
from attnlab.interventions.pairs import induction_pairs, prepare_pairs
from attnlab.interventions.weights import composition_scores
from attnlab.run import load_run

METHODS = (("exact", 1), ("eap", 1), ("eap-ig", 5))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def head_roles(subject, batch, half: int) -> tuple[list[str], list[str], list, list]:
    """Layer-0 heads attending to t - 1 and last-layer heads attending to the token after the
    earlier occurrence (each > 0.5 on the clean pairs), and every head's two figures."""
    model = subject.model
    names = [f"blocks.{i}.attn.weights" for i in range(len(model.blocks))]
    with torch.no_grad(), hooks.record(model, names) as c:
        subject.forward(*batch.clean)
    T = c[names[0]].size(-1)
    t, t2 = torch.arange(1, T), torch.arange(half, T)
    prev = [c[n][:, :, t, t - 1].mean((0, 2)) for n in names]  # L x (H,)
    ind = [c[n][:, :, t2, t2 - half + 1].mean((0, 2)) for n in names]
    # the usual places (layer 0, the last layer) for the two figures printed; deeper models
    # (--n-layer 4 on text, benchmarks/repeat_mix.py) put them in other layers, so the roles
    # are read from every layer
    return ([f"{i}.{h}" for i, p in enumerate(prev) for h in range(len(p)) if p[h] > 0.5],
            [f"{i}.{h}" for i, a in enumerate(ind) if i for h in range(len(a)) if a[h] > 0.5],
            prev[0].tolist(), ind[-1].tolist())  # fmt: skip


def scores(circ, subject, edges_of, seed: int, pairs: int, half: int,
           direction: str = "denoising") -> dict:  # fmt: skip
    """{method: (pairs, units) scores} on the induction pairs of ``seed``."""
    prompts = induction_pairs(subject, n=pairs, half=half, seed=seed)
    (batch,) = prepare_pairs(subject, prompts, "logit-diff")
    edges = edges_of(batch)
    return {m: score_batch(circ, batch, edges, "logit-diff", m, steps=n,
                           direction=direction).scores.numpy()
            for m, n in METHODS}, edges, batch  # fmt: skip


def agreement(got: dict, again: dict, pairs: int) -> dict:
    """Spearman of EAP's and EAP-IG's mean scores with exact patching's over exact's top 50
    units, the same for exact on the other pair set, sign agreement over the top 50, and the
    same Spearman over the units whose exact score is above noise."""
    mean = {m: v.mean(0) for m, v in got.items()}
    ex = mean["exact"]
    top = np.argsort(-np.abs(ex))[:50]
    se = got["exact"].std(0, ddof=1) / np.sqrt(pairs)
    real = [u for u in np.argsort(-np.abs(ex)) if abs(ex[u]) > 2 * se[u]][:50]
    out = {}
    for label, units in (("top50", top), ("above_noise", real)):
        rho = {m: round(spearman(ex[units], mean[m][units]), 3) for m in ("eap", "eap-ig")}
        rho["exact on other pairs"] = round(spearman(ex[units], again["exact"].mean(0)[units]), 3)
        out[f"spearman_{label}"] = rho
    out["sign_agreement_top50"] = {m: float(np.mean(np.sign(ex[top]) == np.sign(mean[m][top])))
                                   for m in ("eap", "eap-ig")}  # fmt: skip
    out["units_above_noise"] = len(real)
    return out


def measure(path: str, positions: bool, pairs: int = 128, half: int = 12) -> dict:
    run = load_run(path)
    s = run.subject
    circ = Circuits(s)
    edges_of = lambda b: Edges(circ.graph, b.lengths, positions=positions)  # noqa: E731
    got, edges, batch = scores(circ, s, edges_of, 0, pairs, half)
    again, _, _ = scores(circ, s, edges_of, 1, pairs, half)
    noised, _, _ = scores(circ, s, edges_of, 0, pairs, half, "noising")
    noised_again, _, _ = scores(circ, s, edges_of, 1, pairs, half, "noising")
    prev, ind, prev_scores, ind_scores = head_roles(s, batch, half)
    top_k, comp = top_composition(s)
    mean = {m: v.mean(0) for m, v in got.items()}
    ex = mean["exact"]
    top = np.argsort(-np.abs(ex))[:50]
    se = got["exact"].std(0, ddof=1) / np.sqrt(pairs)
    real = [u for u in np.argsort(-np.abs(ex)) if abs(ex[u]) > 2 * se[u]][:50]
    rho = {m: round(spearman(ex[top], mean[m][top]), 3) for m in ("eap", "eap-ig")}
    rho["exact on other pairs"] = round(spearman(ex[top], again["exact"].mean(0)[top]), 3)
    rho_real = {m: round(spearman(ex[real], mean[m][real]), 3) for m in ("eap", "eap-ig")}
    rho_real["exact on other pairs"] = round(spearman(ex[real], again["exact"].mean(0)[real]), 3)
    sign = {m: float(np.mean(np.sign(ex[top]) == np.sign(mean[m][top])))
            for m in ("eap", "eap-ig")}  # fmt: skip
    r = find_circuit(s, induction_pairs(s, n=pairs, half=half, seed=0), method="eap-ig",
                     steps=5, positions=positions, fraction=0.05)  # fmt: skip
    c = r.chosen
    rn = find_circuit(s, induction_pairs(s, n=pairs, half=half, seed=0), method="eap-ig",
                      steps=5, positions=positions, fraction=0.05, direction="noising")  # fmt: skip
    noising = agreement(noised, noised_again, pairs)
    noising["circuit"] = {"faithfulness": round(rn.chosen.faithfulness, 4),
                          "ci95": [round(rn.chosen.lo, 4), round(rn.chosen.hi, 4)],
                          "random_mean": round(rn.chosen.random_mean, 4)}  # fmt: skip
    return {
        "run": path, "previous_token_heads": prev, "induction_heads": ind,
        "previous_token_attention": [round(x, 3) for x in prev_scores],
        "induction_attention": [round(x, 3) for x in ind_scores],
        "top_k_composition": [top_k["from"], top_k["to"], round(top_k["k"], 4)],
        "k_baseline": round(comp["baseline"]["k"], 4),
        "top_k_is_prev_into_induction": top_k["from"] in prev and top_k["to"] in ind,
        "units": edges.count, "positions": positions,
        "spearman_top50": rho, "sign_agreement_top50": sign,
        "units_above_noise": len(real), "spearman_above_noise": rho_real,
        "noising": noising,
        "top_exact": [[edges.label(u), round(float(ex[u]), 3), round(float(mean["eap"][u]), 3),
                       round(float(mean["eap-ig"][u]), 3)] for u in top[:8]],
        "circuit_units": c.k, "circuit_fraction": round(c.fraction, 4),
        "faithfulness": round(c.faithfulness, 4), "ci95": [round(c.lo, 4), round(c.hi, 4)],
        "random_mean": round(c.random_mean, 4),
        "random_range": [round(c.random_lo, 4), round(c.random_hi, 4)],
        "clean": round(r.clean, 4), "corrupt": round(r.corrupt, 4),
        "circuit": [r.labels[u] for u in r.circuit],
    }  # fmt: skip


def prepared(circ: Circuits, subject, seed: int, pairs: int, half: int):
    """The induction pairs of ``seed`` made ready for faithfulness runs (corrupt ablation) and
    scored by EAP-IG (5 steps): (run, clean metrics, corrupt metrics, EAP-IG's order, batch)."""
    prompts = induction_pairs(subject, n=pairs, half=half, seed=seed)
    (batch,) = prepare_pairs(subject, prompts, "logit-diff")
    edges = Edges(circ.graph, batch.lengths)
    sb = score_batch(circ, batch, edges, "logit-diff", "eap-ig", steps=5)
    run = Prepared(circ, edges, [batch], [sb.clean], [sb.corrupt], "logit-diff", pairs)
    order = np.argsort(-np.abs(sb.scores.numpy().mean(0)), kind="stable")
    return run, sb.clean.metric.numpy(), sb.corrupt.metric.numpy(), order, batch


def top_composition(subject) -> tuple[dict, dict]:
    """The pair of heads with the largest K-composition, and every score."""
    comp = composition_scores(subject)
    return max(comp["pairs"], key=lambda p: p["k"]), comp


def acdc_report(path: str, tau: float, pairs: int = 64, half: int = 12) -> dict:
    """ACDC (the exact greedy pruning of ``attnlab circuit --acdc``, visiting edges in EAP-IG's
    order for its overlap figure) on ``pairs`` induction pairs (seed 0), then the circuit it
    keeps measured again on as many other pairs (seed 1): its faithfulness with a bootstrap
    95% CI, and 20 random sets of its size; beside it EAP-IG's top edges of the same size on
    those pairs, the roles of the heads and the top K-composition pair."""
    s = load_run(path).subject
    circ = Circuits(s)
    run, clean, none, order, _ = prepared(circ, s, 0, pairs, half)
    found = run_acdc(run, tau, clean, none, order)
    kept = found["units"]
    held, clean, none, order, batch = prepared(circ, s, 1, pairs, half)
    U, n = held.edges.count, len(kept)
    rng = np.random.default_rng(0)
    keep = torch.zeros(22, U, dtype=torch.bool)
    keep[0, kept] = True
    keep[1, order[:n]] = True
    for j in range(20):
        keep[2 + j, rng.choice(U, n, replace=False)] = True
    values = held.metric_of(keep)
    f = faithfulness(values, clean, none)
    lo, hi = bootstrap(values[:1], clean, none, 1000, rng)
    prev, ind, _, _ = head_roles(s, batch, half)
    top_k, _ = top_composition(s)
    return {
        "run": path, "tau": tau, "pairs": pairs, "edges": U, "acdc_edges": n,
        "acdc_fraction": round(n / U, 4),
        "acdc_faithfulness_found_on": round(found["faithfulness"], 4),
        "acdc_faithfulness_other_pairs": round(float(f[0]), 4),
        "ci95": [round(float(lo[0]), 4), round(float(hi[0]), 4)],
        "random_mean": round(float(f[2:].mean()), 4), "random_max": round(float(f[2:].max()), 4),
        "eap_ig_top_same_size": round(float(f[1]), 4),
        "previous_token_heads": prev, "induction_heads": ind,
        "top_k_composition": [top_k["from"], top_k["to"], round(top_k["k"], 4)],
        "top_k_is_prev_into_induction": top_k["from"] in prev and top_k["to"] in ind,
        "circuit": [held.edges.label(u) for u in kept],
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--positions", action="store_true", help="a unit is an edge at one position")
    p.add_argument("--pairs", type=int, default=128, help="induction pairs in each set")
    p.add_argument("--acdc", type=float, metavar="TAU", help="ACDC's circuit, on other pairs")
    a = p.parse_args()
    for path in a.runs:
        if a.acdc is not None:
            print(json.dumps(acdc_report(path, a.acdc, a.pairs)), flush=True)
            continue
        print(json.dumps({"pairs": a.pairs, **measure(path, a.positions, a.pairs)}), flush=True)


if __name__ == "__main__":
    main()
