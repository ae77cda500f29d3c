"""Watch it learn, in a real headless Chromium: the learn panel draws each head's attention
map at the newest snapshot, with the weights ``attnlab explore RUN --steps`` stores, and moves
on by itself when a new snapshot lands (here: the last one, held back and then put in place,
as ``attnlab train`` renames it into place)."""

from __future__ import annotations

import base64
import shutil

import pytest

from attnlab.cli import main
from serve_helpers import skip_without_chromium, wait

pytestmark = [pytest.mark.browser, pytest.mark.slow]
skip_without_chromium()


def last_row(data: dict, head: str) -> list[float]:
    """The last query's weights of ``head`` at the newest snapshot with maps, as the page
    decodes them (one byte per weight, round(255 w))."""
    probe = data["probes"]["repeat"]
    h = next(x for x in probe["heads"] if x["name"] == head)
    raw = base64.b64decode(probe["frames"][-1]["maps"][h["map"]][h["head"]])
    T = probe["T"]
    return [b / 255 for b in raw[(T - 1) * T :]]


def test_the_maps_update_per_snapshot_as_a_run_trains(tmp_path, open_workbench):
    from attnlab.inspect.step_explorer import step_data

    run = tmp_path / "runs" / "induction"
    assert main(["train", "--task", "induction", "--out", str(run), "--n-layer", "2",
                 "--n-head", "2", "--d-model", "16", "--max-iters", "20", "--snapshot-every",
                 "10", "--eval-interval", "10", "--batch-size", "4"]) == 0  # fmt: skip
    snaps = sorted((run / "snapshots").glob("step-*.safetensors"))
    assert len(snaps) >= 2
    held = tmp_path / snaps[-1].name
    shutil.move(str(snaps[-1]), held)  # the newest snapshot has not landed yet
    before = step_data(run)
    b = open_workbench(run.parent)
    b.eval("document.querySelector('[data-panel=learn] header').onclick()")
    b.eval("(() => { const c = document.querySelector('[data-panel=learn] input[type=checkbox]');"
           "c.checked = true; c.onchange(); })()")  # fmt: skip

    def status():
        e = b.eval("(() => { const e = document.querySelector('[data-panel=learn] .learn-map');"
                   " return e ? Object.assign({}, e.dataset) : null; })()")  # fmt: skip
        return e

    wait(b, lambda: status() is not None)
    s = status()
    assert int(s["step"]) == before["probes"]["repeat"]["frames"][-1]["step"]
    row = b.eval("document.querySelector('[data-panel=learn] .learn-row').textContent").split()
    want = last_row(before, s["head"])
    assert len(row) == len(want) and all(abs(float(x) - w) <= 0.005 + 1e-9
                                         for x, w in zip(row, want))  # fmt: skip

    shutil.move(str(held), snaps[-1])  # the snapshot lands: the panel follows it
    after = step_data(run)
    newest = after["probes"]["repeat"]["frames"][-1]["step"]
    assert newest > int(s["step"])
    wait(b, lambda: int(status()["step"]) == newest, timeout=30)
    row = b.eval("document.querySelector('[data-panel=learn] .learn-row').textContent").split()
    want = last_row(after, s["head"])
    assert all(abs(float(x) - w) <= 0.005 + 1e-9 for x, w in zip(row, want))
    assert int(status()["frames"]) == len(after["probes"]["repeat"]["frames"])
    assert not b.errors()
