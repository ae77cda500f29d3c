"""Issue 32's small ones (item 9), each as a reader meets it: heads names every head's kind or
says it has none, and explains a loss on random tokens worse than guessing; the induction run
says one value for one loss; attention flow says why its row does not sum to 1; a random T5's
empty prediction says why it is empty; similarity and influence draw pictures; the notebook
page needs no network for its formulas."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from attnlab.cli import main
from kinds_helpers import t5_dir
from task_helpers import train_args, write_task_data


def attnlab(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, " ".join(err.split())


def test_heads_names_each_heads_kind_and_explains_the_random_token_loss(tiny_trained_run,
                                                                       capsys):  # fmt: skip
    code, out, _ = attnlab(capsys, "heads", tiny_trained_run, "--threads", "1")
    assert code == 0
    table = out.split("\n\n")[0].splitlines()
    rows = [line for line in table if re.match(r"^\d+\.\d+ ", line)]
    assert rows and all(line.split()[-1] != line.split()[-2] for line in rows)
    assert all(not re.match(r"^[\d.]+$", line.split()[-1]) for line in rows)  # a kind, or -
    said = " ".join(out.split())
    assert "-: no score reaches its bar" in said
    assert re.search(r"guessing uniformly scores ln \d+ = \d\.\d{3}", said)


def test_the_induction_run_says_one_value_for_its_in_context_loss(tmp_path, capsys):
    d = write_task_data(tmp_path)
    args = train_args("induction", d, tmp_path / "r", "--max-iters", "2", "--eval-interval", "2")
    args.remove("--quiet")
    code, _, err = attnlab(capsys, *args)
    assert code == 0
    evals = re.findall(r"repeated-half loss (\d\.\d{4})", err)
    examples = re.findall(r"in context: first half [\d.]+, repeated half (\d\.\d{4})", err)
    assert evals and evals == examples  # before: 0.1353 on the eval line, 0.137 beside it


def test_attention_flow_says_why_its_row_does_not_sum_to_1(tiny_trained_run, capsys):
    code, out, _ = attnlab(capsys, "attribute", tiny_trained_run, "First Citizen", "--method",
                           "flow", "--threads", "1")  # fmt: skip
    assert code == 0
    said = " ".join(out.split())
    assert re.search(r"the row sums to \d+\.\d\d: each input's flow", said)
    assert "so the row need not sum to 1" in said
    code, out, _ = attnlab(capsys, "attribute", tiny_trained_run, "First Citizen", "--method",
                           "rollout", "--threads", "1")  # fmt: skip
    assert "the row sums to 1.00" in " ".join(out.split())


def test_a_random_t5s_empty_prediction_says_why(tmp_path, capsys):
    pytest.importorskip("transformers")
    assert main(["import-hf", str(t5_dir(tmp_path / "hf")), "--out", str(tmp_path / "t5")]) == 0
    code, out, _ = attnlab(capsys, "predict", tmp_path / "t5", "the cat sat on the mat")
    assert code == 0
    first, *rest = out.splitlines()
    if first.endswith("-> ''"):
        assert "no text: the decoder wrote only special tokens" in " ".join(" ".join(rest).split())
    else:
        assert not rest  # a non-empty output needs no word
    code, out, _ = attnlab(capsys, "predict", tmp_path / "t5", "the cat sat on the mat", "--json")
    assert json.loads(out)["predictions"][0]["output"] == first.split(" -> ")[1].strip("'")


@pytest.mark.parametrize("verb", ["similarity", "influence"])
def test_similarity_and_influence_draw_pictures(verb, tiny_trained_run, tmp_path, capsys):
    png = tmp_path / f"{verb}.png"
    code, out, err = attnlab(capsys, verb, tiny_trained_run, "First Citizen", "--png", png,
                             "--threads", "1")  # fmt: skip
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {verb}" in err or "wrote influence" in err
    assert out  # the tables are printed too


def test_the_notebooks_formulas_need_no_network():
    """Its page was rendered with MathJax from the network: offline, raw LaTeX showed."""
    nb = json.loads((Path(__file__).resolve().parents[2] / "examples" /
                     "walkthrough.ipynb").read_text(encoding="utf-8"))  # fmt: skip
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"])
            assert "$" not in text and "\\(" not in text and "\\frac" not in text, text[:80]
