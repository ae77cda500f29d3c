"""A block variant defined here, in a few lines, works everywhere with no other change: a model
built with it trains, decodes on the fast path, and every look-inside verb reads it.

The variant is the sandwich norm: a norm before and a norm after each sublayer, and each update
scaled before it is added, x = x + s P(F(N(x))). It is only a declaration of residual steps
(``attnlab.blocks.Residual``) registered under a name; the forward pass, decoding's fast path,
DLA, the trace, the head scores, the conformance checks and the residual graph all read it.
"""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.blocks import LAYOUTS, Residual, layout
from attnlab.decoding import decoder_for
from attnlab.models.gpt import GPT
from conformance_helpers import build_run, conformance, trace_sums_hold
from look_helpers import CORPUS, run_main

SCALE = 0.5


def sandwich(sublayers):
    """x = x + s P(F(N(x))) for each sublayer: N before, P after, the update scaled by s."""
    return tuple(Residual(s, norm=f"pre_{s}", post=f"post_{s}", scale=SCALE) for s in sublayers)


CONFIG = dict(n_layer=2, n_head=2, d_model=16, block_size=32, dropout=0.0, layout="sandwich")


@pytest.fixture
def variant():
    layout("sandwich")(sandwich)  # the whole of the new variant: one registered function
    yield
    LAYOUTS.pop("sandwich")


def test_a_sandwich_model_trains_and_decodes_on_the_fast_path(variant, tmp_path, capsys):
    run = build_run(GPT, CONFIG, tmp_path / "run", {"task": "lm"})
    data = tmp_path / "corpus.txt"
    data.write_text(CORPUS * 20)
    rc, out, err = run_main(capsys, "train", "--data", data, "--init-from", run, "--out",
                            tmp_path / "tuned", "--max-iters", "40", "--batch-size", "8",
                            "--eval-interval", "20", "--lr", "3e-3", "--quiet", "--json")  # fmt: skip
    assert rc == 0, err
    losses = [m["train_loss"] for m in map(json.loads, (tmp_path / "tuned" / "metrics.jsonl")
                                               .read_text().splitlines()) if "train_loss" in m]  # fmt: skip
    assert losses[-1] < losses[0] - 0.25, losses  # it learns (from 3.1 to 2.7 nats here)
    from attnlab.run import load_run

    model = load_run(tmp_path / "tuned").model
    assert [s.scale for b in model.blocks for s in b.residual] == [SCALE] * 4
    ids = torch.randint(
        0, model.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0)
    )
    dec = decoder_for(model)
    with torch.no_grad():
        full = torch.log_softmax(model(ids), -1)[:, 7:]
        state = dec.start(ids[:, :8], 13)
        assert state.path == "FastForward"
        steps = [dec.step(state, ids[:, 7])] + [dec.step(state, ids[:, t]) for t in range(8, 20)]
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_every_look_inside_verb_reads_a_sandwich_model(variant, tmp_path, capsys):
    run = build_run(GPT, CONFIG, tmp_path / "run", {"task": "lm"})
    out = conformance(capsys, run, only={"trace", "dla", "patch", "check", "explore"})
    # DLA's parts sum to the logit, patching recovers 1 and 0, every check passes (the
    # residual graph's among them): conformance checked those identities; what is left:
    assert (run / "e.html").is_file()
    steps = {s["name"]: s for s in out["trace"]["steps"]}
    assert {"ln1", "attn_post", "attn_scaled", "ln2", "mlp_post", "ffn_scaled"} <= set(steps)
    assert trace_sums_hold(out["trace"]["steps"], atol=1e-4) >= 2
    assert {c["name"] for c in out["check"]["checks"] if c["passed"]} >= {
        "residual graph == forward",
        "decoding == full pass",
        "KV cache == no cache",
    }
    dla = out["dla"]
    assert any(c["name"] == "blocks.1.attn.head0" for c in dla["components"])
    rc, stdout, err = run_main(capsys, "heads", run, "--all", "--json")
    assert rc == 0, err
    heads = json.loads(stdout)
    assert [h["name"] for h in heads["heads"]] == ["0.0", "0.1", "1.0", "1.1"]
    assert len(heads["composition"]) == 4  # layer 1's heads reading layer 0's, from the weights
