"""attnlab train --arch llama and the modern pieces as options; export-hf writes the run as
LlamaForCausalLM (Qwen2 / Qwen3 where its pieces ask), and transformers reproduces its logits."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnlab.cli import main  # noqa: E402
from attnlab.run import load_run  # noqa: E402

TINY = ["--n-layer", "2", "--n-head", "4", "--d-model", "32", "--block-size", "32", "--quiet",
        "--max-iters", "20", "--warmup-iters", "2", "--log-interval", "1000"]  # fmt: skip
TEXT = "the cat sat on the mat. the dog ate the cake; a cat and a dog.\n" * 40


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "tiny.txt"
    path.write_text(TEXT)
    return path


def _config(run) -> dict:
    return json.loads((run / "config.json").read_text())["config"]


def _transformers_reproduces(run, hf_dir, text="the cat sat on the mat"):
    model, tokenizer = load_run(run)
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager")
    auto = transformers.AutoTokenizer.from_pretrained(hf_dir)
    ids = torch.tensor([tokenizer.encode(text)])
    assert auto(text)["input_ids"] == ids[0].tolist()
    with torch.no_grad():
        err = (model(ids) - hf(ids).logits).abs().max().item()
    assert err < 1e-5, err
    return hf


def test_arch_llama_trains_the_llama_shape_and_exports_as_llama(corpus, tmp_path):
    run, out = tmp_path / "run", tmp_path / "hf"
    assert main(["train", "--data", str(corpus), "--arch", "llama", "--out", str(run), *TINY]) == 0
    c = _config(run)
    assert (c["norm"], c["ffn"], c["activation"], c["rotary"], c["n_kv_heads"]) == (
        "rms", "gated", "silu", "half", 2)  # fmt: skip
    assert c["bias"] is False and c["tie_weights"] is False and c["d_ff"] == 96
    assert main(["export-hf", str(run), str(out)]) == 0
    hf = _transformers_reproduces(run, out)
    assert type(hf).__name__ == "LlamaForCausalLM"


def test_the_pieces_as_options_and_qk_norm_exports_as_qwen3(corpus, tmp_path):
    run, out = tmp_path / "run", tmp_path / "hf"
    args = ["--norm", "rms", "--ffn", "swiglu", "--kv-heads", "1", "--pos", "rotary",
            "--qk-norm", "--arch", "llama"]  # fmt: skip
    assert main(["train", "--data", str(corpus), *args, "--out", str(run), *TINY]) == 0
    c = _config(run)
    assert (c["n_kv_heads"], c["qk_norm"], c["norm"]) == (1, True, "rms")
    assert main(["export-hf", str(run), str(out)]) == 0
    assert type(_transformers_reproduces(run, out)).__name__ == "Qwen3ForCausalLM"


def test_a_plain_run_keeps_its_config_json(corpus, tmp_path):
    """The new fields stay out of config.json at their defaults (runs written before them
    are unchanged), and the options out of task_options."""
    run = tmp_path / "run"
    assert main(["train", "--data", str(corpus), "--out", str(run), *TINY]) == 0
    cfg = json.loads((run / "config.json").read_text())
    assert "norm" not in cfg["config"] and "arch" not in json.dumps(cfg.get("task_options", {}))


def test_bad_piece_options_are_one_line(corpus, tmp_path, capsys):
    for args, says in ((["--kv-heads", "3"], "--kv-heads"),
                       (["--ffn", "swiglu", "--task", "mlm"], "--ffn does not apply"),
                       (["--arch", "lstm"], "use --task seq2seq")):  # fmt: skip
        capsys.readouterr()
        code = main(["train", "--data", str(corpus), "--out", str(tmp_path / "r"), *TINY, *args])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and says in err[0], err


def test_arch_llama_resumes_exactly(corpus, tmp_path):
    """Stopped at step 10 and resumed to 20, a Llama-shaped run ends with the same weights as
    one trained 20 steps straight."""
    base = ["train", "--data", str(corpus), "--arch", "llama", *TINY[:9],
            "--warmup-iters", "2", "--log-interval", "1000", "--eval-interval", "5",
            "--lr-decay-iters", "20"]  # one schedule for the whole run and its halves  # fmt: skip
    assert main([*base, "--out", str(tmp_path / "a"), "--max-iters", "20"]) == 0
    assert main([*base, "--out", str(tmp_path / "b"), "--max-iters", "10"]) == 0
    assert main([*base, "--out", str(tmp_path / "b"), "--max-iters", "20", "--resume"]) == 0
    a, b = load_run(tmp_path / "a").model, load_run(tmp_path / "b").model
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
