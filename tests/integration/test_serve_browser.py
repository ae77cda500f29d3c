"""The workbench in a real headless Chromium, for every kind of run: type a text and every
panel shows the numbers the CLI's --json gives for it; click a head in the grid and the page
shows the ablated prediction and loss change the CLI gives; bad input is one line in the page
and the page keeps working. One workbench and one browser for the module, tiny runs.

The GPT test also takes a screenshot of the page (into its temporary directory); the README's
picture is of a trained model, taken by tests/integration/test_serve_screenshot.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from look_helpers import run_main
from serve_helpers import KINDS, build_kind, build_llama, skip_without_chromium, wait

pytestmark = [pytest.mark.browser, pytest.mark.slow]
skip_without_chromium()

TEXTS = {name: text for name, (_, _, text) in KINDS.items()} | {"llama": "the cat sat on the mat"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-browser") / "runs"
    root.mkdir()
    for name in KINDS:
        build_kind(name, root)
    build_llama(root.parent)
    shutil.move(str(root.parent / "llama"), str(root / "llama"))
    return root


@pytest.fixture(scope="module")
def page(runs, open_workbench):
    return open_workbench(runs)


def updates(b) -> int:
    return int(b.eval("document.body.dataset.updates || 0"))


def after(b, action) -> None:
    """Do ``action`` and wait until the page says every column has updated since."""
    n = updates(b)
    action()
    wait(b, lambda: updates(b) > n and b.eval("!attnlab.columns().some(c => c.busy)"))


def choose(b, a: str, beside: str = "") -> None:
    after(b, lambda: b.eval(f"document.getElementById('run-b').value = {json.dumps(beside)};"
                            f"document.getElementById('run-a').value = {json.dumps(a)};"
                            "document.getElementById('run-a').onchange()"))  # fmt: skip


def type_text(b, text: str) -> None:
    """Select the input's text and type ``text`` over it, as a person does."""

    def act():
        b.eval("(() => { const t = document.getElementById('text'); t.focus(); t.select(); })()")
        b.send("Input.insertText", {"text": text})

    after(b, act)
    wait(b, lambda: b.eval("document.body.dataset.done") == text)


def click(b, selector: str) -> None:
    """A real mouse click at the middle of the element."""
    r = b.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
               "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
               "return [r.left + r.width / 2, r.top + r.height / 2]; })()")  # fmt: skip
    for kind in ("mousePressed", "mouseReleased"):
        b.send("Input.dispatchMouseEvent", {"type": kind, "x": r[0], "y": r[1], "button": "left",
                                            "clickCount": 1})  # fmt: skip


def cli(capsys, *args) -> dict:
    rc, out, err = run_main(capsys, *map(str, args), "--json")
    assert rc == 0, err
    return json.loads(out)


def shown(b, col: int, panel: str, selector: str) -> list[str]:
    return b.eval(f"Array.from(document.querySelectorAll('.column')[{col}]"
                  f".querySelector('[data-panel={panel}]').querySelectorAll({json.dumps(selector)}))"
                  ".map(e => e.textContent)")  # fmt: skip


def close(shown_text: str, value: float, decimals: int, slack: float = 0.0) -> bool:
    return abs(float(shown_text) - value) <= 0.5 * 10**-decimals + slack + 1e-12


def check_prediction(b, capsys, run, text, col=0):
    pred = cli(capsys, "predict", run, text)["predictions"][0]
    if "output" in pred:
        assert shown(b, col, "prediction", ".output") == [pred["output"]]
        return
    items = pred.get("next") or pred.get("classes") or [x for f in pred["masks"] for x in f]
    nums = shown(b, col, "prediction", ".item .num")
    assert len(nums) == len(items)
    assert all(close(s, x["p"], 4) for s, x in zip(nums, items)), (nums, items)


def check_attention(b, capsys, run, text):
    """The large matrix of the head the CLI's `attention` shows by default (layer 0, head 0)."""
    a = cli(capsys, "attention", run, text)
    mi = b.eval(
        f"attnlab.columns()[0].data.explorer.maps.findIndex(m => m.name === {json.dumps(a['name'])})"
    )
    assert mi >= 0
    b.eval(f"attnlab.columns()[0].select({mi}, 0)")
    cells = b.eval(f"Array.from(document.querySelectorAll('.column')[0].querySelectorAll("
                   f"'table.heat[data-map=\"{a['name']}\"][data-head=\"0\"] td.cell')).map(e => e.textContent)")  # fmt: skip
    flat = [w for row in a["weights"] for w in row]
    assert len(cells) == len(flat) > 0
    assert all(close(s, w, 3, 1e-4) for s, w in zip(cells, flat))
    # the neuron view names the `why` command for its head, query and key (a residual model)
    why = b.eval("(() => { const e = document.querySelector('.column .why-command');"
                 " return e ? e.textContent : null; })()")  # fmt: skip
    from attnlab.run import load_run

    if load_run(run).model.residual:
        import shlex

        cmd = shlex.split(why)
        assert cmd[:4] == ["attnlab", "why", str(run), text], cmd
        assert cmd[cmd.index("--head") + 1] == a["name"].rsplit(".", 1)[0] + ".head0"
        split = cli(capsys, *cmd[1:])
        assert split["query_position"] == int(cmd[cmd.index("--query") + 1])
    else:
        assert why is None


def check_walkthrough(b, capsys, run, text):
    t = cli(capsys, "trace", run, text, "--layer", "0", "--head", "0")
    line = shown(b, 0, "walkthrough", ".output")[0]
    assert line.split() == [
        f"{tok}={i}".replace(" ", "\u2423") for tok, i in zip(t["tokens"], t["ids"])
    ] or len(line.split()) == len(t["tokens"])
    k = next(i for i, s in enumerate(t["steps"]) if s.get("values") is not None)
    after(
        b,
        lambda: b.eval(
            "(() => { const p = document.querySelectorAll('.column')[0].querySelector('[data-panel=walkthrough] select');"
            f"p.value = '{k}'; p.onchange(); }})()"
        ),
    )  # fmt: skip  (the step is fetched)
    values = t["steps"][k]["values"]
    rows = values if isinstance(values[0], list) else [values]
    want = [v for r in rows[:24] for v in r[:24]]
    cells = shown(b, 0, "walkthrough", "td.cell")
    assert len(cells) == len(want)
    assert all(close(s, v, 3) for s, v in zip(cells, want))


def check_similarity_and_influence(b, capsys, run, text):
    s = cli(capsys, "similarity", run, text)["layers"][0]
    cells = shown(b, 0, "similarity", ".before td.cell")
    want = [v for r in s["before"] for v in r]
    assert len(cells) == len(want) and all(close(c, v, 2) for c, v in zip(cells, want))
    rows = cli(capsys, "influence", run, text)["rows"]
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    pick = "document.querySelectorAll('.column')[0].querySelector('[data-panel=influence] select')"
    assert b.eval(f"Array.from({pick}.options).map(o => o.text)") == [str(x) for x in layers]
    for i in sorted({0, len(layers) - 1}):  # the first layer, shown at first, and the last
        b.eval(f"(() => {{ const p = {pick}; p.value = '{i}'; p.onchange(); }})()")
        want = [r for r in rows if r["layer"] == layers[i]]
        ctx = shown(b, 0, "influence", "td.context")
        assert len(ctx) == len(want) and all(close(c, r["context"], 4) for c, r in zip(ctx, want))
    b.eval(f"(() => {{ const p = {pick}; p.value = '0'; p.onchange(); }})()")


def check_click_to_ablate(b, capsys, run, text):
    label = b.eval(
        "document.querySelector('.column .grid .gcell[data-label]:not([data-label=\"\"])').dataset.label"
    )
    after(b, lambda: click(b, f'.column .grid .gcell[data-label="{label}"]'))
    wait(
        b,
        lambda: (
            b.eval("(document.querySelector('[data-panel=ablate] [data-ablated]') || {}).dataset")
            is not None
        ),
    )
    args = ["--context"] if label == "context" else ["--head", label]
    a = cli(capsys, "ablate", run, text, *args)
    got = b.eval("document.querySelector('[data-panel=ablate] [data-ablated]').dataset.ablated")
    assert got == a["ablated"]
    change = shown(b, 0, "ablate", ".loss-change")[0]
    assert close(change, a["loss_change"], 4)
    nums = shown(b, 0, "ablate", ".ablated .item .num")
    assert len(nums) == len(a["top_ablated"])
    assert all(close(s, x["prob"], 4) for s, x in zip(nums, a["top_ablated"]))
    intact = shown(b, 0, "ablate", ".intact .item .num")
    assert all(close(s, x["prob"], 4) for s, x in zip(intact, a["top_clean"]))


@pytest.mark.parametrize("name", ["gpt", "encoder", "seq2seq", "lstm", "vit", "llama"])
def test_every_panel_shows_the_clis_numbers_and_a_click_ablates(page, runs, capsys, name, tmp_path):
    b, run, text = page, runs / name, TEXTS[name]
    choose(b, f"runs/{name}")
    if name == "vit":
        after(
            b,
            lambda: b.eval(
                "(() => { const n = document.getElementById('testn'); n.value = '0'; n.oninput(); })()"
            ),
        )
        wait(b, lambda: b.eval("document.body.dataset.done") == text)
    else:
        type_text(b, text)
    assert b.eval("document.getElementById('message').hidden"), b.eval(
        "document.getElementById('message').textContent"
    )
    check_prediction(b, capsys, run, text)
    check_attention(b, capsys, run, text)
    check_walkthrough(b, capsys, run, text)
    if name not in ("lstm",):  # an LSTM has no residual stream: no similarity, no influence
        check_similarity_and_influence(b, capsys, run, text)
    else:
        assert b.eval("document.querySelector('[data-panel=similarity]')") is None
    check_click_to_ablate(b, capsys, run, text)
    assert not b.errors()
    if name == "gpt":
        shot = str(tmp_path / "serve.png")
        type_text(b, "I like to eat apples")
        b.send("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": 1150,
                                                      "deviceScaleFactor": 1, "mobile": False})  # fmt: skip
        b.eval("window.scrollTo(0, 0)")
        Path(shot).write_bytes(b.screenshot())
        b.send("Emulation.clearDeviceMetricsOverride")
        assert Path(shot).stat().st_size > 10_000


def test_bad_input_is_one_line_in_the_page_and_the_page_keeps_working(page, runs, capsys):
    b = page
    choose(b, "runs/gpt")
    n = updates(b)
    b.eval("(() => { const t = document.getElementById('text'); t.focus(); t.select(); })()")
    b.send("Input.insertText", {"text": "the ☃ bank"})
    wait(b, lambda: updates(b) > n and not b.eval("document.getElementById('message').hidden"))
    line = b.eval("document.getElementById('message').textContent")
    assert "☃" in line and "\n" not in line and "vocabulary" in line
    type_text(b, TEXTS["gpt"])
    assert b.eval("document.getElementById('message').hidden")
    check_prediction(b, capsys, runs / "gpt", TEXTS["gpt"])


def _set_file(b, path: Path) -> None:
    doc = b.send("DOM.getDocument")["root"]["nodeId"]
    node = b.send("DOM.querySelector", {"nodeId": doc, "selector": "#file"})["nodeId"]
    b.send("DOM.setFileInputFiles", {"files": [str(path)], "nodeId": node})


def test_an_image_picked_for_a_vit_and_a_file_that_is_not_one(page, runs, capsys, tmp_path):
    import numpy as np
    from PIL import Image

    b = page
    choose(b, "runs/vit")
    png = tmp_path / "digit.png"
    Image.fromarray((np.random.default_rng(0).random((8, 8)) * 255).astype("uint8")).save(png)
    n = updates(b)
    _set_file(b, png)
    wait(
        b,
        lambda: (
            updates(b) > n and (b.eval("document.body.dataset.done") or "").startswith("upload:")
        ),
    )
    check_prediction(b, capsys, runs / "vit", str(png))
    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    _set_file(b, bad)
    wait(b, lambda: not b.eval("document.getElementById('message').hidden"))
    assert "not an image" in b.eval("document.getElementById('message').textContent")


def test_two_runs_side_by_side_on_the_same_input(page, runs, capsys):
    b = page
    choose(b, "runs/gpt", "runs/llama")
    text = "the bat"
    type_text(b, text)
    assert b.eval("document.querySelectorAll('.column').length") == 2
    check_prediction(b, capsys, runs / "gpt", text, col=0)
    check_prediction(b, capsys, runs / "llama", text, col=1)
