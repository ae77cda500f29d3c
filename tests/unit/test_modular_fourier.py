"""Modular addition (--task modular) and its Fourier reading (attnlab.inspect.fourier), each
against its definition on small moduli."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.data import DataError
from attnlab.inspect import fourier
from attnlab.tasks.modular import ModularAddition, ModularOptions, parse_add, split_sizes


def task(spec="add:p=11,frac=0.4", seed=3) -> ModularAddition:
    t = ModularAddition(ModularOptions(data=spec), seed=seed)
    t.prepare(None)
    return t


def test_pairs_read_a_b_equals_and_the_split_is_the_fraction_asked():
    t = task()
    x, y = t.all_pairs()
    assert x.shape == (121, 3) and y.shape == (121,)
    assert t.tokenizer.decode(x[5 * 11 + 9].tolist()) == "5 9="  # prose spacing
    assert int(y[5 * 11 + 9]) == (5 + 9) % 11
    assert t.tokenizer.encode("5 9 =") == x[5 * 11 + 9].tolist()
    n_train, n_test = split_sizes(11, 0.4)
    assert (len(t.train_idx), len(t.test_idx)) == (n_train, n_test) == (48, 73)
    assert len(set(t.train_idx.tolist()) | set(t.test_idx.tolist())) == 121  # a partition
    again = task()
    assert torch.equal(again.train_idx, t.train_idx)  # a function of the seed alone
    assert not torch.equal(task(seed=4).train_idx, t.train_idx)


@pytest.mark.parametrize("spec, words", [
    ("add:p=1", "p must be in 2..1000"), ("add:p=1001", "p must be in 2..1000"),
    ("add:frac=0", "frac must be in (0, 1)"), ("add:frac=1", "frac must be in (0, 1)"),
    ("add:p=2,frac=0.1", "at least one"), ("add:q=3", "unknown parameter 'q'"),
    ("add:p=x", "p must be an integer"), ("mul", "reads the generated data"),
])  # fmt: skip
def test_bad_specs_are_refused_naming_the_bound(spec, words):
    with pytest.raises(DataError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_add(spec)


def test_the_loss_reads_the_answer_over_the_number_tokens_only():
    t = task()
    model = t.build_model()
    c = model.config
    assert (c.n_layer, c.n_head, c.d_model, c.d_ff, c.norm, c.block_size) == (1, 4, 128, 512,
                                                                           "none", 3)  # fmt: skip
    assert c.vocab_size == 13 and not c.tie_weights and c.activation == "relu"
    x, y = t.pairs(t.train_idx[:7])
    logits = model(x)[:, -1]  # (7, 13)
    ref = torch.nn.functional.cross_entropy(logits[:, 1:12], y)
    torch.testing.assert_close(t.loss(model, (x, y)), ref)
    # the <unk> and "=" logits take no part: making them huge changes nothing
    with torch.no_grad():
        model.lm_head.weight[0] += 100.0
        model.lm_head.weight[12] += 100.0
    torch.testing.assert_close(t.loss(model, (x, y)), t.loss(model, (x, y)))
    assert set(t.evaluate(model, 0.0)) == {"val_accuracy", "train_accuracy"}


def test_full_batch_by_default_and_predict_parses_two_numbers():
    d = ModularAddition.defaults_for({"data": "add:p=11,frac=0.4"})
    assert d["batch_size"] == 48 and d["weight_decay"] == 1.0 and d["grad_clip"] == 0.0
    t = task()
    batch = next(t.train_batches(d["batch_size"], 0))
    assert sorted((batch[0][:, 0] - 1).mul(11).add(batch[0][:, 1] - 1).tolist()) == sorted(
        t.train_idx.tolist()
    )  # every training pair, once
    model = t.build_model()
    out = t.predict(model, ["3 + 4", "3 4 ="], top_k=2)
    assert out[0]["answer"] == 7 and len(out[0]["next"]) == 2
    assert out[0]["next"] == out[1]["next"]
    from attnlab.config import ConfigError

    with pytest.raises(ConfigError, match="two numbers in 0..10"):
        t.predict(model, ["3 + 40"])


# -- the Fourier reading ----------------------------------------------------------------------


@pytest.mark.parametrize("p", [7, 10, 113])
def test_fourier_basis_is_orthonormal_and_power_sums_to_the_norm(p):
    B, freqs = fourier.fourier_basis(p)
    torch.testing.assert_close(B @ B.T, torch.eye(p, dtype=torch.float64), atol=1e-10, rtol=0)
    assert freqs.max() == p // 2 and int((freqs == 0).sum()) == 1
    W = torch.randn(p, 5, dtype=torch.float64)
    power = fourier.frequency_power(W)
    assert power.shape == (p // 2 + 1,)
    torch.testing.assert_close(power.sum(), W.pow(2).sum())


def test_an_embedding_of_two_frequencies_has_those_two_as_key_frequencies():
    p = 31
    x = torch.arange(p, dtype=torch.float64)
    w = lambda k: 2 * math.pi * k / p  # noqa: E731
    W = torch.zeros(p, 4, dtype=torch.float64)
    W[:, 0], W[:, 1] = 3 * torch.cos(w(5) * x), 3 * torch.sin(w(5) * x)
    W[:, 2] = 2 * torch.cos(w(12) * x)
    W[:, 3] = 0.5 + 0.01 * torch.cos(w(9) * x)  # a constant (left out) and a trace of 9

    class Emb:
        class tok_embed:
            weight = torch.cat([torch.zeros(1, 4), W.float(), torch.zeros(1, 4)])

    s = fourier.spectrum(Emb, p)
    assert s.key == [5, 12] and s.key_share > 0.99
    assert s.power[5] == pytest.approx(9 * p, rel=1e-5) and s.power[9] < 1e-2


def test_restricted_and_excluded_loss_of_logits_made_of_key_frequencies():
    """Logits sum_k cos(w_k (a + b - c)) lie wholly in the key frequencies: restricting to
    them changes nothing, excluding them leaves every answer the same logit (ln p)."""
    p, key = 13, [2, 5]
    a = torch.arange(p).repeat_interleave(p).double()
    b = torch.arange(p).repeat(p).double()
    c = torch.arange(p).double()
    L = sum(4 * torch.cos(2 * math.pi * k / p * (a[:, None] + b[:, None] - c[None, :]))
            for k in key)  # (p^2, p)  # fmt: skip
    train = torch.arange(0, p * p, 3)
    m = fourier.progress_measures(L, p, key, train)
    assert m["restricted_loss"] == pytest.approx(m["loss"], abs=1e-9)
    assert m["excluded_loss"] == pytest.approx(math.log(p), abs=1e-9)
    other = fourier.progress_measures(L, p, [3], train)  # a frequency the logits do not use
    assert other["excluded_loss"] == pytest.approx(m["loss"], abs=1e-9)
    assert other["restricted_loss"] == pytest.approx(math.log(p), abs=1e-9)


def test_pair_logits_and_attention_over_pairs_read_the_model():
    t = task("add:p=7,frac=0.5")
    model = t.build_model().eval()
    L = fourier.pair_logits(model, 7)
    x, _ = t.all_pairs()
    torch.testing.assert_close(L.float(), model(x)[:, -1, 1:8], atol=1e-6, rtol=0)
    att = fourier.attention_over_pairs(model, 7)
    assert att.shape == (4, 7, 7)
    _, cache = model(x[3 * 7 + 5 : 3 * 7 + 6], record=True)
    torch.testing.assert_close(att[:, 3, 5].float(), cache["blocks.0.attn.weights"][0, :, 2, 0])


def test_a_callback_finishes_a_run_early_at_an_evaluation(tmp_path):
    """Trainer.finish_early: the evaluation that asked is the run's last, saved, and the run is
    finished rather than interrupted (what the grokking experiment's early stop uses)."""
    from attnlab.training.run import plan, train

    class StopAtSecondEval:
        evals = 0

        def on_metrics(self, trainer, row):
            if "val_loss" in row:
                self.evals += 1
                if self.evals == 2:
                    trainer.finish_early("two evaluations are enough")

    p = plan({"task": "modular", "data": "add:p=5,frac=0.6", "max_iters": 50,
              "eval_interval": 4, "out": str(tmp_path / "run"), "quiet": True, "threads": 1})  # fmt: skip
    outcome = train(p, callbacks=[StopAtSecondEval()])
    assert outcome.result.step == 4 and outcome.result.interrupted is None
    from attnlab import rundir

    cfg = rundir.read_run_config(tmp_path / "run")
    assert "metrics" in cfg and cfg["metrics"]["val_accuracy"] >= 0  # finished, not cut off
    import json

    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert state["step"] == 4


def test_icl_score_is_the_late_token_loss_minus_the_early_one():
    from attnlab.metrics import icl_positions, icl_score

    assert icl_positions(64) == (7, 64) and icl_positions(512) == (52, 512)
    assert icl_positions(8) == (2, 8)
    torch.manual_seed(0)
    x = torch.randint(0, 9, (3, 30))
    logits = torch.randn(3, 30, 9)
    score, early, late = icl_score(logits, x)
    nll = lambda t: torch.nn.functional.cross_entropy(logits[:, t - 2], x[:, t - 1])  # noqa: E731
    assert (early, late) == (3, 30)
    assert score == pytest.approx(float(nll(30) - nll(3)), abs=1e-6)
