"""trace: every step's numbers agree with a recomputation from the model's weights."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from attnlab.inspect import InspectError, trace
from look_helpers import SENTENCE, char_tokenizer, make_run, run_main, tiny_gpt


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("look") / "run", n_layer=2, n_head=2)


def _close(a, b, atol=1e-5):
    a, b = (x.detach().numpy() if isinstance(x, torch.Tensor) else x for x in (a, b))
    np.testing.assert_allclose(
        np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), atol=atol
    )


@pytest.mark.parametrize("layer,head", [(0, 0), (1, 1)])
def test_trace_steps_match_a_manual_recomputation(run, layer, head):
    _, model, tok = run
    t = trace(model, tok, SENTENCE, layer=layer, head=head)
    N, C = len(SENTENCE), model.config.d_model
    ids = torch.tensor(tok.encode(SENTENCE))
    blk = model.blocks[layer]
    attn = blk.attn
    dk = attn.d_k
    sl = slice(head * dk, (head + 1) * dk)
    with torch.no_grad():
        emb = model.tok_embed.weight[ids]  # (N, C)
        pos = model.pos_embed.weight[:N]
        x = emb + pos
        for b in model.blocks[:layer]:
            x = b(x[None])[0]
        X = blk.ln1(x)  # (N, C)
        Q = X @ attn.q_proj.weight[sl].T + attn.q_proj.bias[sl]  # (N, d_k)
        K = X @ attn.k_proj.weight[sl].T + attn.k_proj.bias[sl]
        V = X @ attn.v_proj.weight[sl].T + attn.v_proj.bias[sl]
        raw = Q @ K.T  # (N, N)
        scaled = raw / math.sqrt(dk)
        masked = scaled.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
        W = torch.softmax(masked, dim=-1)
        Z = W @ V
        full = model(ids[None])[0]  # (N, vocab)
    assert [s.name for s in t.steps][:2] == ["tokens", "embedding"]
    assert t.tokens == list(SENTENCE) and t.ids == ids.tolist()
    _close(t.step("embedding").value, emb)
    _close(t.step("positional").value, pos)
    _close(t.step("block_input").value, x)
    _close(t.step("ln1").value, X, atol=1e-4)
    _close(t.step("W_Q").value, attn.q_proj.weight[sl].T.detach())
    assert t.step("W_Q").shape == (C, dk) and t.step("Q").shape == (N, dk)
    for name, ref in [("Q", Q), ("K", K), ("V", V), ("raw_scores", raw), ("scaled_scores", scaled)]:
        _close(t.step(name).value, ref, atol=1e-4)
    m = t.step("masked_scores").value
    assert np.isneginf(m[np.triu_indices(N, 1)]).all()
    _close(np.tril(m), np.tril(scaled.numpy()), atol=1e-4)
    w = t.step("weights").value
    _close(w, W, atol=1e-5)
    _close(w.sum(-1), np.ones(N), atol=1e-5)
    _close(t.step("z").value, Z, atol=1e-5)
    concat = t.step("concat").value
    assert concat.shape == (N, attn.n_heads * attn.d_v)
    _close(concat[:, head * attn.d_v : (head + 1) * attn.d_v], Z, atol=1e-5)
    with torch.no_grad():
        out = attn.out_proj(torch.as_tensor(concat))
        resid_mid = x + out
        ffn = blk.mlp(blk.ln2(resid_mid))
    _close(t.step("attn_out").value, out, atol=1e-5)
    _close(t.step("resid_mid").value, resid_mid, atol=1e-5)
    _close(t.step("ffn_out").value, ffn, atol=1e-4)
    _close(t.step("block_output").value, resid_mid + ffn, atol=1e-4)
    assert t.step("ffn_hidden").shape == (N, 4 * C)
    _close(t.step("logits").value, full, atol=1e-4)
    preds = t.step("predictions").extra["predictions"]
    probs = torch.softmax(full[-1].double(), -1)
    top = torch.topk(probs, 5)
    assert [p["id"] for p in preds] == top.indices.tolist()
    _close([p["prob"] for p in preds], top.values, atol=1e-6)
    assert preds[0]["token"] == tok.decode([preds[0]["id"]])
    assert ("more_layers" in [s.name for s in t.steps]) == (layer == 0)


def test_trace_prints_and_serialises_every_step(run):
    _, model, tok = run
    t = trace(model, tok, SENTENCE, layer=1, head=0)
    text = str(t)
    for phrase in (
        "embedding matrix",
        "positional encoding",
        "W_Q of head 0",
        "raw scores Q K^T",
        "1/sqrt(d_k)",
        "causal mask",
        "softmax over the keys",
        "concatenate the 2 heads",
        "output projection",
        "residual connection",
        "feed-forward",
        "next-token",
    ):
        assert phrase in text, phrase
    assert "shape (20 x 16)" in text
    d = json.loads(t.to_json())
    assert [s["name"] for s in d["steps"]] == [s.name for s in t.steps]
    for s in d["steps"]:
        assert s["meaning"] and isinstance(s["shape"], list)
    w = next(s for s in d["steps"] if s["name"] == "weights")
    _close(np.array(w["values"]).sum(-1), np.ones(len(SENTENCE)), atol=1e-4)
    assert "<h4>trace of" in t._repr_html_()


def test_trace_of_a_rotary_post_norm_model_says_where_positions_go():
    tok = char_tokenizer()
    model = tiny_gpt(tok, pos="rotary", norm_first=False).eval()
    t = trace(model, tok, "I like", layer=1, head=1)
    assert "rotate" in t.step("positional").meaning
    assert "ln1" not in [s.name for s in t.steps]  # post-norm: attention reads x itself
    assert "LN(x + attention(x))" in t.step("resid_mid").meaning
    _close(t.step("weights").value.sum(-1), np.ones(6), atol=1e-5)
    with pytest.raises(InspectError, match="no head 2"):
        trace(model, tok, "I like", head=2)


def test_trace_cli(run, cli, capsys):
    path, _, _ = run
    r = cli("trace", path, SENTENCE, "--layer", "1", "--head", "1", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["layer"], d["head"], d["tokens"]) == (1, 1, list(SENTENCE))
    assert {"Q", "K", "V", "weights", "predictions"} <= {s["name"] for s in d["steps"]}
    code, out, err = run_main(capsys, "trace", path, "I like", "--top", "3")
    assert code == 0 and "top 3 next-token predictions" in out
    code, _, err = run_main(capsys, "trace", path, "I like", "--head", "-1")
    assert code == 2 and "--head must be >= 0, got -1" in err


def test_trace_serves_a_bidirectional_encoder_through_the_generic_recording():
    from look_helpers import TinyEncoder

    tok = char_tokenizer()
    model = TinyEncoder(tok.vocab_size).eval()
    t = trace(model, tok, "riverbank", layer=1, head=1)  # no space: its id 0 is the pad id
    names = [s.name for s in t.steps]
    assert "masked_scores" not in names  # not causal: nothing is masked
    w = t.step("weights").value
    assert w.shape == (9, 9) and np.all(w[np.triu_indices(9, 1)] > 0)  # reads the future too
    _close(w.sum(-1), np.ones(9), atol=1e-5)
    assert t.step("logits").shape == (9, tok.vocab_size)
