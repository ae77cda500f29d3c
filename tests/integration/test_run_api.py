"""attnlab.load_run from Python: a Run that still unpacks as (model, tokenizer) and does what the
CLI's verbs do, with the CLI's defaults (one definition of each, read by both)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import attnlab
from attnlab.cli import build_parser
from attnlab.generation import SamplingConfig
from attnlab.tasks import EvalOptions, PredictOptions
from look_helpers import CORPUS, make_run, run_main


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("api")
    path, _, _ = make_run(d / "run", steps=20)
    (d / "text.txt").write_text(CORPUS * 4, encoding="utf-8")
    return path


def _defaults(cls) -> dict:
    return {f.name: f.default for f in dataclasses.fields(cls)}


def test_load_run_is_a_run_that_still_unpacks(gpt):
    run = attnlab.load_run(gpt)
    model, tok = run
    assert isinstance(run, attnlab.Run) and model is run.model and tok is run.tokenizer
    assert run[0] is model and run.kind == "gpt" and "causal" in run.describe()
    assert run.about == {"kind": "gpt", "model_type": "gpt", "description": run.describe()}


def test_predict_and_evaluate_match_the_cli(gpt, capsys):
    run = attnlab.load_run(gpt)
    pred = run.predict("I like to", top_k=4)
    code, out, err = run_main(capsys, "predict", gpt, "I like to", "--top-k", "4", "--json")
    assert code == 0, err
    (cli,) = json.loads(out)["predictions"]  # the same answer; p within float32 rounding
    assert cli["input"] == pred["input"]
    assert [(c["token"], c["id"]) for c in cli["next"]] == [
        (c["token"], c["id"]) for c in pred["next"]
    ]
    assert [c["p"] for c in cli["next"]] == pytest.approx([c["p"] for c in pred["next"]], abs=1e-6)
    assert [p["p"] for p in pred["next"]] == sorted((p["p"] for p in pred["next"]), reverse=True)
    assert len(run.predict(["I like", "You like"])) == 2
    data = gpt.parent / "text.txt"
    ev = run.evaluate(data=str(data))
    code, out, err = run_main(capsys, "eval", gpt, "--data", data, "--json")
    assert code == 0, err
    cli = json.loads(out)
    assert cli["loss"] == pytest.approx(ev["loss"]) and cli["tokens"] == ev["tokens"]
    assert str(ev).splitlines()[0].split()[:2] == ["loss", f"{ev['loss']:.4f}"]


def test_generate_matches_the_cli_with_the_same_defaults(gpt, capsys):
    run = attnlab.load_run(gpt)
    text = run.generate("I like", max_new_tokens=20, seed=3)
    code, out, err = run_main(capsys, "generate", gpt, "--prompt", "I like",
                              "--max-new-tokens", "20", "--seed", "3")  # fmt: skip
    assert code == 0, err
    assert out == "I like" + text + "\n"
    greedy = run.generate("I like", max_new_tokens=10, temperature=0)
    assert greedy == run.generate("I like", max_new_tokens=10, temperature=0.0, seed=9)


def test_every_cli_default_is_the_librarys(gpt):
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices  # verb -> its parser

    def parsed(verb, *args):
        return vars(sub[verb].parse_args([str(gpt), *args]))

    gen = parsed("generate")
    for name, value in _defaults(SamplingConfig).items():
        assert gen[name] == value, name
    assert SamplingConfig().temperature == 0.8  # what the CLI always had
    pred = parsed("predict", "x")
    for name, value in _defaults(PredictOptions).items():
        assert pred[name] == value, name
    ev = parsed("eval")
    for name, value in _defaults(EvalOptions).items():
        assert ev[name] == value, name
    assert parsed("classify", "x")["top"] == PredictOptions.top_k
    tr = parsed("translate", "x")
    assert (tr["beam"], tr["alpha"], tr["max_len"]) == (None, PredictOptions.alpha, None)


def test_record_is_what_the_look_verbs_read(gpt):
    from attnlab.inspect import attention

    run = attnlab.load_run(gpt)
    rec = run.record("I like to eat apples")
    assert rec.kind == "gpt" and rec.description == run.describe()
    amap = attention(rec, layer=1, head=1)
    assert json.loads(amap.to_json())["about"]["kind"] == "gpt"
    assert torch.allclose(torch.tensor(amap.weights).sum(-1), torch.ones(20), atol=1e-5)


def test_generate_refuses_what_is_not_a_gpt_and_a_hugging_face_directory(gpt, capsys, tmp_path):
    hf = tmp_path / "gpt2"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures":
                                                ["GPT2LMHeadModel"]}))  # fmt: skip
    code, out, err = run_main(capsys, "generate", hf)
    assert code == 2 and not out
    assert f"attnlab import-hf {hf} --out runs/gpt2" in err and len(err.splitlines()) == 1
    with pytest.raises(attnlab.rundir.RunError, match="import-hf"):
        attnlab.load_run(hf)
    code, _, err = run_main(capsys, "generate", gpt, "--temperature", "-1")
    assert code == 2 and "--temperature must be >= 0" in err


def test_an_encoder_with_no_head_points_to_embed(tmp_path):
    from attnlab.models.encoder import Encoder, EncoderConfig
    from attnlab.rundir import RunError, save_model
    from attnlab.tokenizers import build_tokenizer

    tok = build_tokenizer("char", "hello world", encoder=True)
    save_model(tmp_path / "enc", Encoder(EncoderConfig(vocab_size=tok.vocab_size, n_layer=1,
                                                       n_head=2, d_model=16)), tok)  # fmt: skip
    run = attnlab.load_run(tmp_path / "enc")
    assert run.kind == "encoder"
    for call in (lambda: run.predict("hello"), lambda: run.evaluate(data="x"),
                 lambda: run.generate("hello")):  # fmt: skip
        with pytest.raises(RunError, match="embed|predict"):
            call()
