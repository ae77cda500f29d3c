"""Attention by hand in the workbench, in a real headless Chromium: the words typed are the
tokens ("I like to eat apples": a 5 x 5 matrix), with random or typed X, W_Q, W_K, W_V and the
switches; every step the panel shows is the numbers ``attnlab walk --json`` gives."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from look_helpers import run_main
from serve_helpers import build_kind

pytestmark = [pytest.mark.browser, pytest.mark.slow]

if not (Path("/usr/bin/chromium").exists() or shutil.which("chromium")):
    pytest.skip("no chromium (make setup installs it: apt-get install chromium)",
                allow_module_level=True)  # fmt: skip

TEXT = "I like to eat apples"


def wait(b, cond, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out; page errors: {b.errors()}")


def walk_json(capsys, *args) -> dict:
    rc, out, err = run_main(capsys, "walk", "--tokens", TEXT, *map(str, args), "--json")
    assert rc == 0, err
    return json.loads(out)


def set_value(b, selector: str, value) -> None:
    """Set an input of the panel and fire its change, as a person's edit does."""
    b.eval(f"(() => {{ const e = document.querySelector('[data-panel=walk] {selector}');"
           f" if (e.type === 'checkbox') e.checked = {json.dumps(value)}; else e.value = {json.dumps(value)};"
           " e.onchange(); })()")  # fmt: skip


def shows_walk(b, want: dict) -> bool:
    """Whether every step of ``want`` with values is in the panel, cell by cell (3 decimals)."""
    for k, step in enumerate(want["steps"]):
        if step.get("values") is None:
            continue
        b.eval("(() => { const p = document.querySelector('[data-panel=walk] .steps select');"
               f" p.value = '{k}'; p.onchange(); }})()")  # fmt: skip
        cells = b.eval("Array.from(document.querySelectorAll('[data-panel=walk] td.cell'))"
                       ".map(e => e.textContent)")  # fmt: skip
        rows = step["values"] if isinstance(step["values"][0], list) else [step["values"]]
        flat = [v for r in rows for v in r]
        if len(cells) != len(flat):
            return False
        for c, v in zip(cells, flat):
            if v is None or isinstance(v, str):
                continue
            if abs(float(c) - v) > 0.0005 + 1e-9:
                return False
    return True


def test_the_by_hand_panel_shows_the_walks_numbers(tmp_path, capsys):
    from attnlab.serve import start
    from cdp import Browser

    build_kind("gpt", tmp_path / "runs")
    srv = start(tmp_path / "runs")
    b = Browser(timeout=120)
    try:
        b.open(srv.url)
        wait(b, lambda: b.eval("document.body.dataset.updates") is not None)
        b.eval("document.querySelector('[data-panel=walk] header').onclick()")
        b.eval("(() => { const t = document.getElementById('text'); t.focus(); t.select(); })()")
        b.send("Input.insertText", {"text": TEXT})
        set_value(b, "input[type=number]", 4)  # M
        want = walk_json(capsys, "--m", 4, "--d-k", 3, "--seed", 0)
        assert [s["name"] for s in want["steps"]][:4] == ["tokens", "X", "similarity_dot",
                                                          "similarity_cosine"]  # fmt: skip
        wait(b, lambda: shows_walk(b, want))

        # typed X and W_Q (the rest random), no scale, a temperature: the CLI's numbers again
        x = "1 0 0 1; 0 1 0 1; 1 1 0 0; 0 0 1 1; 1 0 1 0"
        wq = "1 0 0; 0 1 0; 0 0 1; 1 1 1"
        set_value(b, ".hand-x", x)
        set_value(b, ".hand-wq", wq)
        set_value(b, "label:nth-child(1) input[type=checkbox]", False)  # the 1/sqrt(d_k) scale
        b.eval("(() => { const e = Array.from(document.querySelectorAll('[data-panel=walk] input'))"
               ".find(i => i.step === '0.1'); e.value = '2'; e.onchange(); })()")  # fmt: skip
        want = walk_json(capsys, "--x", x, "--wq", wq, "--d-k", 3, "--no-scale",
                         "--temperature", 2, "--seed", 0)  # fmt: skip
        assert want["settings"]["scale"] is False and want["inputs"]["X"][0] == [1, 0, 0, 1]
        wait(b, lambda: shows_walk(b, want))
        assert not b.errors()
    finally:
        b.close()
        srv.stop()
