"""`attnlab experiment NAME --quick` end to end, as CI runs it: the page and the JSON are
written, every published figure stands beside attnlab's over three seeds, every sentence says
what its numbers say, every model is a run directory any verb opens, and the terminal summary
fits 80 columns."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow  # each trains six small models (about 20 to 40 s on 2 cores)

# Two seeds each: the per-seed checks (every seed measured, the verdict over all of them, the
# runs a multiple of the seed count) are the same with two as with the default three, and the
# third seed was a third of this file's CI time
SEEDS = (1, 2)


@pytest.mark.timeout(1200)  # six small models each: minutes on a busy machine
@pytest.mark.parametrize("name", ["pruning", "rollout-and-flow", "attention-vs-importance",
                                  "attention-vs-contribution", "grokking",
                                  "attention-sinks"])  # fmt: skip
def test_quick_experiment_writes_published_beside_measured(name, cli, tmp_path, capsys,
                                                          monkeypatch):  # fmt: skip
    from types import SimpleNamespace

    from attnlab.cli import main
    from attnlab.render.layout import check_figures

    out = tmp_path / "report"
    monkeypatch.delenv("COLUMNS", raising=False)
    with check_figures() as seen:  # every picture it draws passes the readability check
        seeds = SEEDS
        code = main(["experiment", name, "--quick", "--out", str(out), "--seeds",
                     ",".join(map(str, seeds)), "--threads", "1"])  # fmt: skip
    r = SimpleNamespace(returncode=code, **dict(zip(("stdout", "stderr"), capsys.readouterr())))
    assert r.returncode == 0, r.stderr
    assert seen and [(label, p) for label, p in seen if p] == []
    assert all(len(line) <= 80 and line == line.rstrip() for line in r.stdout.splitlines())
    d = json.loads((out / "figures.json").read_text())
    assert d["experiment"] == name and d["settings"]["quick"] is True
    assert d["claims"]
    for c in d["claims"]:
        assert c["published"] and c["criterion"]
        assert sorted(c["measured"]["per_seed"]) == [str(s) for s in seeds]
        # the verdict is the criterion applied to the numbers, and the sentence says it
        values = [v for v in c["measured"]["per_seed"].values() if v is not None]
        if values:
            assert c["measured"]["min"] <= c["measured"]["mean"] <= c["measured"]["max"]
        else:  # no seed reached what it measures (a --quick grokking run never groks)
            assert c["measured"]["min"] is c["measured"]["max"] is None and not c["reproduces"]
        t = c["threshold"]
        ops = {">": float.__gt__, ">=": float.__ge__, "<": float.__lt__, "<=": float.__le__}
        met = [ops[c["op"]](float(v), float(t)) for v in values]
        # a verdict only from models that learned their task (issue 32 item 8)
        assert c["judged"] == all(c["learned"].values()) if c["learned"] else c["judged"]
        assert c["reproduces"] == (c["judged"] and len(values) == len(seeds) and all(met))
        if c["judged"]:
            assert ("does not reproduce" in c["sentence"]) == (not c["reproduces"])
        else:
            assert "too small to judge" in c["sentence"] and c["learned_bar"] in c["sentence"]
        assert c["sentence"] in r.stdout.replace("\n  ", " ").replace("attnlab:   ", "")
    page = (out / "report.html").read_text()
    assert "data:image/png;base64," in page and "<table" in page
    assert d["pictures"]  # each picture is also a PNG file beside the page
    for p in d["pictures"]:
        assert (out / p["file"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p["caption"]
    for c in d["claims"]:
        assert c["sentence"].replace("'", "&#x27;") in page
    assert d["runs"] and len(d["runs"]) % len(seeds) == 0
    for run in d["runs"]:
        assert (out / run["path"] / "model.safetensors").is_file()
        if name == "attention-sinks":  # every model, the imported one too, reads <bos> first
            from attnlab.tokenizers import load_tokenizer

            assert load_tokenizer(out / run["path"] / "tokenizer.json").bos_id is not None
    first = out / d["runs"][0]["path"]
    ev = cli("eval", first, "--json")  # a run any verb opens
    assert ev.returncode == 0, ev.stderr


def test_unknown_experiment_and_bad_seeds_exit_2_with_one_line(cli, tmp_path):
    r = cli("experiment", "prunning", "--out", tmp_path / "x")
    assert r.returncode == 2 and "did you mean 'pruning'" in r.stderr
    r = cli("experiment", "pruning", "--out", tmp_path / "x", "--seeds", "1,1")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()
