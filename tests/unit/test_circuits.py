"""Circuits on the residual graph: edge attribution (EAP, EAP-IG, exact patching), running the
model with any set of edges patched, and faithfulness (``attnlab.interventions.edges``,
``circuits``), checked by their identities on every registered kind with a residual graph, and
against a deliberately naive per-edge implementation written here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import hooks
from attnlab.interventions.circuits import bootstrap, faithfulness
from attnlab.interventions.edges import Circuits, Edges, graph_of, score_batch
from attnlab.interventions.pairs import Batch, metric_values, prepare_pairs
from attnlab.interventions.subjects import InterventionError, Subject
from attnlab.models.gpt import GPT, GPTConfig
from conformance_helpers import EXAMPLES, tokenizer_for
from intervene_helpers import perturb

RESIDUAL = [p for p in EXAMPLES if p.values[0].residual]
B = 3


def example(cls, cfg: dict):
    tok = tokenizer_for(cls, cfg)
    cfg = dict(cfg)
    for name, attr, _ in cls.tokenizer_fields:
        cfg.setdefault(name, getattr(tok, attr))
    torch.manual_seed(0)
    model = perturb(cls(cls.config_class(**cfg)).eval(), 0.3)
    with torch.no_grad():  # larger weights: the random clean and corrupt inputs differ more
        for p in model.parameters():
            p.mul_(2.0)
    return model


def args_of(model, seed: int, tgt=None) -> tuple:
    """Random forward-pass arguments of ``model`` (B rows): ids, images, or an encoder-decoder's
    source and decoder input (``tgt``: the decoder input to share)."""
    if len(model.stacks) > 1:
        ids = model.probe_inputs(B, seed, 7)
        return (ids, model.probe_inputs(B, 99, 5) if tgt is None else tgt)
    if model.reads == "image":
        return (model.probe_inputs(B, seed) * (1 + 4 * seed),)  # far apart
    return (model.probe_inputs(B, seed, 7),)


def random_batch(model, metric: str = "logit-diff") -> Batch:
    """A batch of B pairs whose clean and corrupt inputs are random, the metric at the last
    output position, random target and foil."""
    clean = args_of(model, 0)
    corrupt = args_of(model, 1, clean[1] if len(clean) > 1 else None)
    with torch.no_grad(), hooks.record(model) as c:
        logits = model.forward_logits(*clean)
    lengths = {s: c[(f"{s}.blocks." if s else "blocks.") + "0.resid_pre"].shape[1]
               for s in model.stacks}  # fmt: skip
    g = torch.Generator().manual_seed(3)
    V = logits.size(-1)
    target = torch.randint(0, V, (B,), generator=g)
    foil = (target + 1) % V
    pos = torch.full((B,), logits.size(1) - 1)
    return Batch(list(range(B)), clean, corrupt, target, foil if metric == "logit-diff" else None,
                 pos, lengths)  # fmt: skip


def metric_of(model, batch, args, metric="logit-diff"):
    with torch.no_grad():
        return metric_values(model.forward_logits(*args), batch, metric)


# ---------------------------------------------------------------------------------------------
# Identities on every kind
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls,cfg", RESIDUAL)
def test_patching_every_edge_is_the_corrupt_run_and_none_the_clean_one(cls, cfg):
    model = example(cls, cfg)
    circ = Circuits(Subject(model))
    batch = random_batch(model)
    edges = Edges(circ.graph, batch.lengths)
    clean = circ.record(batch.clean, batch, "logit-diff")
    corrupt = circ.record(batch.corrupt, batch, "logit-diff")
    assert float((clean.metric - corrupt.metric).abs().max()) > 1e-3  # a gap to recover
    every = torch.ones(1, edges.count, dtype=torch.bool)
    none = torch.zeros(1, edges.count, dtype=torch.bool)
    got = circ.mixed(batch, batch.clean, corrupt, torch.cat([every, none]), edges, "logit-diff")
    torch.testing.assert_close(got[0], metric_of(model, batch, batch.corrupt), atol=1e-5,
                               rtol=1e-5)  # fmt: skip
    torch.testing.assert_close(got[1], metric_of(model, batch, batch.clean), atol=1e-5, rtol=1e-5)
    # half the edges patched lands somewhere else: the patch does act edge by edge
    half = torch.zeros(1, edges.count, dtype=torch.bool)
    half[0, ::2] = True
    mid = circ.mixed(batch, batch.clean, corrupt, half, edges, "logit-diff")[0]
    assert float((mid - got[0]).abs().max()) > 1e-6
    assert float((mid - got[1]).abs().max()) > 1e-6


@pytest.mark.parametrize("direction", ["denoising", "noising"])
@pytest.mark.parametrize("cls,cfg", RESIDUAL)
def test_eap_ig_with_one_step_is_eap_and_node_scores_sum_their_edges(cls, cfg, direction):
    model = example(cls, cfg)
    circ = Circuits(Subject(model))
    batch = random_batch(model)
    edges = Edges(circ.graph, batch.lengths)
    eap = score_batch(circ, batch, edges, "logit-diff", "eap", nodes=True, direction=direction)
    ig1 = score_batch(circ, batch, edges, "logit-diff", "eap-ig", steps=1, direction=direction)
    torch.testing.assert_close(ig1.scores, eap.scores, atol=0, rtol=0)
    assert float(eap.scores.abs().max()) > 0
    sums: dict[str, torch.Tensor] = {}
    for u in range(edges.count):
        w, _, _ = edges.unit(u)
        sums[w.name] = sums.get(w.name, 0) + eap.scores[:, u]
    checked = 0
    for w in circ.graph.writers:
        if not circ.graph.additive(w.stack):
            continue  # post-norm: a writer's terms at readers pass frozen norms, not its grad
        want = eap.nodes[w.name]
        got = sums.get(w.name, torch.zeros_like(want))
        torch.testing.assert_close(got, want, atol=1e-4 * (1 + float(want.abs().max())), rtol=1e-4)
        checked += 1
    assert checked or not all(circ.graph.additive(s) for s in circ.graph.stacks)


@pytest.mark.parametrize("cls,cfg", [p for p in EXAMPLES if not p.values[0].residual])
def test_a_kind_without_a_residual_graph_is_refused_in_one_line(cls, cfg):
    model = example(cls, cfg)
    with pytest.raises(InterventionError) as e:
        graph_of(Subject(model))
    assert "\n" not in str(e.value) and "attnlab patch" in str(e.value)


# ---------------------------------------------------------------------------------------------
# Against a naive implementation: one edge at a time, by hand, on a small GPT
# ---------------------------------------------------------------------------------------------


def small_gpt(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=11, block_size=16, n_layer=2, n_head=2, d_model=16, **kw)
    return perturb(GPT(GPTConfig(**cfg)).eval(), 0.3).double()


def naive_reader_inputs(model, ids, edit=None, x=None):
    """Run the GPT block by block by hand: each head's q/k/v input and each MLP's input is
    the sum of its upstream writers' outputs (pre-norm, so plainly added); ``edit(reader,
    writer, term)`` may replace one writer's term at one reader; ``x`` (B, T, C) replaces the
    embeddings. Returns the logits and {writer name: output (B, T, C)}."""
    B_, T = ids.shape
    if x is None:
        x = model.tok_embed(ids) + model.pos_embed(T, 0)  # (B, T, C)
    outs = {"embed": x}
    order = ["embed"]
    edit = edit or (lambda r, w, t: t)

    def read(reader: str) -> torch.Tensor:
        return sum(edit(reader, w, outs[w]) for w in order)

    for i, blk in enumerate(model.blocks):
        attn = blk.attn
        H, d = attn.n_heads, attn.d_k
        new = {}
        for h in range(H):
            q_in = blk.ln1(read(f"blocks.{i}.attn.head{h}.q"))
            k_in = blk.ln1(read(f"blocks.{i}.attn.head{h}.k"))
            v_in = blk.ln1(read(f"blocks.{i}.attn.head{h}.v"))
            sl = slice(h * d, (h + 1) * d)
            q, k, v = (q_in @ attn.q_proj.weight[sl].T + attn.q_proj.bias[sl],
                       k_in @ attn.k_proj.weight[sl].T + attn.k_proj.bias[sl],
                       v_in @ attn.v_proj.weight[sl].T + attn.v_proj.bias[sl])  # fmt: skip
            s = q @ k.transpose(-1, -2) / d**0.5
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            z = s.softmax(-1) @ v
            new[f"blocks.{i}.attn.head{h}"] = z @ attn.out_proj.weight.view(-1, H, d)[:, h].T
        # the projection's bias is a constant added with the heads' outputs
        new[f"blocks.{i}.attn.head0"] = new[f"blocks.{i}.attn.head0"] + attn.out_proj.bias
        outs.update(new)
        order += list(new)
        m = blk.mlp(blk.ln2(read(f"blocks.{i}.mlp_in")))
        outs[f"blocks.{i}.mlp_out"] = m
        order.append(f"blocks.{i}.mlp_out")
    logits = model.lm_head(model.ln_f(read("readout")))
    return logits, outs


def test_the_naive_gpt_is_the_model():
    model = small_gpt()
    ids = torch.randint(0, 11, (2, 6))
    with torch.no_grad():
        got, _ = naive_reader_inputs(model, ids)
        torch.testing.assert_close(got, model(ids), atol=1e-10, rtol=1e-10)


@pytest.mark.slow  # 11-12 s under load 5 (still run in CI)
def test_a_pre_norm_models_terms_are_held_once_however_many_readers_read_them():
    """A writer's term reaches every later reader unchanged in a pre-norm model: one tensor
    for all of them, so L layers' terms take memory in L (they took L^2 stacked per reader
    group: about 20 GB at 12 GPT-2 layers, batch 8, 64 tokens)."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=11, block_size=16, n_layer=4, n_head=2, d_model=16)
    model = perturb(GPT(cfg).eval(), 0.3).double()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 11, (2, 6), generator=g)
    batch = Batch([0, 1], (ids,), (ids,), torch.tensor([1, 2]), torch.tensor([3, 4]),
                  torch.tensor([5, 5]), {"": 6})  # fmt: skip
    circ = Circuits(Subject(model))
    terms = circ.record(batch.clean, batch, "logit-diff")
    embed = [v[0] for v in terms.parts.values()]  # the embeddings come first at every group
    assert len(embed) > 4 and all(t is embed[0] for t in embed)
    writers = {id(t) for v in terms.parts.values() for t in v}
    assert len(writers) == len(circ.graph.writers)  # the readout reads them all: each once
    stacked = sum(t.numel() * t.element_size() for v in terms.parts.values() for t in v)
    assert terms.row_bytes() * 2 < stacked / 2
    mean = terms.mean()
    assert all(v[0] is mean.parts[next(iter(mean.parts))][0] for v in mean.parts.values())


def test_exact_patching_and_eap_agree_with_a_naive_per_edge_implementation():
    """Exact: M(corrupt with one edge's term swapped for its clean term) - M(corrupt), one
    naive run per edge; EAP: the term difference times the gradient of M at the reader's input
    (autograd through the naive model). Both match the library's on every edge."""
    model = small_gpt()
    g = torch.Generator().manual_seed(1)
    clean, corrupt = torch.randint(0, 11, (2, 6), generator=g), torch.randint(0, 11, (2, 6),
                                                                               generator=g)  # fmt: skip
    target, foil = torch.tensor([1, 2]), torch.tensor([3, 4])
    batch = Batch([0, 1], (clean,), (corrupt,), target, foil, torch.tensor([5, 5]), {"": 6})
    circ = Circuits(Subject(model))
    edges = Edges(circ.graph, batch.lengths)
    exact = score_batch(circ, batch, edges, "logit-diff", "exact").scores
    eap = score_batch(circ, batch, edges, "logit-diff", "eap").scores

    def name(node) -> str:  # the naive model's names: heads carry the projection bias on head0
        if node.kind == "embed":
            return "embed"
        if node.role == "reader":
            return "readout" if node.kind == "readout" else node.name
        return node.name

    def M(logits):
        return metric_values(logits, batch, "logit-diff")

    with torch.no_grad():
        _, c_out = naive_reader_inputs(model, clean)
        base, r_out = naive_reader_inputs(model, corrupt)
    base = M(base)
    for u in range(edges.count):
        w, r, _ = edges.unit(u)
        wn, rn = name(w), name(r)

        def swap(reader, writer, term, wn=wn, rn=rn):
            return c_out[writer] if (reader, writer) == (rn, wn) else term

        with torch.no_grad():
            got = M(naive_reader_inputs(model, corrupt, swap)[0]) - base
        torch.testing.assert_close(exact[:, u], got, atol=1e-8, rtol=1e-6)
    # EAP by hand: the gradient of M with respect to each (reader, writer) term, at corrupt
    leaves = {}

    def grad_edit(reader, writer, term):  # a zero added to each term: dM/d(term at reader)
        t = torch.zeros_like(term, requires_grad=True)
        leaves[(reader, writer)] = t
        return term + t

    m = M(naive_reader_inputs(model, corrupt, grad_edit)[0]).sum()
    keys = list(leaves)
    grads = dict(zip(keys, torch.autograd.grad(m, [leaves[k] for k in keys], allow_unused=True)))
    for u in range(edges.count):
        w, r, _ = edges.unit(u)
        key = (name(r), name(w))
        gr = grads[key] if grads[key] is not None else torch.zeros_like(c_out[key[1]])
        want = ((c_out[key[1]] - r_out[key[1]]) * gr).sum((1, 2))
        torch.testing.assert_close(eap[:, u], want, atol=1e-8, rtol=1e-6)


def naive_setup(seed: int):
    """The small GPT, two random clean/corrupt pairs of 6 tokens, their Batch, the Circuits and
    Edges, and each unit's (reader, writer) as the naive model names them."""
    model = small_gpt()
    g = torch.Generator().manual_seed(seed)
    clean, corrupt = (torch.randint(0, 11, (2, 6), generator=g) for _ in range(2))
    target, foil = torch.tensor([1, 2]), torch.tensor([3, 4])
    batch = Batch([0, 1], (clean,), (corrupt,), target, foil, torch.tensor([5, 5]), {"": 6})
    circ = Circuits(Subject(model))
    edges = Edges(circ.graph, batch.lengths)
    name = lambda node: "embed" if node.kind == "embed" else node.name  # noqa: E731
    pairs = [(name(r), name(w)) for w, r in (edges.unit(u)[:2] for u in range(edges.count))]
    pairs = [("readout" if r.endswith("readout") else r, w) for r, w in pairs]
    return model, clean, corrupt, batch, circ, edges, pairs


def naive_ig_gradients(model, M, ids, start, end, n: int) -> dict:
    """{(reader, writer): the naive model's gradient of M at that term, averaged over the runs
    of ``ids`` whose embeddings are (1 - a) start + a end, a = k/n for k = 0..n-1}."""
    total: dict = {}
    for k in range(n):
        leaves = {}

        def grad_edit(reader, writer, term, leaves=leaves):
            t = torch.zeros_like(term, requires_grad=True)
            leaves[(reader, writer)] = t
            return term + t

        m = M(naive_reader_inputs(model, ids, grad_edit, x=torch.lerp(start, end, k / n))[0])
        keys = list(leaves)
        got = torch.autograd.grad(m.sum(), [leaves[q] for q in keys], allow_unused=True)
        for q, gr in zip(keys, got):
            total[q] = total.get(q, 0) + (torch.zeros_like(leaves[q]) if gr is None else gr) / n
    return total


@pytest.mark.slow  # 5 s under load 10, about 1.5 s of CPU (still run in CI)
def test_eap_ig_and_faithfulness_agree_with_a_naive_per_edge_implementation():
    """EAP-IG by hand: the naive model's gradient at every (reader, writer) term, on the runs
    whose embeddings are (1 - a) e_corrupt + a e_clean, a = k/n for k = 0..n-1, averaged,
    times the term difference. Faithfulness by hand: the naive clean run with every edge
    outside a circuit given its corrupt term, against the library's patched run."""
    from attnlab.interventions.circuits import Prepared

    model, clean, corrupt, batch, circ, edges, pairs = naive_setup(2)
    n = 3
    ig = score_batch(circ, batch, edges, "logit-diff", "eap-ig", steps=n).scores
    M = lambda logits: metric_values(logits, batch, "logit-diff")  # noqa: E731
    with torch.no_grad():
        _, c_out = naive_reader_inputs(model, clean)
        _, r_out = naive_reader_inputs(model, corrupt)
    total = naive_ig_gradients(model, M, corrupt, r_out["embed"], c_out["embed"], n)
    for u, (rn, wn) in enumerate(pairs):
        want = ((c_out[wn] - r_out[wn]) * total[(rn, wn)]).sum((1, 2))
        torch.testing.assert_close(ig[:, u], want, atol=1e-8, rtol=1e-6)
    # faithfulness: a circuit of every third edge, the rest corrupt
    keep = torch.zeros(1, edges.count, dtype=torch.bool)
    keep[0, ::3] = True
    kept = {pairs[u] for u in range(edges.count) if keep[0, u]}
    rec_clean = circ.record(batch.clean, batch, "logit-diff")
    rec_corrupt = circ.record(batch.corrupt, batch, "logit-diff")
    run = Prepared(circ, edges, [batch], [rec_clean], [rec_corrupt], "logit-diff", 2)
    got = run.metric_of(keep)[0]

    def outside_corrupt(reader, writer, term):
        return term if (reader, writer) in kept else r_out[writer]

    with torch.no_grad():
        want = M(naive_reader_inputs(model, clean, outside_corrupt)[0])
    np.testing.assert_allclose(got, want.numpy(), atol=1e-8, rtol=1e-6)
    f = faithfulness(got[None], rec_clean.metric.numpy(), rec_corrupt.metric.numpy())[0]
    want_f = (want.mean() - rec_corrupt.metric.mean()) / (
        rec_clean.metric.mean() - rec_corrupt.metric.mean()
    )
    assert f == pytest.approx(float(want_f), rel=1e-9)


def test_noising_scores_agree_with_a_naive_per_edge_implementation():
    """--direction noising, by hand: exact = M(clean) - M(clean with one edge's term swapped for
    its corrupt term), one naive run per edge; EAP-IG (EAP at n = 1) = the term difference times
    the naive model's gradient averaged over the runs whose embeddings are (1 - a) e_clean +
    a e_corrupt, a = k/n for k = 0..n-1 (the gradient at the clean run first)."""
    model, clean, corrupt, batch, circ, edges, pairs = naive_setup(3)
    M = lambda logits: metric_values(logits, batch, "logit-diff")  # noqa: E731
    with torch.no_grad():
        clean_logits, c_out = naive_reader_inputs(model, clean)
        _, r_out = naive_reader_inputs(model, corrupt)
    exact = score_batch(circ, batch, edges, "logit-diff", "exact", direction="noising").scores
    for u, (rn, wn) in enumerate(pairs):

        def swap(reader, writer, term, wn=wn, rn=rn):
            return r_out[writer] if (reader, writer) == (rn, wn) else term

        with torch.no_grad():
            want = M(clean_logits) - M(naive_reader_inputs(model, clean, swap)[0])
        torch.testing.assert_close(exact[:, u], want, atol=1e-8, rtol=1e-6)
    assert float(exact.abs().max()) > 1e-3
    for n in (1, 3):
        got = score_batch(circ, batch, edges, "logit-diff", "eap-ig", steps=n,
                          direction="noising").scores  # fmt: skip
        total = naive_ig_gradients(model, M, clean, c_out["embed"], r_out["embed"], n)
        for u, (rn, wn) in enumerate(pairs):
            want = ((c_out[wn] - r_out[wn]) * total[(rn, wn)]).sum((1, 2))
            torch.testing.assert_close(got[:, u], want, atol=1e-8, rtol=1e-6)
    denoising = score_batch(circ, batch, edges, "logit-diff", "exact").scores
    assert not torch.allclose(denoising, exact)  # the two directions are different questions


# ---------------------------------------------------------------------------------------------
# Faithfulness and its interval
# ---------------------------------------------------------------------------------------------


def test_faithfulness_is_the_fraction_of_the_gap_and_the_interval_holds_it():
    clean, none = np.array([2.0, 4.0, 3.0, 5.0]), np.array([0.0, 1.0, 0.0, 1.0])
    values = np.stack([clean, none, (clean + none) / 2])
    f = faithfulness(values, clean, none)
    np.testing.assert_allclose(f, [1.0, 0.0, 0.5])
    lo, hi = bootstrap(values, clean, none, 200, np.random.default_rng(0))
    np.testing.assert_allclose(lo, [1.0, 0.0, 0.5])  # each resample keeps these exactly
    noisy = np.stack([clean * np.array([1.2, 0.6, 1.1, 0.9])])
    lo, hi = bootstrap(noisy, clean, none, 500, np.random.default_rng(0))
    assert lo[0] < float(faithfulness(noisy, clean, none)[0]) < hi[0]


# ---------------------------------------------------------------------------------------------
# A circuit found on text pairs, and the pairs refused
# ---------------------------------------------------------------------------------------------


def char_gpt():
    from attnlab.tokenizers import CharTokenizer

    tok = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz")
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=2, n_head=2, d_model=16)
    model = perturb(GPT(cfg).eval(), 0.3)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    return Subject(model, tok)


def test_a_circuit_says_how_it_was_found_and_its_ends_are_the_runs():
    from attnlab.interventions.circuits import find_circuit
    from attnlab.interventions.pairs import induction_pairs

    s = char_gpt()
    prompts = induction_pairs(s, n=6, half=4, seed=0)
    r = find_circuit(s, prompts, method="eap-ig", steps=3, random_sets=20, resamples=100)
    d = r.to_dict()
    assert d["method"] == "eap-ig" and d["steps"] == 3 and d["ablation"] == "corrupt"
    assert d["metric"] == "logit-diff" and "induction" in d["prompts"] and d["pairs"] == 6
    full = r.curve[-1]  # every unit kept: the clean run, whatever the resample
    assert full.k == r.units and full.faithfulness == pytest.approx(1.0, abs=1e-6)
    assert full.lo == pytest.approx(1.0, abs=1e-6) and full.hi == pytest.approx(1.0, abs=1e-6)
    assert all(p.lo <= p.faithfulness + 1e-9 and p.faithfulness <= p.hi + 1e-9 for p in r.curve)
    assert r.units == len(r.labels) == d["edges"]
    # the node scores sum their edges (a pre-norm GPT's stream is a plain sum)
    for n in d["nodes"]:
        assert n["node_score"] == pytest.approx(n["sum_of_edges"], rel=1e-4, abs=1e-6)
    import json

    json.dumps(d)  # plain data


def test_a_noising_circuit_says_so_and_scores_from_the_clean_run():
    from attnlab.interventions.circuits import find_circuit
    from attnlab.interventions.pairs import induction_pairs

    s = char_gpt()
    prompts = induction_pairs(s, n=6, half=4, seed=0)
    kw = dict(method="exact", random_sets=20, resamples=50)
    noised = find_circuit(s, prompts, direction="noising", **kw)
    d = noised.to_dict()
    assert d["direction"] == "noising" and d["definitions"]["score"].startswith("noising")
    assert "in the clean run" in noised.method_words()
    # exact noising: M(clean) - M(clean with the unit patched to corrupt); every unit
    # patched at once is the corrupt run, so its scores are the gap's share unit by unit
    circ, batch = Circuits(s), prepare_pairs(s, prompts, "logit-diff")[0]
    edges = Edges(circ.graph, batch.lengths)
    clean = circ.record(batch.clean, batch, "logit-diff")
    corrupt = circ.record(batch.corrupt, batch, "logit-diff")
    u = int(np.argmax(np.abs(noised.scores)))
    one = torch.zeros(1, edges.count, dtype=torch.bool)
    one[0, u] = True
    m = circ.mixed(batch, batch.clean, corrupt, one, edges, "logit-diff")[0]
    assert noised.scores[u] == pytest.approx(float((clean.metric - m).mean()), rel=1e-6)
    denoised = find_circuit(s, prompts, **kw)
    assert denoised.to_dict()["direction"] == "denoising"
    assert not np.allclose(denoised.scores, noised.scores)
    with pytest.raises(InterventionError, match="--direction must be"):
        find_circuit(s, prompts, direction="sideways", **kw)


def test_pairs_that_cannot_line_up_are_refused_in_one_line(tmp_path):
    from attnlab.interventions.circuits import find_circuit
    from attnlab.interventions.pairs import one_pair, read_pairs

    s = char_gpt()
    cases = [
        (one_pair("abcab", "abca", "c", "d"), "must have the same length"),
        (one_pair("abcab", "dbcab", "cd", "d"), "one token"),
        (one_pair("abcab", "dbcab", "c"), "needs a foil"),
    ]
    for prompts, words in cases:
        with pytest.raises(InterventionError, match=words) as e:
            find_circuit(s, prompts, metric=None if words != "needs a foil" else "logit-diff")
        assert "\n" not in str(e.value)
    with pytest.raises(InterventionError, match="--k 10000"):
        find_circuit(s, one_pair("abcab", "dbcab", "c", "d"), k=10_000)
    empty = tmp_path / "pairs.tsv"
    empty.write_text("# nothing\n\n")
    with pytest.raises(InterventionError, match="has no pairs"):
        read_pairs(empty)


# ---------------------------------------------------------------------------------------------
# The verb
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    from attnlab.rundir import save_model

    s = char_gpt()
    path = tmp_path_factory.mktemp("circuit") / "run"
    save_model(path, s.model.float(), s.tokenizer)
    return path


def test_the_verb_refuses_bad_input_in_one_line_exit_2(char_run, tmp_path, capsys):
    from attnlab.cli import main

    empty = tmp_path / "empty.tsv"
    empty.write_text("\n")
    cases = [
        (["--clean", "abcab", "--corrupt", "abca", "--target", "c", "--foil", "d"], "same length"),
        (["--clean", "abcab", "--corrupt", "dbcab", "--target", "cc", "--foil", "d"], "one token"),
        (["--clean", "abcab", "--corrupt", "dbcab", "--target", "c", "--foil", "d", "--k",
          "100000"], "--k 100000"),
        (["--pairs", str(empty)], "has no pairs"),
        (["--induction", "4", "--random-sets", "3"], "--random-sets"),
        (["--induction", "4", "--clean", "ab", "--corrupt", "cd"], "one way"),
    ]  # fmt: skip
    for extra, words in cases:
        try:  # argparse's refusals exit; the verb's return 2
            code = main(["circuit", str(char_run), *extra])
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err.strip()
        assert code == 2, (extra, err)
        assert words in err and "\n" not in err and "Traceback" not in err, err


def test_the_verb_prints_json_and_draws_the_graph_curve_and_page(char_run, tmp_path, capsys):
    import json

    from attnlab.cli import main

    png, curve, page = tmp_path / "g.png", tmp_path / "c.png", tmp_path / "p.html"
    code = main(["circuit", str(char_run), "--induction", "4", "--half", "4", "--method", "eap",
                 "--resamples", "50", "--json", "--png", str(png), "--curve-png", str(curve),
                 "--html", str(page)])  # fmt: skip
    assert code == 0
    d = json.loads(capsys.readouterr().out)
    assert d["method"] == "eap" and d["about"] and d["definitions"]["faithfulness"]
    assert d["random_sets"] == 20 and len(d["curve"]) >= 2
    assert png.stat().st_size > 1000 and curve.stat().st_size > 1000
    html = page.read_text()
    assert 'type="range"' in html and "http" not in html.replace("http://www.w3.org", "")


def test_the_table_fits_80_columns_with_no_trailing_spaces(char_run, capsys, monkeypatch):
    from attnlab.cli import main

    monkeypatch.setenv("COLUMNS", "80")
    code = main(["circuit", str(char_run), "--induction", "4", "--half", "4", "--method", "eap",
                 "--resamples", "50", "--ablation", "mean"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "faithfulness of the top k" in out and "mean over the corrupt" in out
    for line in out.splitlines():
        assert len(line) <= 80 and line == line.rstrip(), repr(line)


# ---------------------------------------------------------------------------------------------
# Circuits in the weights
# ---------------------------------------------------------------------------------------------


def test_composition_scores_are_elhages_definition_by_hand_and_scale_free():
    from attnlab.interventions.weights import composition_scores

    model = small_gpt(n_kv_heads=1).float()  # multi-query: one K/V head serves both
    d = composition_scores(Subject(model))
    a0, b1 = model.blocks[0], model.blocks[1]
    dk = 8
    g0, g1 = a0.ln1.weight.detach().double(), b1.ln1.weight.detach().double()
    Wv = a0.attn.v_proj.weight.detach().double()[:dk] * g0
    ov_a = a0.attn.out_proj.weight.detach().double()[:, dk:] @ Wv  # head 0.1's OV
    Wq = b1.attn.q_proj.weight.detach().double()[:dk] * g1
    Wk = b1.attn.k_proj.weight.detach().double()[:dk] * g1
    qk_b = Wq.T @ Wk  # head 1.0's QK
    want = float((qk_b @ ov_a).norm() / (qk_b.norm() * ov_a.norm()))
    got = next(p for p in d["pairs"] if (p["from"], p["to"]) == ("0.1", "1.0"))
    assert got["k"] == pytest.approx(want, rel=1e-6)
    assert len(d["pairs"]) == 4 and all(0 < p[k] <= 1 for p in d["pairs"] for k in "qkv")
    assert 0 < d["baseline"]["k"] < 1 and "K-composition" in d["definition"]
    with torch.no_grad():
        a0.attn.out_proj.weight.mul_(3.0)
    again = composition_scores(Subject(model))["pairs"]
    assert [p["k"] for p in again] == pytest.approx([p["k"] for p in d["pairs"]], rel=1e-6)


# ---------------------------------------------------------------------------------------------
# Why a head attends there
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls,cfg", RESIDUAL)
def test_a_score_split_into_query_and_key_writers_sums_to_the_models_score(cls, cfg):
    from attnlab.interventions.why import split_score

    model = example(cls, cfg)
    s = Subject(model)
    args = args_of(model, 0)
    graph = graph_of(s)
    heads = [w for w in graph.writers if w.kind == "head"]
    for w in (heads[-1], next((h for h in heads if h.sublayer == "cross"), heads[0])):
        with torch.no_grad(), hooks.record(model, [f"{w.path}.scores"]) as c:
            model.forward_logits(*args)
        T, S = c[f"{w.path}.scores"].shape[-2:]
        got = split_score(s, args, w.name, T - 1, S // 2, row=1)
        assert got.error <= 1e-5 * (1 + abs(got.score)), (w.name, got.error, got.score)
        assert got.table.shape == (len(got.query_terms), len(got.key_terms))
        assert float(got.table.abs().max()) > 0


@pytest.mark.slow  # 11-12 s under load 5 (still run in CI)
def test_acdc_prunes_every_edge_once_and_reports_what_it_kept():
    from attnlab.interventions.circuits import find_circuit
    from attnlab.interventions.pairs import induction_pairs

    s = char_gpt()
    prompts = induction_pairs(s, n=4, half=4, seed=1)
    r = find_circuit(s, prompts, method="eap", random_sets=20, resamples=50, acdc=0.02)
    a = r.acdc
    assert a["runs"] == r.units + 1 and a["k"] == len(a["units"]) <= r.units
    assert a["faithfulness"] >= 1 - 0.02 * r.units  # each removal cost < tau
    assert 0 <= a["overlap"] <= a["k"] and "ACDC" in str(r)
    assert "on the pairs it pruned on" in " ".join(str(r).split())  # not a held-out figure


def test_path_patching_matches_a_naive_run_and_a_path_to_the_logits_is_the_direct_edge():
    """Sender 0.0 into head 1.1's values only: the naive GPT run on the clean input with that one
    term taken from the corrupt run (nothing upstream of the receiver changes, everything
    after it runs on). Into the logits: the exact score of that edge, noising."""
    from attnlab.interventions.edges import path_patch

    model = small_gpt()
    with torch.no_grad():  # larger weights: the paths carry more than rounding
        for p in model.parameters():
            p.mul_(3.0)
    g = torch.Generator().manual_seed(2)
    clean, corrupt = (torch.randint(0, 11, (2, 6), generator=g) for _ in range(2))
    batch = Batch([0, 1], (clean,), (corrupt,), torch.tensor([1, 2]), torch.tensor([3, 4]),
                  torch.tensor([5, 5]), {"": 6})  # fmt: skip
    circ = Circuits(Subject(model))
    got = path_patch(circ, batch, "blocks.0.attn.head0", ["blocks.1.attn.head1.v"], "logit-diff")
    with torch.no_grad():
        _, r_out = naive_reader_inputs(model, corrupt)

        def swap(reader, writer, term):
            if (reader, writer) == ("blocks.1.attn.head1.v", "blocks.0.attn.head0"):
                return r_out[writer]
            return term

        want = metric_values(naive_reader_inputs(model, clean, swap)[0], batch, "logit-diff")
    torch.testing.assert_close(got["patched"], want, atol=1e-8, rtol=1e-6)
    assert float((got["patched"] - got["clean"]).abs().max()) > 1e-6
    to_logits = path_patch(circ, batch, "blocks.1.attn.head0", ["readout"], "logit-diff")
    with torch.no_grad():

        def swap2(reader, writer, term):
            return r_out[writer] if (reader, writer) == ("readout", "blocks.1.attn.head0") else term

        want2 = metric_values(naive_reader_inputs(model, clean, swap2)[0], batch, "logit-diff")
    torch.testing.assert_close(to_logits["patched"], want2, atol=1e-8, rtol=1e-6)
    with pytest.raises(InterventionError, match="does not write"):
        path_patch(circ, batch, "blocks.1.attn.head0", ["blocks.0.attn.head0.q"], "logit-diff")


def test_the_run_methods_return_plain_data(char_run):
    import json

    from attnlab.run import load_run

    run = load_run(char_run)
    why = run.why("abcabc", "blocks.1.attn.head0", 5, 2)
    assert abs(sum(map(sum, why["table"])) + why["position_bias"] - why["score"]) < 1e-5
    path = run.path_patch("abcab", "dbcab", "c", "blocks.0.attn.head0", ["readout"], foil="d")
    assert path["sender"] == "0.0" and len(path["patched"]) == 1
    json.dumps([why, path])
    with pytest.raises(InterventionError, match="no node"):
        run.path_patch("abcab", "dbcab", "c", "blocks.9.attn.head0", ["readout"], foil="d")


def test_a_heads_qk_and_ov_circuits_through_the_embeddings():
    from attnlab.interventions.weights import head_circuits, head_maps

    s = char_gpt()
    d = head_circuits(s, "blocks.1.attn.head0")
    m = next(x for x in head_maps(s) if x.name == "blocks.1.attn.head0")
    E = s.model.tok_embed.weight.detach().double()
    V = E.size(0)
    assert len(d["qk_tokens"]) == V and len(d["ov_tokens"][0]) == V
    i, j = 3, 7
    assert d["qk_tokens"][i][j] == pytest.approx(float(E[i] @ m.qk @ E[j]), rel=1e-9)
    assert len(d["qk_singular_values"]) <= 8  # the rank is at most the head width
    assert d["ov_directions"][0]["output_side"] and d["qk_directions"][0]["key_side"]


def test_the_why_and_paths_verbs_print_the_run_methods_and_refuse_in_one_line(char_run, capsys):
    import json
    import re

    from attnlab.cli import main
    from attnlab.run import load_run

    run = load_run(char_run)
    why = ["why", str(char_run), "abcabc", "--head", "blocks.1.attn.head0", "--query", "5",
           "--key", "2"]  # fmt: skip
    assert main([*why, "--json"]) == 0
    got, want = json.loads(capsys.readouterr().out), run.why("abcabc", "blocks.1.attn.head0", 5, 2)
    assert got.pop("about")["kind"] == run.kind  # every --json starts with what the model is
    assert got.keys() == want.keys() and got["key_terms"] == want["key_terms"]
    np.testing.assert_allclose(got["table"], want["table"], rtol=1e-6, atol=1e-9)
    assert main([*why, "--top", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(x) <= 80 and x == x.rstrip() for x in lines)
    parts = [float(x.split()[-1]) for x in lines[2:] if not x.startswith(("sum", "("))]
    total = float(next(x for x in lines if x.startswith("sum")).split()[-1])
    assert len(parts) == 4 and sum(parts) == pytest.approx(total, abs=2e-4)  # 3 shown + rest
    paths = ["paths", str(char_run), "--clean", "abcab", "--corrupt", "dbcab", "--target", "c",
             "--foil", "d", "--sender", "blocks.0.attn.head0", "--receiver", "readout"]  # fmt: skip
    assert main([*paths, "--json"]) == 0
    want = run.path_patch("abcab", "dbcab", "c", "blocks.0.attn.head0", ["readout"], foil="d")
    got = json.loads(capsys.readouterr().out)
    assert {k: got[k] for k in ("sender", "receivers", "metric")} == {
        k: want[k] for k in ("sender", "receivers", "metric")}  # fmt: skip
    for k in ("clean", "corrupt", "patched"):  # the gap is tiny here: compare the metric
        np.testing.assert_allclose(got[k], want[k], atol=1e-5)
    assert main(paths) == 0
    out = capsys.readouterr().out.splitlines()
    assert all(len(x) <= 80 and x == x.rstrip() for x in out)
    clean, corrupt, patched = (float(x) for x in re.findall(r"[+-]\d+\.\d+", out[1]))
    assert [clean, corrupt, patched] == pytest.approx(
        [want["clean"][0], want["corrupt"][0], want["patched"][0]], abs=2e-4
    )
    for argv, words in (([*why[:-1], "99"], "positions"), ([*why[:-1], "-1"], "--key"),
                        ([*why[:4], "blocks.9.attn.head0", *why[5:]], "no node"),
                        ([*paths[:-1], "blocks.0.attn.head0.q"], "does not write")):  # fmt: skip
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err.strip()
        assert code == 2 and words in err and "\n" not in err, (argv, err)


def test_the_weights_verb_prints_run_weights_sorted_and_refuses_a_missing_head(char_run, capsys):
    import json

    from attnlab.cli import main
    from attnlab.run import load_run

    want = load_run(char_run).weights("blocks.1.attn.head0", 3)
    argv = ["weights", str(char_run), "--head", "blocks.1.attn.head0", "--top", "3"]
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [p["from"] + p["to"] for p in got["composition"]["pairs"]] == [
        p["from"] + p["to"] for p in want["composition"]["pairs"]]  # fmt: skip
    assert got["head"]["qk_directions"] == want["head"]["qk_directions"]
    assert main([*argv, "--rows", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(x) <= 80 and x == x.rstrip() for x in lines)
    shown = [x.split() for x in lines[2:4]]
    top2 = sorted(want["composition"]["pairs"], key=lambda p: -max(p["q"], p["k"], p["v"]))[:2]
    assert [r[:2] for r in shown] == [[p["from"], p["to"]] for p in top2]
    assert float(shown[0][4]) == pytest.approx(top2[0]["v"], abs=1e-3)
    assert any(x.startswith("    key side: ") and len(x.split()) == 5 for x in lines)
    code = main(["weights", str(char_run), "--head", "blocks.7.attn.head0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "no self-attention head 'blocks.7.attn.head0'" in err, err


def test_prose_wraps_at_spaces_only_so_names_with_hyphens_stay_whole():
    """Names like EAP-IG and "embed -> 0.1.v" are never cut at their hyphens, at any width."""
    from rich.console import Console

    from attnlab.interventions.circuits import Prose

    text = "15 of them are among EAP-IG's top 18; embed -> 0.1.v and 0.2 -> 1.1.k lead " * 3
    for width in range(20, 81):
        console = Console(width=width, record=True, color_system=None)
        console.print(Prose(text))
        lines = console.export_text().splitlines()
        assert all(len(line) <= width for line in lines)
        assert not any(line.endswith(("EAP-", "-")) or line.startswith(">") for line in lines)
        assert " ".join(" ".join(lines).split()) == " ".join(text.split())
