"""The HTML explorer: self-contained, small, model-agnostic, and working in a real Chromium."""

from __future__ import annotations

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
from look_helpers import CORPUS, SENTENCE, char_tokenizer, make_run, run_main

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("look") / "run")


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


def test_page_is_self_contained_and_carries_rounded_weights(run):
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
        assert (m["T"], m["S"], len(m["w"])) == (N, N, 2)
        for h, ints in enumerate(m["w"]):
            w = torch.tensor(ints, dtype=torch.float64).view(N, N) / data["scale"]
            ref = rec.weights(m["name"])[h].double()
            assert float((w - ref).abs().max()) <= 0.5 / data["scale"] + 1e-9  # 3 decimals
    assert [b["layer"] for b in data["influence"]] == ["layer 0", "layer 1"]
    assert data["note"] == ""
    assert "<iframe srcdoc=" in page._repr_html_()


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
    for h in (0, 1):  # the legend names the largest weight of the head shown
        _choose(browser, "head", h)
        top = max(data["maps"][0]["w"][h]) / 1000
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
