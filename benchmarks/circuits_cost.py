"""What edge attribution costs: EAP and EAP-IG on every edge of a GPT-2-shaped model (random
weights) beside one forward + backward pass of the same batch, in one process taking turns.

    PYTHONPATH=src python benchmarks/circuits_cost.py                  # 12 layers, 12 heads
    PYTHONPATH=src python benchmarks/circuits_cost.py --layers 4 --repeats 1   # a quick look

Each figure is the median over ``--repeats`` turns of CPU time (the process's, all threads:
load on a shared machine moves it less than wall time) and wall time. The baseline is the
model's loss on the batch, forward and backward (weight gradients included, as training
does). EAP: one clean forward (recorded), one corrupt forward + backward (gradients at every
reader's input), the writers' terms at every reader, and the scores. EAP-IG with n steps: n
forward + backward passes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from attnlab.interventions.edges import Circuits, Edges, score_batch
from attnlab.interventions.pairs import Batch
from attnlab.interventions.subjects import Subject
from attnlab.models.gpt import GPT, GPTConfig


def timed(fn) -> tuple[float, float]:
    c, w = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c, time.perf_counter() - w


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=a.vocab, block_size=a.tokens, n_layer=a.layers, n_head=a.heads,
                    d_model=a.width)  # fmt: skip
    model = GPT(cfg).eval()
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, a.vocab, (a.batch, a.tokens), generator=g)
    corrupt = torch.randint(0, a.vocab, (a.batch, a.tokens), generator=g)
    B = a.batch
    batch = Batch(list(range(B)), (clean,), (corrupt,), torch.zeros(B, dtype=torch.long),
                  torch.ones(B, dtype=torch.long), torch.full((B,), a.tokens - 1),
                  {"": a.tokens})  # fmt: skip
    circ = Circuits(Subject(model))
    edges = Edges(circ.graph, batch.lengths)

    def fwd_bwd():
        model.zero_grad(set_to_none=True)
        logits = model(clean)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), corrupt.flatten()).backward()

    runs = {
        "forward+backward": fwd_bwd,
        "eap": lambda: score_batch(circ, batch, edges, "logit-diff", "eap"),
        f"eap-ig {a.steps}": lambda: score_batch(
            circ, batch, edges, "logit-diff", "eap-ig", steps=a.steps
        ),  # fmt: skip
    }
    fwd_bwd()  # warm up
    got: dict[str, list] = {k: [] for k in runs}
    for _ in range(a.repeats):
        for name, fn in runs.items():
            got[name].append(timed(fn))
    base_cpu = statistics.median(c for c, _ in got["forward+backward"])
    base_wall = statistics.median(w for _, w in got["forward+backward"])
    out = {"edges": edges.count, "layers": a.layers, "heads": a.heads, "width": a.width,
           "tokens": a.tokens, "batch": a.batch, "threads": torch.get_num_threads(),
           "load": os.getloadavg()}  # fmt: skip
    for name, ts in got.items():
        cpu, wall = statistics.median(c for c, _ in ts), statistics.median(w for _, w in ts)
        out[name] = {"cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
                     "x_cpu": round(cpu / base_cpu, 2), "x_wall": round(wall / base_wall, 2),
                     "cpu_range": [round(min(c for c, _ in ts), 2),
                                   round(max(c for c, _ in ts), 2)]}  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
