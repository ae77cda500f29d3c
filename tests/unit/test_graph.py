"""The residual graph, declared once: a block's residual steps (``attnlab.blocks.Residual``),
the model's writers, readers and edges (``attnlab.models.graph``), and the one decoding fast
path that runs every block shape (``attnlab.decoding.FastForward``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from attnlab import hooks
from attnlab.attention import per_head_inputs
from attnlab.blocks import LAYOUTS, Block, Residual, layout
from attnlab.decoding import FastForward, decoder_for
from attnlab.inspect.check import check_residual_graph
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.graph import Walker
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from conformance_helpers import EXAMPLES, tokenizer_for
from intervene_helpers import perturb

SRC = Path(__file__).resolve().parents[2] / "src" / "attnlab"
SMALL = dict(vocab_size=20, block_size=16, n_layer=2, n_head=2, d_model=16)


def example(cls, cfg: dict):
    """A random model of a registered kind's example config, its norms and biases perturbed."""
    tok = tokenizer_for(cls, cfg)
    cfg = dict(cfg)
    for name, attr, _ in cls.tokenizer_fields:
        cfg.setdefault(name, getattr(tok, attr))
    torch.manual_seed(0)
    model = perturb(cls(cls.config_class(**cfg)).eval(), 0.3)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    return model


def inputs(model):
    """Random inputs the model reads (token ids, or its own images), as `attnlab check` makes."""
    return model.probe_inputs(2, 0, 12)


def recorded(model):
    """A recording of the model on random inputs, run as `attnlab check` runs it."""
    with torch.no_grad(), hooks.record(model) as cache:
        model.probe_forward(inputs(model))
    return cache


def names(nodes) -> list[str]:
    return [n.name for n in nodes]


# ---------------------------------------------------------------------------------------------
# A block's residual steps
# ---------------------------------------------------------------------------------------------


def test_each_layout_is_a_small_variant_of_one_declaration():
    subs = ("attn", "mlp")
    assert LAYOUTS["pre"](subs) == (Residual("attn", norm="ln1"), Residual("mlp", norm="ln2"))
    assert LAYOUTS["post"](subs) == (Residual("attn", after="ln1"), Residual("mlp", after="ln2"))
    assert LAYOUTS["parallel"](subs)[1] == Residual("mlp", norm="ln2", reads="block")
    assert LAYOUTS["four-norm"](subs)[0] == Residual("attn", norm="ln1", post="ln1_post")
    assert LAYOUTS["pre"](("attn",)) == (Residual("attn", norm="ln1"),)  # attention only
    with pytest.raises(ValueError, match="self-attention then a feed-forward"):
        LAYOUTS["parallel"](("attn", "cross", "mlp"))


@pytest.mark.parametrize("flags,name", [({}, "pre"), ({"norm_first": False}, "post"),
                                        ({"parallel": True}, "parallel"),
                                        ({"post_norms": True}, "four-norm")])  # fmt: skip
def test_the_flags_only_pick_a_layout(flags, name):
    """A block built from the old flags is the block of the named layout, weight for weight."""
    torch.manual_seed(0)
    a = Block(16, 2, 24, causal=True, **flags).eval()
    torch.manual_seed(0)
    b = Block(16, 2, 24, causal=True, layout=name).eval()
    assert a.residual == b.residual == LAYOUTS[name](("attn", "mlp"))
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        assert torch.equal(a(x), b(x))


def test_a_layout_must_declare_its_sublayers_in_order():
    @layout("mlp-first")
    def _(subs):
        return tuple(Residual(s, norm="ln_" + s) for s in reversed(subs))

    try:
        with pytest.raises(ValueError, match="one step per sublayer, in the order attn, mlp"):
            Block(16, 2, layout="mlp-first")
        with pytest.raises(ValueError, match="unknown block layout 'nope'"):
            Block(16, 2, layout="nope")
        with pytest.raises(ValueError, match="reads the stream or the block's input"):
            Residual("attn", reads="memory")
    finally:
        LAYOUTS.pop("mlp-first")


def test_residual_scale_and_output_norm_do_what_the_declaration_says():
    """x + s P(F(N(x))), step by step: the forward pass is the declaration read literally."""

    @layout("half-sandwich")
    def _(subs):
        return tuple(Residual(s, norm=f"n_{s}", post=f"p_{s}", scale=0.5) for s in subs)

    try:
        torch.manual_seed(0)
        b = Block(16, 2, 24, causal=True, layout="half-sandwich").eval()
        x = torch.randn(2, 5, 16)
        with torch.no_grad():
            h = x + 0.5 * b.p_attn(b.attn(b.n_attn(x), causal=True))
            want = h + 0.5 * b.p_mlp(b.mlp(b.n_mlp(h)))
            torch.testing.assert_close(b(x), want)
    finally:
        LAYOUTS.pop("half-sandwich")


# ---------------------------------------------------------------------------------------------
# The residual graph
# ---------------------------------------------------------------------------------------------


def test_a_gpt_graph_has_the_writers_readers_and_edges_of_its_blocks():
    g = GPT(GPTConfig(**SMALL)).graph()
    assert names(g.writers) == ["embed", "blocks.0.attn.head0", "blocks.0.attn.head1",
                                "blocks.0.mlp_out", "blocks.1.attn.head0", "blocks.1.attn.head1",
                                "blocks.1.mlp_out"]  # fmt: skip
    first = [f"blocks.0.attn.head{h}.{x}" for x in "qkv" for h in range(2)]
    assert sorted(names(g.readers[:6])) == sorted(first)
    assert names(g.readers[6:7]) == ["blocks.0.mlp_in"] and g.readers[-1].name == "readout"
    up = {r.name: names(g.upstream(r)) for r in g.readers}
    assert up["blocks.0.attn.head1.k"] == ["embed"]
    assert up["blocks.0.mlp_in"] == ["embed", "blocks.0.attn.head0", "blocks.0.attn.head1"]
    assert up["blocks.1.attn.head0.q"] == names(g.writers[:4])
    assert up["readout"] == names(g.writers)
    # 6 readers x 1 + 3 + 6 readers x 4 + 6 + the readout's 7
    assert len(g.edges()) == 6 + 3 + 24 + 6 + 7
    r = g.node("blocks.1.attn.head0.q")
    assert (r.source, r.norm) == ("blocks.1.resid_pre", "blocks.1.ln1")
    assert g.node("blocks.1.mlp_in").source == "blocks.1.resid_mid"
    assert g.node("readout").norm == "ln_f"


def test_a_parallel_blocks_mlp_reads_the_block_input_so_its_own_heads_do_not_reach_it():
    g = GPT(GPTConfig(**SMALL, parallel=True)).graph()
    r = g.node("blocks.1.mlp_in")
    assert r.source == "blocks.1.resid_pre"
    assert names(g.upstream(r)) == ["embed", "blocks.0.attn.head0", "blocks.0.attn.head1",
                                    "blocks.0.mlp_out"]  # fmt: skip
    assert len(g.edges()) == 6 + 1 + 24 + 4 + 7


def test_a_shared_kv_head_is_one_key_and_one_value_reader_for_its_group():
    g = GPT(GPTConfig(**{**SMALL, "n_head": 4}, n_kv_heads=2)).graph()
    keys = [r for r in g.readers if r.kind == "k" and r.layer == 0]
    assert [(r.name, r.heads) for r in keys] == [("blocks.0.attn.kv0.k", (0, 1)),
                                                 ("blocks.0.attn.kv1.k", (2, 3))]  # fmt: skip
    assert len([r for r in g.readers if r.kind == "q" and r.layer == 0]) == 4


def test_encoder_writers_reach_the_decoder_only_through_cross_attention_keys_and_values():
    m = Seq2SeqTransformer(Seq2SeqConfig(n_encoder_layers=2, n_decoder_layers=2, n_head=2,
                                         d_model=16, dropout=0.0, max_len=16))  # fmt: skip
    g = m.graph()
    assert g.stacks == ("encoder", "decoder")
    encoder = {w.name for w in g.writers if w.stack == "encoder"}
    for r in g.readers:
        reached = {w.name for w in g.upstream(r)} & encoder
        from_memory = r.path.startswith("decoder.") and r.sublayer == "cross" and r.kind in "kv"
        assert bool(reached) == (from_memory or r.path.startswith("encoder.")), r.name
        if from_memory:
            assert reached == encoder and r.source == "encoder.blocks.1.resid_post"
    cross_q = g.node("decoder.blocks.1.cross.head0.q")
    assert "decoder.blocks.1.attn.head1" in names(g.upstream(cross_q))
    assert "decoder.blocks.1.mlp_out" not in names(g.upstream(cross_q))
    assert [r.name for r in g.readers if r.kind == "readout"] == ["decoder.readout"]


@pytest.mark.parametrize("cls,cfg", EXAMPLES)
def test_every_readers_input_is_the_sum_of_its_upstream_writers(cls, cfg):
    """On every registered kind and example: what each reader reads is the sum of what its
    upstream writers wrote (through any post-norm block's norms, frozen) and the biases on the
    way; with no norm on the stream after a writer, the term is the writer's own output. A
    kind with no residual stream says so in one line."""
    model = example(cls, cfg)
    if not model.residual:
        with pytest.raises(ValueError, match="no residual stream"):
            model.graph()
        return
    g, cache = model.graph(), recorded(model)
    for r in g.readers:
        parts = g.contributions(cache, r)
        assert set(parts) >= {w.name for w in g.upstream(r)}
        got, want = sum(parts.values()), g.input(cache, r).double()
        torch.testing.assert_close(got, want, atol=1e-5 * (1 + float(want.abs().max())), rtol=0)
        if all(not s.after for b in model.stack_blocks(r.stack) for s in b.residual):
            for w in g.upstream(r):
                torch.testing.assert_close(parts[w.name], g.output(cache, w).double(),
                                           atol=1e-5, rtol=1e-5)  # fmt: skip
    assert check_residual_graph(model, inputs(model)).passed


@pytest.mark.parametrize("cls,cfg", [p for p in EXAMPLES if p.values[0].residual])
def test_one_walk_gives_every_readers_terms_in_turn(cls, cfg):
    """A Walker carried from reader to reader in forward order gives each the terms
    ``contributions`` computes for it alone, and refuses to walk backwards."""
    model = example(cls, cfg)
    g, cache = model.graph(), recorded(model)
    walkers = {s: Walker(model, s, cache) for s in g.stacks}
    for r in sorted(g.readers, key=lambda r: (g.stacks.index(r.stack), r.at)):
        got, want = walkers[r.stack].to(r.at), g.contributions(cache, r)
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), (r.name, name)
    if any(r.at > (0, 0) for r in g.readers):
        with pytest.raises(ValueError, match="forward order"):
            walkers[g.stacks[-1]].to((0, 0))


@pytest.mark.parametrize("cls,cfg", [p for p in EXAMPLES if p.values[0].residual])
def test_each_readers_site_carries_its_input_through_its_norm(cls, cfg):
    """With per-head inputs, the hook ``graph.site(reader)`` names holds, at the reader's
    index, the reader's input after its norm (the readout's: before it, its source)."""
    model = example(cls, cfg)
    g = model.graph()
    run = model.probe_forward  # an encoder-decoder's: its source and a decoder input
    with torch.no_grad(), per_head_inputs(model), hooks.record(model) as cache:
        run(inputs(model))
    for r in g.readers:
        site = g.site(r)
        held = cache[site.hook] if site.index is None else cache[site.hook][:, site.index]
        x = g.input(cache, r)
        if site.normed and r.norm:
            with torch.no_grad():
                x = model.get_submodule(r.norm)(x)
        torch.testing.assert_close(held, x, atol=1e-6, rtol=1e-6, msg=r.name)
    assert {g.site(r).normed for r in g.readers} == {True, False}


def test_the_graph_check_fails_where_the_model_writes_what_its_graph_does_not_say():
    """``attnlab check``'s graph row rebuilds each stream from the declared writers: a model
    whose attention adds something its heads do not (here a torch hook on the output
    projection) no longer adds up, and the check says so."""
    model = GPT(GPTConfig(**SMALL)).eval()
    ids = model.probe_inputs()
    assert check_residual_graph(model, ids).passed
    handle = model.blocks[1].attn.out_proj.register_forward_hook(lambda m, i, o: o + 0.1)
    try:
        r = check_residual_graph(model, ids)
    finally:
        handle.remove()
    assert r.passed is False and r.diff > 1e-3


# ---------------------------------------------------------------------------------------------
# The fast decoding path: every block shape, every kind
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls,cfg", EXAMPLES)
def test_decoding_is_the_forward_pass_on_every_kind(cls, cfg):
    """Every example of every registered kind: one that decodes gives, step by step, the
    log-probabilities of its full forward pass within 1e-5 (a GPT on the fast path, Gemma's
    and NeoX's blocks included); one that does not is refused in one line."""
    model = example(cls, cfg)
    if not model.decodes:
        with pytest.raises(ValueError, match="does not generate"):
            decoder_for(model)
        return
    dec, g = decoder_for(model), torch.Generator().manual_seed(1)
    with torch.no_grad():
        if model.reads == "source":  # an encoder-decoder: its decoder, one step at a time
            V = model.config.tgt_vocab_size
            src, tgt = (
                torch.randint(3, V, (2, 7), generator=g),
                torch.randint(3, V, (2, 6), generator=g),
            )
            full = torch.log_softmax(model(src, tgt).float(), -1)
            state = dec.start(src, tgt.size(1))
            steps = [dec.step(state, tgt[:, t]) for t in range(tgt.size(1))]
        else:
            ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=g)
            full = torch.log_softmax(model(ids).float(), -1)[:, 4:]
            state = dec.start(ids[:, :5], 8)
            assert state.path == "FastForward"
            steps = [dec.step(state, ids[:, 4])] + [
                dec.step(state, ids[:, t]) for t in range(5, 12)
            ]
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_the_fast_path_runs_every_registered_layout(name):
    model = GPT(GPTConfig(**SMALL, layout=name, pos="rotary", attn_softcap=3.0,
                          sliding_window=3, layer_types=["sliding", "full"])).eval()  # fmt: skip
    perturb(model, 0.3)
    assert FastForward.applies(model)
    ids = torch.randint(0, 20, (2, 10))
    with torch.no_grad():
        full, cache = model(ids), model.new_cache(2)
        fast = FastForward(model)
        steps = [fast(ids[:, :4], cache)] + [fast(ids[:, t : t + 1], cache) for t in range(4, 10)]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 3:], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Nothing else reads the layout flags
# ---------------------------------------------------------------------------------------------

FLAGS = {"norm_first", "parallel", "post_norms", "mlp"}
OWNERS = ("blocks.py", "models/")  # where a block's layout is declared and built


def _flag_reads(path: Path) -> list[str]:
    """Where ``path`` reads a layout flag: ``x.flag``, and a flag named in a string
    (``getattr(x, "parallel")``, a list of names); not a keyword argument or a key written,
    which build a config. ``"mlp"`` is also a sublayer's name: only ``x.mlp`` counts."""
    tree, out = ast.parse(path.read_text(encoding="utf-8")), []
    written = {id(n.slice) for n in ast.walk(tree)  # fields["norm_first"] = ...: a config built
               if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store)}  # fmt: skip
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in FLAGS
            and isinstance(node.ctx, ast.Load)
        ):
            if not (
                isinstance(node.value, ast.Attribute) and node.value.attr == "nn"
            ):  # torch.nn.parallel
                out.append(f"{node.lineno}: .{node.attr}")
        elif (
            isinstance(node, ast.Constant)
            and node.value in FLAGS - {"mlp"}
            and id(node) not in written
        ):
            out.append(f"{node.lineno}: {node.value!r}")
    return out


def test_nothing_outside_the_blocks_and_models_reads_the_layout_flags():
    """The flags are how a config says which layout it wants; every reader reads the blocks'
    declared steps (keyword arguments that build a config are writes, not reads)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(OWNERS):
            continue
        found += [f"{rel}:{hit}" for hit in _flag_reads(path)]
    assert not found, "layout flags read outside blocks.py and models/:\n" + "\n".join(found)


def test_the_flag_grep_sees_a_read():
    assert _flag_reads(SRC / "blocks.py")  # it reads them: the walk is not blind
