"""The intervention verbs end to end: ablate, patch, lens, attribute, heads, eval --ablate.

Most calls run ``attnlab`` in this process (fast); the bad-input ones also run through the real
entry point in a subprocess, to see exactly one line on stderr and exit code 2.
"""

from __future__ import annotations

import json

import pytest

from intervene_helpers import rnn_run, seq2seq_run
from look_helpers import CORPUS, make_run, run_main

CLEAN, CORRUPT = "I like to eat apples", "I like to eat pears."


@pytest.fixture(scope="module")
def run_dir(run):
    """The tier's tiny run (tests/integration/conftest.py), as its directory."""
    return run[0]


def ok(capsys, *args) -> str:
    code, out, err = run_main(capsys, *args)
    assert code == 0, err
    return out


def one_line_error(capsys, *args) -> str:
    code, out, err = run_main(capsys, *args)
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnlab: error: "), err
    assert out == ""
    return lines[0]


def test_ablate_prints_the_loss_change_and_what_changed(capsys, run_dir, tmp_path):
    d = json.loads(ok(capsys, "ablate", run_dir, CLEAN, "--head", "0.1,1.0", "--json"))
    assert d["loss_change"] == pytest.approx(d["ablated_loss"] - d["clean_loss"])
    assert d["values_changed"] > 0 and set(d["edits"]) == {"blocks.0.attn.z", "blocks.1.attn.z"}
    png = tmp_path / "ablate.png"
    out = ok(capsys, "ablate", run_dir, CLEAN, "--head", "1.1", "--mode", "mean", "--png", png)
    assert "values changed" in out and png.stat().st_size > 1000


def test_patch_json_has_the_results_list(capsys, run_dir):
    d = json.loads(ok(capsys, "patch", run_dir, "--clean", CLEAN, "--corrupt", CORRUPT,
                      "--target", "s", "--foil", ".", "--json"))  # fmt: skip
    rows = d["results"]
    assert len(rows) == 3 * len(CLEAN)  # (2 layers + the final residual) x positions
    assert all({"layer", "position", "recovered"} <= set(r) for r in rows)
    last = [r for r in rows if r["layer"] == 2 and r["position"] == len(CLEAN) - 1]
    assert last[0]["recovered"] == pytest.approx(1.0)
    d = json.loads(ok(capsys, "patch", run_dir, "--clean", CLEAN, "--corrupt", CORRUPT,
                      "--target", "s", "--by", "head", "--json"))  # fmt: skip
    assert [(r["layer"], r["head"]) for r in d["results"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_attribute_dla_json_sums_to_the_logit(capsys, run_dir):
    d = json.loads(ok(capsys, "attribute", run_dir, CLEAN, "--target", "s", "--method", "dla",
                      "--json"))  # fmt: skip
    assert {"target", "logit", "components"} <= set(d)
    assert all(set(c) == {"name", "value"} for c in d["components"])
    assert abs(sum(c["value"] for c in d["components"]) - d["logit"]) <= 1e-5
    out = ok(capsys, "attribute", run_dir, CLEAN, "--target", "s", "--method", "dla")
    assert "frozen: the final LayerNorm's scale" in out


@pytest.mark.parametrize("columns", ["40", "80", "123"])
def test_attribute_ig_prints_its_completeness_error(capsys, run_dir, tmp_path, monkeypatch,
                                                    columns):  # fmt: skip
    """At any terminal width: the phrase is found wherever its line wraps (tests/printed.py),
    as it once was not when the break fell between "completeness" and "error"."""
    monkeypatch.setenv("COLUMNS", columns)
    out = ok(capsys, "attribute", run_dir, CLEAN, "--target", "s", "--method", "ig",
             "--png", tmp_path / "ig.png")  # fmt: skip
    assert max(map(len, out.splitlines())) <= int(columns)
    assert "completeness error" in out and (tmp_path / "ig.png").is_file()


@pytest.mark.parametrize("method", ["rollout", "flow", "grad"])
def test_attribute_other_methods(capsys, run_dir, method):
    extra = ["--target", "s"] if method == "grad" else []
    d = json.loads(ok(capsys, "attribute", run_dir, CLEAN, "--method", method, *extra, "--json"))
    assert d["method"] == method


def test_lens_and_the_tuned_lens(capsys, run_dir, tmp_path):
    d = json.loads(ok(capsys, "lens", run_dir, CLEAN, "--json"))
    assert d["last_vs_model"] <= 1e-6 and d["points"][0] == "embed"
    one_line_error(capsys, "lens", run_dir, CLEAN, "--tuned")  # none fitted yet
    corpus = tmp_path / "c.txt"
    corpus.write_text(CORPUS * 20)
    ok(
        capsys,
        "lens",
        run_dir,
        "--train-tuned",
        "--data",
        corpus,
        "--max-tokens",
        "1500",
        "--quiet",
    )
    assert (run_dir / "tuned_lens.safetensors").is_file() and (
        run_dir / "tuned_lens.json"
    ).is_file()
    d = json.loads(
        ok(capsys, "lens", run_dir, CLEAN, "--tuned", "--json", "--png", tmp_path / "l.png")
    )
    assert d["lens"] == "tuned" and (tmp_path / "l.png").is_file()


def test_heads_importance_table_heatmap_and_curve(capsys, run_dir, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(CORPUS * 20)
    d = json.loads(ok(capsys, "heads", run_dir, "--importance", "--data", corpus, "--windows", "4",
                      "--quiet", "--json", "--png", tmp_path / "h.png"))  # fmt: skip
    assert len(d["heads"]) == 4 and len(d["pruning"]) == 5
    assert (tmp_path / "h.png").stat().st_size > 1000
    one_line_error(capsys, "heads", run_dir, "--data", corpus)  # no mode chosen


def test_eval_with_ablated_heads_on_a_text(capsys, run_dir, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(CORPUS * 20)
    plain = ok(capsys, "eval", run_dir, "--data", corpus, "--device", "cpu")
    code, out, err = run_main(capsys, "eval", run_dir, "--data", corpus, "--device", "cpu",
                              "--ablate", "0.0,1.1", "--json")  # fmt: skip
    assert code == 0, err
    d = json.loads(out)
    assert d["heads"] == ["0.0", "1.1"] and d["mode"] == "zero"
    assert d["intact"]["loss"] == pytest.approx(float(plain.split()[1]), abs=1e-4)  # eval's own
    assert d["ablated"]["loss"] != d["intact"]["loss"]
    assert d["change"]["loss"] == pytest.approx(d["ablated"]["loss"] - d["intact"]["loss"])
    assert set(d["edits"]) == {"blocks.0.attn.z", "blocks.1.attn.z"} and d["values_changed"] > 0
    assert "no head 7" in one_line_error(
        capsys, "eval", run_dir, "--data", corpus, "--ablate", "1.7"
    )


@pytest.mark.parametrize("args,needle", [
    (["ablate", "{run}", CLEAN, "--head", "5.0"], "no layer 5"),
    (["ablate", "{run}", CLEAN, "--head", "0.9"], "no head 9"),
    (["ablate", "{run}", CLEAN, "--site", "blocks.0.attn.scores"], "recorded only"),
    (["ablate", "{run}", CLEAN, "--site", "nothing.here"], "no hook named"),
    (["ablate", "{run}", CLEAN, "--context"], "LSTM"),
    (["patch", "{run}", "--clean", CLEAN, "--corrupt", "short", "--target", "s"], "same length"),
    (["patch", "{run}", "--clean", CLEAN, "--corrupt", CORRUPT, "--target", "ss"], "2 tokens"),
    (["attribute", "{run}", CLEAN, "--method", "dla"], "--target"),
    (["attribute", "{run}", CLEAN, "--method", "dla", "--target", "s", "--png", "x.txt"], ".png"),
    (["lens", "{run}"], "TEXT"),
])  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(capsys, run_dir, args, needle):
    assert needle in one_line_error(capsys, *[a.format(run=run_dir) for a in args])


@pytest.mark.slow  # two interpreter start-ups
def test_an_edit_on_a_hook_that_never_fires_exits_2_through_the_real_entry_point(cli, tmp_path):
    path, _, _ = make_run(tmp_path / "rotary", steps=2, pos="rotary")
    r = cli("ablate", path, CLEAN, "--site", "pos")  # rotary positions never pass `pos`
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "never fired" in r.stderr
    r = cli("ablate", path, CLEAN, "--head", "3.0")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no layer 3" in r.stderr


def test_an_lstm_run_ablates_its_context_and_refuses_other_verbs_in_one_line(capsys, tmp_path):
    run = rnn_run(tmp_path / "rnn")
    d = json.loads(ok(capsys, "ablate", run, "abc def", "--context", "--json"))
    assert d["edits"]["decoder.attn.z"]["changed"] > 0
    assert "--context" in one_line_error(capsys, "ablate", run, "abc", "--head", "0.0")
    assert "residual stream" in one_line_error(capsys, "lens", run, "abc")
    assert "one cross-attention" in one_line_error(capsys, "attribute", run, "abc", "--method",
                                                   "flow")  # fmt: skip
    assert "context" in one_line_error(capsys, "heads", run, "abc", "--importance")


def test_an_encoder_decoder_run_patches_and_attributes(capsys, tmp_path):
    run = seq2seq_run(tmp_path / "s2s")
    d = json.loads(ok(capsys, "attribute", run, "abc def", "--target", "m", "--method", "dla",
                      "--position", "2", "--json"))  # fmt: skip
    assert abs(sum(c["value"] for c in d["components"]) - d["logit"]) <= 1e-5
    d = json.loads(ok(capsys, "patch", run, "--clean", "abc def", "--corrupt", "abd def",
                      "--target", "m", "--by", "head", "--json"))  # fmt: skip
    assert {r.get("stack") for r in d["results"]} == {"encoder", "decoder"}


def test_explore_adds_intervention_tabs(capsys, run_dir, tmp_path):
    out = tmp_path / "e.html"
    code, _, err = run_main(capsys, "explore", run_dir, CLEAN, "--html", out, "--interventions")
    assert code == 0, err
    page = out.read_text()
    for tab in (
        "logit lens",
        "rollout",
        "flow",
        "DLA of",
        "integrated gradients",
        "head importance",
    ):
        assert f">{tab}" in page
    assert page.count('class="tabpane"') == 7 and "data:image/png;base64," in page
    assert "http://" not in page and "https://" not in page  # still self-contained
    plain = tmp_path / "p.html"
    assert run_main(capsys, "explore", run_dir, CLEAN, "--html", plain)[0] == 0
    assert 'id="tabs"' not in plain.read_text()  # no tabs unless asked for


@pytest.mark.browser
@pytest.mark.slow
def test_intervention_tabs_switch_in_chromium(run_dir, tmp_path):
    import os

    if not os.path.exists("/usr/bin/chromium"):
        pytest.skip("no /usr/bin/chromium: the tabs were not tried in a browser")
    from attnlab.inspect import explore, record
    from attnlab.interventions import explorer_tabs
    from attnlab.run import load_run
    from cdp import Browser

    s = load_run(run_dir).subject
    page = explore(record(s.model, s.tokenizer, CLEAN), s.model,
                   tabs=explorer_tabs(s, CLEAN)).save(tmp_path / "t.html")  # fmt: skip
    browser = Browser()
    try:
        browser.open(page.as_uri())
        shown = "Array.from(document.querySelectorAll('.tabpane')).map(p => p.style.display)"
        assert json.loads(browser.eval(f"JSON.stringify({shown})"))[0] == ""
        browser.eval("document.querySelectorAll('#tabs button')[1].click()")
        after = json.loads(browser.eval(f"JSON.stringify({shown})"))
        assert after[0] == "none" and after[1] == "" and after[2:] == ["none"] * 5
        assert browser.errors() == []
    finally:
        browser.close()
