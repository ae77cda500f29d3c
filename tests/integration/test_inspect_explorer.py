"""The HTML explorer: self-contained, small, model-agnostic, and working in a real Chromium."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.hooks import ActivationCache
from attnlab.inspect import Recording, explore, record
from attnlab.models.gpt import GPT, GPTConfig
from look_helpers import CORPUS, SENTENCE, char_tokenizer, run_main, tiny_gpt
from task_helpers import train_args, write_task_data

CHROMIUM = "/usr/bin/chromium"


def _embedded(html: str) -> dict:
    m = re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))


def seq2seq_recording() -> Recording:
    """What an encoder-decoder model records: encoder self, decoder self and cross-attention."""
    g = torch.Generator().manual_seed(0)
    src, tgt = ["le", "chat", "noir", "dort"], ["<s>", "the", "black", "cat", "sleeps"]
    c = ActivationCache()
    for i in range(2):
        c[f"encoder.blocks.{i}.attn.weights"] = torch.softmax(
            torch.randn(1, 2, 4, 4, generator=g) * 3, -1
        )
    for i in range(2):
        c[f"decoder.blocks.{i}.attn.weights"] = torch.softmax(
            torch.randn(1, 2, 5, 5, generator=g) * 3, -1
        )
        c[f"decoder.blocks.{i}.cross.weights"] = torch.softmax(
            torch.randn(1, 2, 5, 4, generator=g) * 3, -1
        )
    return Recording(c, {"encoder": src, "decoder": tgt}, memory_stack="encoder")


def _f32(b64: str, rows: int, d: int) -> torch.Tensor:
    """A page's base64 little-endian float32 block as a float64 (rows, d) tensor."""
    x = np.frombuffer(base64.b64decode(b64), dtype="<f4").astype(np.float64)
    return torch.from_numpy(x).view(rows, d)


def page_scores(m: dict) -> torch.Tensor:
    """(H, T, S) q.k/sqrt(d_k) from the q and k a page carries for map ``m``."""
    n = m["neuron"]
    q = torch.stack([_f32(x, m["T"], n["D"]) for x in n["q"]])  # (H, T, D)
    k = torch.stack([_f32(x, m["S"], n["D"]) for x in n["k"]]).repeat_interleave(n["group"], 0)
    return q @ k.transpose(-1, -2) * n["scale"]


def page_weights(m: dict, scale: int = 1000) -> torch.Tensor:
    """(H, T, S) the weights a page draws: its rounded ones, or the softmax of its scores over
    the keys each query may see (what its script computes)."""
    if "w" in m:
        return torch.tensor(m["w"], dtype=torch.float64).view(m["H"], m["T"], m["S"]) / scale
    bits = np.unpackbits(np.frombuffer(base64.b64decode(m["neuron"]["sees"]), dtype=np.uint8))
    sees = torch.from_numpy(bits[: m["T"] * m["S"]].astype(bool)).view(m["T"], m["S"])
    w = torch.softmax(page_scores(m).masked_fill(~sees, float("-inf")), -1)
    return torch.nan_to_num(w)  # a row that sees nothing: zeros


def test_page_is_self_contained_and_carries_what_the_matrix_needs(run):
    """The page holds q and k exactly (float32) and which keys each query sees; from them it
    computes the model's scores and weights, so it carries no weights of its own here."""
    _, model, tok = run
    rec = record(model, tok, SENTENCE)
    page = explore(rec, model)
    html = page.html
    assert not re.search(r"https?://", html), "the page must not reference the network"
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=\"(?!data:)", html)
    data = _embedded(html)
    assert data == json.loads(json.dumps(page.data))
    assert [m["name"] for m in data["maps"]] == ["blocks.0.attn.weights", "blocks.1.attn.weights"]
    N = len(SENTENCE)
    for m in data["maps"]:
        assert (m["T"], m["S"], m["H"]) == (N, N, 2) and "w" not in m
        assert m["neuron"]["derived"] and m["neuron"]["rotary"] is False  # learned positions
        scores = rec.cache[m["name"].replace(".weights", ".scores")][0].double()  # (H, T, S)
        assert float((page_scores(m) - scores).abs().max()) <= 1e-5
        assert float((page_weights(m) - rec.weights(m["name"]).double()).abs().max()) <= 1e-5
        assert m["neuron"]["check"] <= 1e-5 and m["neuron"]["wcheck"] <= 1e-5
    assert [b["layer"] for b in data["influence"]] == ["layer 0", "layer 1"]
    assert data["note"] == ""
    assert "<iframe srcdoc=" in page._repr_html_()


def test_rotary_q_and_k_are_shown_as_rotated_and_still_give_the_scores():
    tok = char_tokenizer()
    torch.manual_seed(1)
    model = tiny_gpt(tok, pos="rotary").eval()
    rec = record(model, tok, SENTENCE)
    for m in explore(rec, model).data["maps"]:
        assert m["neuron"]["rotary"] is True
        scores = rec.cache[m["name"].replace(".weights", ".scores")][0].double()
        assert float((page_scores(m) - scores).abs().max()) <= 1e-5  # q, k after the rotation


def test_a_window_that_cuts_off_keys_keeps_rounded_weights():
    """A causal window from token 0 holds every key its queries see: weights are derived. A
    later window cuts off the keys before it: the page then carries the model's weights."""
    tok = char_tokenizer()
    model = tiny_gpt(tok, block_size=96).eval()
    rec = record(model, tok, (CORPUS * 2)[:96])
    first, later = explore(rec, model, max_tokens=32), explore(rec, model, max_tokens=32, start=64)
    for m in first.data["maps"]:
        assert "w" not in m and m["neuron"]["derived"]
    for m, ref in zip(later.data["maps"], rec.maps()):
        assert "w" in m and not m["neuron"]["derived"] and not m["neuron"]["all_keys"]
        w = rec.weights(ref.name)[:, 64:, 64:].double()
        assert float((page_weights(m) - w).abs().max()) <= 0.5e-3 + 1e-9  # 3 decimals
        scores = rec.cache[ref.name.replace(".weights", ".scores")][0, :, 64:, 64:].double()
        assert float((page_scores(m) - scores).abs().max()) <= 1e-5  # the neuron view still holds


def test_the_page_has_a_colour_legend_matching_the_matrix_colours(run):
    """A gradient bar from the colour of 0 to the colour of the largest weight, between its
    values: 0 and (filled in by the page for the selected head) that largest weight."""
    _, model, tok = run
    html = explore(record(model, tok, SENTENCE), model).html
    legend = re.search(r'<div id="legend".*?</div>', html, re.S).group(0)
    assert re.search(r'<span id="legend-min">0</span><span class="bar"></span>'
                     r'<span id="legend-max"></span>', legend)  # fmt: skip
    stops = re.search(r"\.legend \.bar \{[^}]*linear-gradient\(to right, (rgb\([^)]*\)), "
                      r"(rgb\([^)]*\))\)", html)  # fmt: skip
    # the matrix's colour(a) = rgb(255 - 224a, 255 - 136a, 255 - 75a): the bar spans a = 0..1
    body = re.search(r"function colour\(w\) \{(.*?)\n  \}", html, re.S).group(1)
    drops = [int(x) for x in re.findall(r"255 - (\d+) \* a", body)]
    assert len(drops) == 3
    assert stops.group(1) == "rgb(255,255,255)"
    assert stops.group(2) == "rgb({},{},{})".format(*(255 - d for d in drops))
    assert '$("legend-max").textContent = top.toFixed(3)' in html


def test_tokens_that_look_like_html_cannot_break_the_page():
    tok = char_tokenizer()
    from attnlab.tokenizers import CharTokenizer

    tok = CharTokenizer.from_text("</script><b>&'\"")
    model = GPT(
        GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=1, d_model=8, block_size=32)
    ).eval()
    page = explore(record(model, tok, "</script><b>&'\""), model)
    assert _embedded(page.html)["stacks"][""]["tokens"] == list("</script><b>&'\"")


def test_long_inputs_are_capped_with_a_message_and_stay_small():
    tok = char_tokenizer()
    model = GPT(
        GPTConfig(vocab_size=tok.vocab_size, n_layer=4, n_head=4, d_model=32, block_size=512)
    ).eval()
    rec = record(model, tok, (CORPUS * 8)[:512])
    page = explore(rec, model)
    assert "showing tokens 0..127 of 512" in page.data["note"]
    assert all((m["T"], m["S"]) == (128, 128) for m in page.data["maps"])
    assert page.size < 1_000_000
    later = explore(rec, model, start=400)
    assert "showing tokens 384..511 of 512" in later.data["note"]  # the last full window
    short = explore(record(model, tok, CORPUS[:64]), model)
    assert short.size < 300_000 and short.data["note"] == ""


def test_cross_attention_is_labelled_with_both_stacks():
    page = explore(seq2seq_recording())
    maps = {m["name"]: m for m in page.data["maps"]}
    cross = maps["decoder.blocks.1.cross.weights"]
    assert (cross["qstack"], cross["kstack"], cross["T"], cross["S"]) == (
        "decoder",
        "encoder",
        5,
        4,
    )
    assert cross["label"] == "decoder layer 1 cross"
    assert maps["encoder.blocks.0.attn.weights"]["kstack"] == "encoder"
    assert page.data["stacks"]["encoder"]["tokens"] == ["le", "chat", "noir", "dort"]
    assert page.data["influence"] == []  # nothing recorded for it: the page says so, not crash
    for m in page.data["maps"]:  # no q and k recorded: the rounded weights, and why no neuron view
        assert len(m["w"]) == m["H"] == 2 and "no Q·K neuron view" in m["neuron"]["why"]
    assert "no prediction" in page.data["prediction"]["note"]  # built without a tokenizer


def test_explore_cli(run, tmp_path, capsys):
    path, _, _ = run
    out = tmp_path / "e.html"
    code, _, err = run_main(capsys, "explore", path, SENTENCE, "--html", out)
    assert code == 0, err
    assert "wrote explorer page" in err
    assert _embedded(out.read_text())["title"] == f"attnlab explorer: {SENTENCE}"
    code, _, err = run_main(capsys, "explore", path, SENTENCE, "--html", tmp_path / "e.txt")
    assert code == 2 and "expected a .html" in err
    code, printed, err = run_main(capsys, "explore", path, SENTENCE)  # no --html: in the run
    assert code == 0 and printed == f"{Path(path) / 'explorer.html'}\n", err
    assert _embedded((Path(path) / "explorer.html").read_text())["title"].endswith(SENTENCE)


# ---------------------------------------------------------------------------------------------
# In a real headless Chromium
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def chromium():
    """The Chromium binary. Tests install nothing: `make setup` installs it (apt-get)."""
    found = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if found is None:
        pytest.skip(
            "!!! BROWSER TESTS SKIPPED: no chromium (/usr/bin/chromium or on PATH); `make setup` "
            "installs it with apt-get. The HTML explorer was NOT tested in a browser !!!"
        )
    return found


@pytest.fixture(scope="module")
def browser(chromium):
    from cdp import Browser

    b = Browser(chromium)
    yield b
    b.close()


def _not_blank(png: bytes) -> tuple[int, float]:
    from PIL import Image

    px = (
        np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).reshape(-1, 3).astype(int)
    )  # (pixels, 3)
    colours = len(np.unique(px, axis=0))
    inked = float((px.sum(-1) < 3 * 235).mean())  # share of pixels that are not (near) white
    return colours, inked


def _canvas(b, cid: str) -> str:
    return b.eval(f"document.getElementById('{cid}').toDataURL()")


def _choose(b, sid: str, value) -> None:
    js = "const s = document.getElementById(%r); s.value = %r; s.dispatchEvent(new Event('change'))"
    b.eval("(() => { " + js % (sid, str(value)) + " })()")  # fmt: skip


@pytest.mark.browser
@pytest.mark.slow
def test_explorer_in_chromium_loads_draws_and_reacts(browser, run, tmp_path):
    _, model, tok = run
    out = explore(record(model, tok, SENTENCE), model).save(tmp_path / "e.html")
    browser.events.clear()
    browser.open(out.as_uri())
    state = browser.eval("JSON.stringify(window.attnlabExplorer.state)")
    assert json.loads(state)["draws"] >= 1
    assert (
        browser.eval("document.querySelectorAll('#grid canvas').length") == 4
    )  # 2 layers x 2 heads
    heads0, matrix0 = _canvas(browser, "heads"), _canvas(browser, "matrix")
    _choose(browser, "head", 1)
    assert json.loads(browser.eval("JSON.stringify(window.attnlabExplorer.state)"))["head"] == 1
    heads1, matrix1 = _canvas(browser, "heads"), _canvas(browser, "matrix")
    data = json.loads(browser.eval("JSON.stringify(window.attnlabExplorer.data)"))
    rec = record(model, tok, SENTENCE)
    for h in (0, 1):  # the legend names the largest weight of the head shown
        _choose(browser, "head", h)
        top = float(page_weights(data["maps"][0])[h].max())
        assert abs(top - float(rec.weights(data["maps"][0]["name"])[h].max())) <= 1e-5
        assert browser.eval("document.getElementById('legend-max').textContent") == f"{top:.3f}"
    assert "linear-gradient" in browser.eval(
        "getComputedStyle(document.querySelector('#legend .bar')).backgroundImage"
    )
    assert heads1 != heads0 and matrix1 != matrix0, "changing the head must change what is drawn"
    _choose(browser, "map", 1)
    assert _canvas(browser, "heads") != heads1
    influence1 = _canvas(browser, "influence")
    _choose(browser, "map", 0)
    assert _canvas(browser, "influence") != influence1  # the bars follow the layer
    # hover the 5th query token: only its lines stay drawn
    before = _canvas(browser, "heads")
    box = browser.eval("JSON.stringify(document.getElementById('heads').getBoundingClientRect())")
    r = json.loads(box)
    browser.mouse_move(r["x"] + 60, r["y"] + 13 + 16 * 4 + 8)
    assert json.loads(browser.eval("JSON.stringify(window.attnlabExplorer.state.hover)")) == {
        "side": "q",
        "i": 4,
    }
    assert _canvas(browser, "heads") != before
    # clicking a grid cell selects that layer and head
    browser.eval('document.querySelector(\'#grid canvas[data-map="1"][data-head="0"]\').click()')
    st = json.loads(browser.eval("JSON.stringify(window.attnlabExplorer.state)"))
    assert (st["map"], st["head"]) == (1, 0)
    browser.drain(0.3)
    assert browser.errors() == []
    colours, inked = _not_blank(browser.screenshot())
    assert colours > 20 and inked > 0.02, (colours, inked)


@pytest.mark.browser
@pytest.mark.slow
def test_explorer_in_chromium_serves_cross_attention_and_long_inputs(browser, tmp_path):
    out = explore(seq2seq_recording()).save(tmp_path / "s2s.html")
    browser.events.clear()
    browser.open(out.as_uri())
    labels = browser.eval("Array.from(document.getElementById('map').options).map(o => o.text)")
    assert "decoder layer 0 cross" in labels and "encoder layer 1 self" in labels
    idx = labels.index("decoder layer 0 cross")
    before = _canvas(browser, "heads")
    _choose(browser, "map", idx)
    assert _canvas(browser, "heads") != before
    m = browser.eval(
        "JSON.stringify(window.attnlabExplorer.data.maps[window.attnlabExplorer.state.map])"
    )
    assert json.loads(m)["kstack"] == "encoder"
    browser.drain(0.2)
    assert browser.errors() == []
    browser.eval("setTimeout(() => { throw new Error('probe') }, 0); console.error('probe too')")
    browser.drain(0.3)
    assert len(browser.errors()) == 2  # the error collection itself can fail a test

    tok = char_tokenizer()
    model = GPT(
        GPTConfig(vocab_size=tok.vocab_size, n_layer=2, n_head=2, d_model=16, block_size=512)
    ).eval()
    long = explore(record(model, tok, (CORPUS * 8)[:512]), model).save(tmp_path / "long.html")
    browser.events.clear()
    browser.open(long.as_uri())
    assert "showing tokens 0..127 of 512" in browser.eval(
        "document.getElementById('note').textContent"
    )
    browser.drain(0.2)
    assert browser.errors() == []
    colours, inked = _not_blank(browser.screenshot())
    assert colours > 20 and inked > 0.02


def test_write_figures_for_make_demo(run, tmp_path):
    from attnlab.inspect import write_figures

    _, model, tok = run
    png, html = write_figures(model, tok, SENTENCE, tmp_path / "demo")
    assert png.read_bytes()[:4] == b"\x89PNG" and "attnlabExplorer" in html.read_text()


# ---------------------------------------------------------------------------------------------
# The prediction and the Q·K neuron view on every kind of run (tiny runs, a few steps each)
# ---------------------------------------------------------------------------------------------

INPUT = {"gpt": SENTENCE, "mlm": "Speak, [MASK]peak.", "classify": "the day was good indeed",
         "transformer": "abcd", "lstm-attention": "abcd"}  # fmt: skip


@pytest.fixture(scope="module")
def kinds(tmp_path_factory, run):
    """A run of each kind, trained a few steps through the real CLI (the GPT: ``run``)."""
    d = write_task_data(tmp_path_factory.mktemp("kinds"))
    out = {"gpt": run[0]}
    for kind in ("mlm", "classify", "transformer", "lstm-attention"):
        out[kind] = d / kind
        assert run_main_plain(train_args(kind, d, out[kind], "--max-iters", "3")) == 0, kind
    return out


def run_main_plain(args) -> int:
    from attnlab.cli import main

    return main([str(a) for a in args])


def _explore_and_predict(capsys, path, text, out):
    """The page `attnlab explore` writes, and what `attnlab predict --json` says."""
    code, _, err = run_main(capsys, "explore", path, text, "--html", out)
    assert code == 0, err
    code, printed, err = run_main(capsys, "predict", path, text, "--json")
    assert code == 0, err
    return _embedded(out.read_text(encoding="utf-8")), json.loads(printed)["predictions"][0]


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(INPUT))
def test_the_page_shows_what_predict_says(kinds, kind, capsys, tmp_path):
    """The top prediction in the page is `predict`'s: next token, [MASK] filler, class, and for
    an encoder-decoder the translation and a next-token list per decoder step."""
    data, pred = _explore_and_predict(capsys, kinds[kind], INPUT[kind], tmp_path / "e.html")
    shown = data["prediction"]
    top = shown["sections"][0]["items"][0] if shown["sections"] else None
    if "next" in pred:
        assert (top["label"], shown["sections"][0]["at"]) == (pred["next"][0]["token"],
                                                              len(data["stacks"][""]["tokens"]) - 1)  # fmt: skip
        assert top["p"] == pytest.approx(pred["next"][0]["p"], abs=1e-4)
    elif "masks" in pred:
        assert top["label"] == pred["masks"][0][0]["token"]
        assert shown["sections"][0]["at"] == pred["masks"][0][0]["position"]
        assert top["p"] == pytest.approx(pred["masks"][0][0]["p"], abs=1e-4)
    elif "classes" in pred:
        assert top["label"] == pred["classes"][0]["label"]
        assert top["p"] == pytest.approx(pred["classes"][0]["p"], abs=1e-4)
    else:  # an encoder-decoder: the output, and one section per decoder step
        assert shown["output"] == pred["output"]
        assert len(shown["sections"]) == len(data["stacks"]["decoder"]["tokens"])
        assert all(s["stack"] == "decoder" for s in shown["sections"])
    if kind == "lstm-attention":  # additive attention: the one line that says why not
        (m,) = data["maps"]
        assert "additive" in m["neuron"]["why"] and "w" in m
    else:
        assert all(m["neuron"].get("derived") for m in data["maps"])


def _dom_numbers(browser, selector: str) -> list[tuple[str, float]]:
    js = f"JSON.stringify(Array.from(document.querySelectorAll({selector!r})).map(e => [e.textContent, e.dataset.v]))"  # fmt: skip
    return [(t, float(v)) for t, v in json.loads(browser.eval(js))]


def _text(browser, eid: str) -> str:
    return browser.eval(f"document.getElementById({eid!r}).textContent")


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.parametrize(("kind", "which"), [("gpt", "layer 1 self"), ("mlm", "layer 0 self"),
                                             ("transformer", "decoder layer 0 cross")])  # fmt: skip
def test_neuron_view_products_sum_to_the_score_in_the_matrix_in_chromium(
    browser, kinds, kind, which, capsys, tmp_path
):
    """Pick a map, head 1, a query and a key: the products the page shows add up to the sum it
    shows, which times 1/sqrt(d_k) is the scaled score it shows, which is the matrix's value at
    that cell and the model's own recorded score (1e-5 each); the numbers shown have 8
    significant digits. The prediction panel shows predict's top answer."""
    from attnlab.run import load_run

    data, pred = _explore_and_predict(capsys, kinds[kind], INPUT[kind], tmp_path / "e.html")
    browser.events.clear()
    browser.open((tmp_path / "e.html").as_uri())
    labels = browser.eval("Array.from(document.getElementById('map').options).map(o => o.text)")
    mi = labels.index(which)
    _choose(browser, "map", mi)
    _choose(browser, "head", 1)
    _choose(browser, "mode", "s")  # the matrix shows the scaled scores
    m = data["maps"][mi]
    i, j = m["T"] - 2, 1  # a query token and a key it sees (causal maps: j <= i)
    browser.eval(f"window.attnlabExplorer.pick({i}, {j})")
    st = json.loads(browser.eval("JSON.stringify(window.attnlabExplorer.state)"))
    assert (st["map"], st["head"], st["nq"], st["nk"], st["mode"]) == (mi, 1, i, j, "s")
    assert browser.eval("document.getElementById('nq').value") == str(i)

    prods = _dom_numbers(browser, "#neuron-detail td.prod")
    assert len(prods) == m["neuron"]["D"]
    shown = [float(t) for t, _ in prods]
    for t, v in prods:  # the text is the exact product to 8 significant digits
        assert float(t) == pytest.approx(v, rel=6e-8, abs=1e-300)
    total = float(_text(browser, "neuron-sum"))
    assert abs(sum(shown) - total) <= 1e-5 * max(1.0, sum(abs(x) for x in shown))
    score = float(_text(browser, "neuron-score"))
    assert abs(total * m["neuron"]["scale"] - score) <= 1e-5 * max(1.0, abs(score))
    assert _text(browser, "cell-score") == _text(browser, "neuron-score")  # the matrix's value
    assert _text(browser, "neuron-matrix") == _text(browser, "neuron-score")
    assert "before the mask and the softmax" in _text(browser, "neuron-about")
    # ... which is the model's own recorded scaled score for that head, query and key
    rec = load_run(kinds[kind]).record(INPUT[kind])
    recorded = float(rec.cache[m["name"].replace(".weights", ".scores")][0, 1, i, j])
    assert abs(score - recorded) <= 1e-5 * max(1.0, abs(recorded))
    weight = float(rec.weights(m["name"])[1, i, j])
    assert float(_text(browser, "cell-weight")) == pytest.approx(weight, abs=5e-4)
    # the page names the `why` command for this head, query and key; run as shown, it splits
    # the same score by writer
    import shlex

    cmd = shlex.split(_text(browser, "neuron-why-command"))
    assert cmd[:4] == ["attnlab", "why", str(kinds[kind]), INPUT[kind]]
    code, printed, err = run_main(capsys, *cmd[1:], "--json")
    assert code == 0, err
    split = json.loads(printed)
    assert (split["query_position"], split["key_position"]) == (i, j)
    assert split["score"] == pytest.approx(recorded, rel=1e-4, abs=1e-5)
    # the matrix outlines that cell, and clicking another cell moves the neuron view there
    before = _canvas(browser, "matrix")
    browser.eval(f"window.attnlabExplorer.pick({i}, 0)")
    assert _canvas(browser, "matrix") != before
    assert "key" in _text(browser, "cell") and browser.eval("window.attnlabExplorer.state.nk") == 0

    # a prediction read at a query token shows that token in the neuron view when clicked
    at = next(s for s in data["prediction"]["sections"] if s.get("stack") == m["qstack"])
    browser.eval(f"document.querySelectorAll('#predict h3.link')"
                 f"[{data['prediction']['sections'].index(at)}].click()")  # fmt: skip
    st = json.loads(browser.eval("JSON.stringify(window.attnlabExplorer.state)"))
    assert (st["map"], st["nq"]) == (mi, at["at"] - data["stacks"][m["qstack"]]["offset"])
    # the prediction panel: predict's top answer
    items = json.loads(browser.eval("JSON.stringify(Array.from(document.querySelectorAll("
                                    "'#predict .item')).map(e => e.dataset.label))"))  # fmt: skip
    if "next" in pred:
        assert items[0] == pred["next"][0]["token"]
    elif "masks" in pred:
        assert items[0] == pred["masks"][0][0]["token"]
    else:
        assert _text(browser, "predict-output") == pred["output"]
    browser.drain(0.3)
    assert browser.errors() == []


@pytest.mark.browser
@pytest.mark.slow
def test_additive_attention_says_why_there_is_no_neuron_view_in_chromium(
    browser, kinds, capsys, tmp_path
):
    data, pred = _explore_and_predict(capsys, kinds["lstm-attention"], "abcd", tmp_path / "l.html")
    browser.events.clear()
    browser.open((tmp_path / "l.html").as_uri())
    why = _text(browser, "neuron-why")
    assert "no Q·K neuron view" in why and "additive" in why
    assert data["why"] is None  # no writers to split an additive score by: no `why` command
    assert browser.eval("document.querySelectorAll('#neuron-detail td').length") == 0
    assert _text(browser, "predict-output") == pred["output"]
    browser.drain(0.3)
    assert browser.errors() == []
