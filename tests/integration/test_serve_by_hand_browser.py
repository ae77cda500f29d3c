"""The notes' questions in the workbench, in a real headless Chromium. By hand: the words
typed are the tokens ("I like to eat apples": a 5 x 5 matrix), with random or typed X, W_Q,
W_K, W_V and the switches; every step the panel shows is the numbers ``attnlab walk --json``
gives. What if: the selected head without its scale, its mask, at a temperature, padded,
as ``attnlab what-if --json`` gives it. Source attention: an LSTM beside a Transformer on
one source, each as ``attnlab align LSTM TRANSFORMER TEXT --words --json`` gives it."""

from __future__ import annotations

import json

import pytest

from look_helpers import run_main
from serve_helpers import build_kind, skip_without_chromium, wait

pytestmark = [pytest.mark.browser, pytest.mark.slow]
skip_without_chromium()

TEXT = "I like to eat apples"


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
        picked = b.eval("(() => { const p = document.querySelector('[data-panel=walk] .steps "
                        f"select'); if (!p) return false; p.value = '{k}'; p.onchange(); "
                        "return true; })()")  # fmt: skip
        if not picked:  # the panel is still being drawn after the last edit: poll again
            return False
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


@pytest.fixture(scope="module")
def page(tmp_path_factory, open_workbench):
    root = tmp_path_factory.mktemp("serve-notes") / "runs"
    for kind in ("gpt", "lstm", "seq2seq"):
        build_kind(kind, root)
    return open_workbench(root), root / "gpt"


def test_the_by_hand_panel_shows_the_walks_numbers(page, capsys):
    b, _ = page
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


def cells(b, where: str) -> list[float]:
    return [float(x) for x in b.eval(f"Array.from(document.querySelectorAll('[data-panel=what_if] {where} td.cell'))"
                                     ".map(e => e.textContent)")]  # fmt: skip


def test_the_what_if_panel_shows_the_clis_changes(page, capsys):
    b, run = page
    text = "the bank of the river"
    b.eval("document.querySelector('[data-panel=what_if] header').onclick()")
    b.eval("(() => { const t = document.getElementById('text'); t.focus(); t.select(); })()")
    b.send("Input.insertText", {"text": text})
    b.eval("(() => { const e = document.querySelectorAll('[data-panel=what_if] input')[0];"
           " e.value = '3'; e.onchange(); })()")  # the temperature  # fmt: skip
    rc, out, err = run_main(capsys, "what-if", str(run), text, "--layer", "0", "--head", "0",
                            "--temperature", "3", "--json")  # fmt: skip
    assert rc == 0, err
    want = json.loads(out)
    assert [c["name"] for c in want["changes"]] == ["no_scale", "no_causal_mask",
        "temperature_flatter", "temperature_sharper", "padding"]  # fmt: skip

    def near(got, rows):
        flat = [v for r in rows for v in r]
        return len(got) == len(flat) and all(abs(g - v) <= 0.005 + 1e-9 for g, v in zip(got, flat))

    wait(b, lambda: b.eval("(document.querySelector('[data-panel=what_if] .help') || {}).textContent || ''")
         .startswith(want["heading"]) and near(cells(b, ".before"), want["before"]))  # fmt: skip
    for c in want["changes"]:
        b.eval("(() => { const p = document.querySelector('[data-panel=what_if] select');"
               f" p.value = {json.dumps(c['name'])}; p.onchange(); }})()")  # fmt: skip
        assert (
            b.eval("document.querySelector('[data-panel=what_if] .after').dataset.change")
            == c["name"]
        )
        assert near(cells(b, ".after"), c["after"]), c["name"]
        assert (
            b.eval("document.querySelector('[data-panel=what_if] .finding').textContent")
            == c["finding"]
        )
    assert not b.errors()


def test_an_lstm_beside_a_transformer_shows_aligns_numbers(page, capsys):
    b, gpt = page
    root, text = gpt.parent, "bad cafe"
    b.eval("document.getElementById('run-b').value = 'runs/seq2seq';"
           "document.getElementById('run-a').value = 'runs/lstm';"
           "document.getElementById('run-a').onchange()")  # fmt: skip
    wait(b, lambda: b.eval("document.querySelectorAll('.column [data-panel=align]').length") == 2)
    b.eval(
        "document.querySelectorAll('.column [data-panel=align] header').forEach(e => e.onclick())"
    )
    b.eval("(() => { const t = document.getElementById('text'); t.focus(); t.select(); })()")
    b.send("Input.insertText", {"text": text})
    b.eval("document.querySelectorAll('.column [data-panel=align] input[type=checkbox]')"
           ".forEach(e => { e.checked = true; e.onchange(); })")  # fmt: skip
    rc, out, err = run_main(capsys, "align", str(root / "lstm"), str(root / "seq2seq"), text,
                            "--words", "--json")  # fmt: skip
    assert rc == 0, err
    models = json.loads(out)["models"]
    assert models[0]["source"] == ["bad", "cafe", "<eos>"]  # words, not characters

    def column(i: int) -> dict:
        return b.eval(f"(() => {{ const p = document.querySelectorAll('.column')[{i}]"
                      ".querySelector('[data-panel=align]');"
                      " return {output: (p.querySelector('.output') || {}).textContent || '',"
                      " cells: Array.from(p.querySelectorAll('td.cell')).map(e => +e.textContent)}; })()")  # fmt: skip

    def shows(i: int, m: dict) -> bool:
        c = column(i)
        flat = [w for s in m["steps"] for w in s["weights"]]
        return (c["output"] == m["output"] and len(c["cells"]) == len(flat)
                and all(abs(x - w) <= 0.005 + 1e-9 for x, w in zip(c["cells"], flat)))  # fmt: skip

    wait(b, lambda: shows(0, models[0]) and shows(1, models[1]))
    assert not b.errors()


def test_similarity_as_dot_products_and_as_cosines(page, capsys):
    b, run = page
    b.eval("document.getElementById('run-b').value = '';"
           "document.getElementById('run-a').value = 'runs/gpt';"
           "document.getElementById('run-a').onchange()")  # fmt: skip
    wait(
        b,
        lambda: b.eval("document.querySelectorAll('.column [data-panel=similarity]').length") == 1,
    )
    text = "the bank of the river"
    b.eval("(() => { const t = document.getElementById('text'); t.focus(); t.select(); })()")
    b.send("Input.insertText", {"text": text})
    rc, out, err = run_main(capsys, "similarity", str(run), text, "--json")
    assert rc == 0, err
    layer = json.loads(out)["layers"][0]

    def shows(key: str) -> bool:
        got = b.eval("Array.from(document.querySelectorAll('[data-panel=similarity] .before td.cell'))"
                     ".map(e => +e.textContent)")  # fmt: skip
        flat = [v for r in layer[key] for v in r]
        return len(got) == len(flat) and all(abs(g - v) <= 0.005 + 1e-9 for g, v in zip(got, flat))

    wait(b, lambda: b.eval("document.body.dataset.done") == text and shows("before"))
    b.eval("(() => { const m = document.querySelector('[data-panel=similarity] select.measure');"
           " m.value = 'dot'; m.onchange(); })()")  # fmt: skip
    assert layer["dot_before"] != layer["before"] and shows("dot_before")
    assert not b.errors()
