"""The known circuit, found: on induction models (`attnlab train --task induction --seed S`),
which heads compose, how well EAP and EAP-IG rank edges against exact patching, and how much
of the clean - corrupt gap a circuit of 5% of the units recovers beside random sets.

    for s in 1 2 3; do attnlab train --task induction --seed $s --max-iters 500 --out ind$s; done
    PYTHONPATH=src python benchmarks/circuits_induction.py ind1 ind2 ind3

Per run: the previous-token head (the layer-0 head attending most to t - 1) and the induction
head (the layer-1 head attending most to the token after the earlier occurrence), both read
from the attention on the clean pairs; the top K-composition pair (``interventions.weights``);
on 32 induction pairs r r vs r' r (12 tokens, the metric logit(r[0]) - logit(r'[0]) at the
last position), every unit (an edge at one position) scored by exact patching, EAP and EAP-IG
(5 steps), the Spearman correlation of EAP's and EAP-IG's scores with exact patching's over
the 50 units exact patching ranks highest; the faithfulness of EAP-IG's top 5% of units with
its bootstrap 95% CI, and the mean of 20 random sets of that size.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

from attnlab import hooks
from attnlab.interventions.circuits import find_circuit
from attnlab.interventions.edges import Circuits, Edges, score_batch
from attnlab.interventions.pairs import induction_pairs, prepare_pairs
from attnlab.interventions.weights import composition_scores
from attnlab.run import load_run


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def head_roles(subject, batch, half: int) -> tuple[str, str, list, list]:
    model = subject.model
    names = [f"blocks.{i}.attn.weights" for i in range(len(model.blocks))]
    with torch.no_grad(), hooks.record(model, names) as c:
        subject.forward(*batch.clean)
    w0, w1 = c[names[0]], c[names[-1]]  # (B, H, T, T)
    T = w0.size(-1)
    t = torch.arange(1, T)
    prev = w0[:, :, t, t - 1].mean((0, 2))  # (H,)
    t2 = torch.arange(half, T)
    ind = w1[:, :, t2, t2 - half + 1].mean((0, 2))
    last = len(model.blocks) - 1
    return f"0.{int(prev.argmax())}", f"{last}.{int(ind.argmax())}", prev.tolist(), ind.tolist()


def measure(path: str, pairs: int = 32, half: int = 12) -> dict:
    run = load_run(path)
    s = run.subject
    prompts = induction_pairs(s, n=pairs, half=half, seed=0)
    (batch,) = prepare_pairs(s, prompts, "logit-diff")
    prev, ind, prev_scores, ind_scores = head_roles(s, batch, half)
    comp = composition_scores(s)
    top_k = max(comp["pairs"], key=lambda p: p["k"])
    circ = Circuits(s)
    edges = Edges(circ.graph, batch.lengths, positions=True)
    got = {m: score_batch(circ, batch, edges, "logit-diff", m, steps=5).scores.mean(0).numpy()
           for m in ("exact", "eap", "eap-ig")}  # fmt: skip
    top = np.argsort(-np.abs(got["exact"]))[:50]
    rho = {m: spearman(got["exact"][top], got[m][top]) for m in ("eap", "eap-ig")}
    sign = {m: float(np.mean(np.sign(got["exact"][top]) == np.sign(got[m][top])))
            for m in ("eap", "eap-ig")}  # fmt: skip
    r = find_circuit(s, prompts, method="eap-ig", steps=5, positions=True, fraction=0.05)
    c = r.chosen
    top_edges = [r.labels[u] for u in r.order[:8]]
    return {
        "run": path, "previous_token_head": prev, "induction_head": ind,
        "previous_token_attention": [round(x, 3) for x in prev_scores],
        "induction_attention": [round(x, 3) for x in ind_scores],
        "top_k_composition": [top_k["from"], top_k["to"], round(top_k["k"], 4)],
        "k_baseline": round(comp["baseline"]["k"], 4),
        # an induction head: a last-layer head putting >= 0.5 on the token after the match
        "top_k_is_prev_into_an_induction_head": top_k["from"] == prev
        and ind_scores[int(top_k["to"].split(".")[1])] >= 0.5,
        "units": edges.count, "spearman_top50": rho, "sign_agreement_top50": sign,
        "circuit_units": c.k, "circuit_fraction": round(c.fraction, 4),
        "faithfulness": round(c.faithfulness, 4), "ci95": [round(c.lo, 4), round(c.hi, 4)],
        "random_mean": round(c.random_mean, 4), "clean": r.clean, "corrupt": r.corrupt,
        "top_units": top_edges,
    }  # fmt: skip


def main(paths: list[str]) -> None:
    for p in paths:
        print(json.dumps(measure(p)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
