"""check: passes on correct models, fails on the notes' lower-triangle/dim=-2 mistake."""

from __future__ import annotations

import json

import pytest
import torch

import attnlab.attention as attention_module
from attnlab.inspect import check
from look_helpers import TinyEncoder, break_attention, char_tokenizer, make_run, run_main, tiny_gpt


@pytest.mark.parametrize(
    "overrides",
    [dict(), dict(pos="rotary", norm_first=False), dict(pos="sinusoidal", n_head=4, dropout=0.1)],
)
def test_check_passes_on_a_correct_gpt(overrides):
    model = tiny_gpt(char_tokenizer(), **overrides).train()
    report = check(model)
    assert report.ok, str(report)
    assert model.training  # mode restored
    statuses = {r.name: r.status for r in report.results}
    assert statuses == {
        "future leak": "PASS",
        "KV cache == no cache": "PASS",
        "decoding == full pass": "PASS",
        "fused == reference attention": "PASS",
        "recording == no recording": "PASS",
        "padding invariance": "skip",
        "eval determinism": "PASS",
        "residual graph == forward": "PASS",
    }
    assert report["KV cache == no cache"].diff < 1e-4
    assert "(FastForward)" in report["decoding == full pass"].detail  # the path generate takes


def test_check_fails_on_lower_triangle_mask_and_softmax_over_queries(monkeypatch):
    model = tiny_gpt(char_tokenizer())
    break_attention(model, monkeypatch)
    report = check(model)
    assert not report.ok
    leak = report["future leak"]
    assert leak.status == "FAIL" and leak.diff > 1e-3
    assert "future leak: output at" in leak.detail
    assert report["KV cache == no cache"].status == "FAIL"
    assert report["decoding == full pass"].status == "FAIL"
    text = str(report)
    assert "FAIL" in text and "check(s) FAILED" in text


def test_check_catches_a_reference_path_that_disagrees_with_the_fused_one(monkeypatch):
    real = attention_module.reference_attention

    def off_scale(q, k, v, mask=None, scale=None, dropout_p=0.0, *rest):  # forgets 1/sqrt(d_k)
        return real(q, k, v, mask, 1.0, dropout_p, *rest)

    monkeypatch.setattr(attention_module, "reference_attention", off_scale)
    report = check(tiny_gpt(char_tokenizer(), d_model=32, n_head=1))
    assert report["fused == reference attention"].status == "FAIL"
    assert report["future leak"].status == "PASS"


def test_padding_invariance_is_checked_where_the_model_pads():
    tok = char_tokenizer()
    torch.manual_seed(0)
    good = check(TinyEncoder(tok.vocab_size))
    assert good.ok, str(good)
    assert good["padding invariance"].status == "PASS"
    assert good["future leak"].status == "skip" and good["KV cache == no cache"].status == "skip"
    bad = check(TinyEncoder(tok.vocab_size, mask_padding=False))
    assert bad["padding invariance"].status == "FAIL" and bad["padding invariance"].diff > 1e-3


def test_eval_determinism_fails_when_eval_is_random():
    model = tiny_gpt(char_tokenizer())
    model.drop.train = lambda mode=True: model.drop  # dropout stays on in eval: the bug
    model.drop.p = 0.5
    model.drop.training = True
    report = check(model)
    assert report["eval determinism"].status == "FAIL"


def test_check_cli_passes_on_a_sound_run(tmp_path, capsys):
    path, _, _ = make_run(tmp_path / "run", steps=5)
    code, out, _ = run_main(capsys, "check", path)
    assert code == 0
    assert "all checks passed" in out and "future leak" in out
    code, out, _ = run_main(capsys, "check", path, "--json")
    assert code == 0 and json.loads(out)["ok"] is True
