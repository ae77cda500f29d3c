"""The README's picture of the workbench, taken of a trained model: the notes' word-level toy
(``attnlab train --data sentences --tokenizer word --preset toy``, as docs/notes.md trains it)
on "I like to eat apples", the head docs/notes.md shows (layer 1, head 0) selected, in a real
headless Chromium. The page's matrix is checked against ``attnlab attention --json`` before
the picture is taken.

    ATTNLAB_SCREENSHOT=docs/serve.png pytest tests/integration/test_serve_screenshot.py

writes docs/serve.png (otherwise the picture goes to the test's temporary directory)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from attnlab.cli import main
from look_helpers import run_main
from serve_helpers import skip_without_chromium, wait

pytestmark = [pytest.mark.browser, pytest.mark.slow]
skip_without_chromium()

TEXT = "I like to eat apples"


def test_the_readme_picture_is_of_a_trained_word_model(tmp_path, capsys, open_workbench):

    run = tmp_path / "runs" / "words"
    assert main(["train", "--data", "sentences", "--tokenizer", "word", "--preset", "toy",
                 "--out", str(run)]) == 0  # fmt: skip
    capsys.readouterr()  # what training printed
    rc, out, err = run_main(capsys, "attention", str(run), TEXT, "--layer", "1", "--head", "0",
                            "--json")  # fmt: skip
    assert rc == 0, err
    want = json.loads(out)
    assert len(want["weights"]) == 5  # five words: the notes' 5 x 5
    b = open_workbench(run.parent)
    b.eval("(() => { const t = document.getElementById('text'); t.focus(); t.select(); })()")
    b.send("Input.insertText", {"text": TEXT})
    wait(b, lambda: b.eval("document.body.dataset.done") == TEXT
         and not b.eval("attnlab.columns().some(c => c.busy)"))  # fmt: skip
    mi = b.eval("attnlab.columns()[0].data.explorer.maps.findIndex(m => m.name === "
                f"{json.dumps(want['name'])})")  # fmt: skip
    assert mi >= 0
    b.eval(f"attnlab.columns()[0].select({mi}, 0)")
    sel = f'table.heat[data-map="{want["name"]}"][data-head="0"] td.cell'
    cells = b.eval(f"Array.from(document.querySelectorAll({json.dumps(sel)}))"
                   ".map(e => +e.textContent)")  # fmt: skip
    flat = [w for row in want["weights"] for w in row]
    assert len(cells) == len(flat) == 25
    assert all(abs(c - w) <= 0.0005 + 1e-4 for c, w in zip(cells, flat)), (cells, flat)
    wait(b, lambda: not b.eval("attnlab.columns().some(c => c.busy)"))
    shot = Path(os.environ.get("ATTNLAB_SCREENSHOT") or tmp_path / "serve.png")
    b.send("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": 1150,
                                                  "deviceScaleFactor": 1, "mobile": False})  # fmt: skip
    b.eval("window.scrollTo(0, 0)")
    shot.write_bytes(b.screenshot())
    b.send("Emulation.clearDeviceMetricsOverride")
    assert shot.stat().st_size > 10_000
    assert not b.errors()
