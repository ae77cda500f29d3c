"""attnlab serve over real HTTP (a workbench in a thread, requests over a socket): what it
serves is the CLI's --json for the same input; its safety, as a notebook server keeps it;
bad input as one line with the server still serving; each run loaded once, within a memory
budget; a run that training is writing, read as it lands; the CLI's options and the demo's
last line. The browser tests are test_serve_browser.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from attnlab.serve import start
from attnlab.serve.app import MAX_IMAGE_SIDE
from look_helpers import make_run, run_main
from serve_helpers import base, call

SRC = Path(__file__).resolve().parents[2] / "src"
TEXT = "I like to eat apples"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two GPT runs in one directory, and a third whose weights are damaged."""
    root = tmp_path_factory.mktemp("serve") / "runs"
    make_run(root / "a", steps=20)
    make_run(root / "b", steps=5, n_head=4)
    make_run(root / "broken", steps=1)
    w = root / "broken" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:100])  # a header that promises more than the file holds
    return root


@pytest.fixture(scope="module")
def server(runs):
    srv = start(runs)
    yield srv
    srv.stop()


def views(server, run, text, names, **params):
    return call(base(server), "/api/views", {"run": run, "input": text, "views": names,
                                              "params": params}, token=server.settings.token)  # fmt: skip


def cli_json(capsys, *args) -> dict:
    rc, out, err = run_main(capsys, *args, "--json")
    assert rc == 0, err
    return json.loads(out)


def test_every_view_is_the_clis_json_for_the_same_input(server, runs, capsys):
    status, d = views(server, "runs/a", TEXT, ["predict", "trace", "similarity", "influence",
                                               "lens", "dla", "ablate"], ablate="1.0", layer=1, head=0)  # fmt: skip
    assert status == 200, d
    v, run = d["views"], runs / "a"
    assert v["predict"] == cli_json(capsys, "predict", run, TEXT)
    assert v["trace"] == cli_json(capsys, "trace", run, TEXT, "--layer", "1", "--head", "0")
    assert v["similarity"] == cli_json(capsys, "similarity", run, TEXT)
    assert v["influence"] == cli_json(capsys, "influence", run, TEXT)
    assert v["lens"] == cli_json(capsys, "lens", run, TEXT)
    top = v["predict"]["predictions"][0]["next"][0]["token"]
    assert v["dla"] == cli_json(capsys, "attribute", run, TEXT, "--method", "dla", "--target", top)
    assert v["ablate"] == cli_json(capsys, "ablate", run, TEXT, "--head", "1.0")
    _, m = views(server, "runs/a", TEXT, ["ablate"], ablate="0.1", mode="mean")
    assert m["views"]["ablate"] == cli_json(capsys, "ablate", run, TEXT, "--head", "0.1", "--mode",
                                            "mean")  # fmt: skip


def test_sliced_views_are_the_clis_json_cut_to_what_the_page_shows(server, runs, capsys):
    """trace_step/trace_window and similarity_layer: one step (one layer) whole, cut from the
    CLI's --json with its numbers unchanged; the rest named only; bad values refused in one line."""
    run = runs / "a"
    t = cli_json(capsys, "trace", run, TEXT, "--layer", "1", "--head", "0")
    k = next(i for i, s in enumerate(t["steps"]) if isinstance((s.get("values") or [0])[0], list)
             and len(s["values"]) > 3 and len(s["values"][0]) > 3)  # fmt: skip
    _, d = views(server, "runs/a", TEXT, ["trace", "similarity"], layer=1, head=0, trace_step=k,
                 trace_window=3, similarity_layer=1)  # fmt: skip
    got, want = d["views"]["trace"], t["steps"][k]
    assert got["step"] == k and len(got["steps"]) == len(t["steps"])
    assert [s["title"] for s in got["steps"]] == [s["title"] for s in t["steps"]]
    assert all("values" not in s for i, s in enumerate(got["steps"]) if i != k)
    assert got["steps"][k]["values"] == [r[:3] for r in want["values"][:3]]
    assert got["steps"][k]["values_shape"] == [len(want["values"]), len(want["values"][0])]
    assert {**got["steps"][k], "values": want["values"]} == {**want, "values_shape":
                                                             got["steps"][k]["values_shape"]}  # fmt: skip
    assert {x: got[x] for x in ("about", "tokens", "ids", "layer", "head")} == {
        x: t[x] for x in ("about", "tokens", "ids", "layer", "head")}  # fmt: skip
    sim, want_sim = d["views"]["similarity"], cli_json(capsys, "similarity", run, TEXT)
    assert sim["layer"] == 1 and sim["layers"][1] == want_sim["layers"][1]
    assert [x["mean_after"] for x in sim["layers"]] == [x["mean_after"] for x in want_sim["layers"]]
    assert "before" not in sim["layers"][0]
    keep = ("prefix", "label", "mean_before", "mean_after", "mean_dot_before", "mean_dot_after")
    assert sim["layers"][0] == {x: want_sim["layers"][0][x] for x in keep}
    assert {**d["views"]["trace"], "steps": [], "step": 0} == {**t, "steps": [], "step": 0}
    assert len(json.dumps(sim)) < len(json.dumps(want_sim))
    _, bad = views(server, "runs/a", TEXT, ["trace", "similarity"], trace_step=999,
                   similarity_layer="x")  # fmt: skip
    assert bad["views"]["trace"]["serve_error"].startswith("trace_step must be a whole number in")
    assert (
        bad["views"]["similarity"]["serve_error"]
        == "similarity_layer must be a whole number, got 'x'"
    )


def test_the_explorer_view_is_the_pages_data_that_explore_writes(server, runs, capsys, tmp_path):
    from attnlab.inspect.explorer import explorer_data
    from attnlab.run import load_run

    _, d = views(server, "runs/a", TEXT, ["explorer"])
    ex = d["views"]["explorer"]
    run = load_run(runs / "a")
    mine = explorer_data(run.record(TEXT), run.model, f"attnlab explorer: {TEXT}", 128, 0,
                         run.tokenizer)  # fmt: skip
    # with the input and run the neuron view's `attnlab why` command names (the page's own
    # `explore` names the directory it was given)
    assert mine["why"] is None and ex["why"]["text"] == TEXT
    assert Path(ex["why"]["run"]).resolve() == (runs / "a").resolve()
    rest = {k: v for k, v in mine.items() if k != "why"}
    assert {k: ex[k] for k in rest} == json.loads(json.dumps(rest))
    m = ex["maps"][-1]  # a head as the command names it: MODULE.headH
    split = run.why(TEXT, f"{m['module']}.head1", m["T"] - 1, 0)
    assert split["head"] == "1.1"
    # each map's heads named as `ablate --head` takes them
    assert ex["heads"]["blocks.1.attn.weights"] == ["1.0", "1.1"]


def test_the_explorer_view_sends_the_data_without_writing_the_page(runs, monkeypatch):
    """The page embeds the data as JSON (megabytes for a 24-layer model): the workbench,
    which sends the data only, never writes it; the CLI's page is written when read."""
    from attnlab.inspect import explorer
    from attnlab.run import load_run
    from attnlab.serve.views import VIEWS

    run = load_run(runs / "a")
    written = []
    page = explorer.page
    monkeypatch.setattr(explorer, "page", lambda *a: written.append(a) or page(*a))
    d = json.loads(VIEWS["explorer"].fn(run, {}, {}, TEXT))
    assert d["maps"] and written == []
    html = run.explore(TEXT).html
    assert len(written) == 1 and "attnlabExplorer" in html


def test_requests_without_the_token_are_refused(server):
    u, token = base(server), server.settings.token
    assert call(u, "/api/runs")[0] == 403
    other = ("y" if token[0] == "x" else "x") + token[1:]  # one character off (a random token
    assert call(u, "/api/runs", token=other)[0] == 403  # began with "x" 1 time in 62 here)
    assert call(u, f"/?token={token}x")[0] == 403
    assert call(u, "/api/runs", token=token)[0] == 200
    import urllib.request

    with urllib.request.urlopen(f"{u}/?token={token}", timeout=30) as r:
        page = r.read()
    assert b"attnlab workbench" in page and len(page) < 1_000_000
    for needle in (b"http://", b"https://"):  # every asset inline: nothing fetched from elsewhere
        assert needle not in page.replace(b"http://www.w3.org/2000/svg", b"")


def test_a_foreign_host_or_origin_is_refused(server):
    u, token = base(server), server.settings.token
    port = server.settings.port
    assert call(u, "/api/runs", token=token, headers={"Host": f"evil.example:{port}"})[0] == 403
    assert call(u, "/api/runs", token=token, headers={"Host": "127.0.0.1:1"})[0] == 403
    status, d = call(u, "/api/runs", token=token, headers={"Origin": "http://evil.example"})
    assert status == 403 and "Origin" in d["error"]
    assert (
        call(u, "/api/runs", token=token, headers={"Origin": f"http://127.0.0.1:{port}"})[0] == 200
    )
    assert call(u, "/api/runs", token=token, headers={"Host": f"localhost:{port}"})[0] == 200


def test_only_the_runs_it_was_started_with_can_be_opened(server, runs, tmp_path):
    make_run(tmp_path / "outside", steps=1)
    for name in ("../outside", str(tmp_path / "outside"), "runs/../../outside", "runs/nope", ""):
        status, d = views(server, name, TEXT, ["predict"])
        assert status == 404 and "\n" not in d["error"], (name, d)
    status, d = views(server, "runs/../runs/a", TEXT, ["predict"])
    assert status == 404 and "path is refused" in d["error"]
    _, listing = call(base(server), "/api/runs", token=server.settings.token)
    assert sorted(r["name"] for r in listing["runs"]) == ["runs/a", "runs/b", "runs/broken"]


def test_sizes_are_bounded(server):
    u, token = base(server), server.settings.token
    status, d = views(server, "runs/a", "x" * (server.settings.max_text + 1), ["predict"])
    assert status == 400 and "at most 2,000" in d["error"]
    # refused on its Content-Length, before the body is read
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", server.settings.port, timeout=30)
    c.putrequest("POST", "/api/views")
    c.putheader("X-Attnlab-Token", token)
    c.putheader("Content-Length", str(server.settings.max_body + 1))
    c.endheaders()
    assert c.getresponse().status == 413
    c.close()
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (MAX_IMAGE_SIDE + 1, 2)).save(buf, format="PNG")
    status, d = call(u, "/api/image", raw=buf.getvalue(), token=token,
                     headers={"Content-Type": "image/png"})  # fmt: skip
    assert status == 400 and "pixels" in d["error"]


def test_bad_input_is_one_line_and_the_server_keeps_serving(server):
    u, token = base(server), server.settings.token
    status, d = views(server, "runs/a", "I like ☃", ["predict", "trace"])
    lines = {v["serve_error"] for v in d["views"].values()}
    assert status == 200 and len(lines) == 1 and "☃" in lines.pop()
    status, d = views(server, "runs/a", TEXT, ["ablate"], ablate="7.0")
    assert "serve_error" in d["views"]["ablate"] and "\n" not in d["views"]["ablate"]["serve_error"]
    status, d = call(u, "/api/image", raw=b"not an image at all", token=token,
                     headers={"Content-Type": "image/png"})  # fmt: skip
    assert status == 400 and "not an image" in d["error"]
    status, d = views(server, "runs/a", TEXT, ["no-such-view"])
    assert status == 400 and "unknown view" in d["error"]
    assert views(server, "runs/a", TEXT, ["predict"])[0] == 200  # still serving


def test_a_run_that_fails_to_load_says_why_once(server):
    wb = server.workbench
    said = len(wb.said)
    for _ in range(3):
        status, d = views(server, "runs/broken", TEXT, ["predict"])
        assert status == 404 and d["error"].startswith("broken: ")
    assert len(wb.said) == said + 1  # logged once
    _, listing = call(base(server), "/api/runs", token=server.settings.token)
    row = next(r for r in listing["runs"] if r["name"] == "runs/broken")
    assert row["error"] and "\n" not in row["error"]


def test_each_run_is_loaded_once_and_answers_never_cross(server):
    wb, token, u = server.workbench, server.settings.token, base(server)
    before = wb.pool.loads
    texts = ["I like", "to eat", "apples", "pears"]
    errors, answers = [], []

    def client(i):
        run = "runs/a" if i % 2 else "runs/b"
        for k in range(6):
            text = texts[(i + k) % 4]
            status, d = call(u, "/api/views", {"run": run, "input": text, "views": ["predict"]},
                             token=token)  # fmt: skip
            if status != 200:
                errors.append(d)
            else:
                answers.append((run, text, d["run"], d["views"]["predict"]["predictions"][0]))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(r == got_run and p["input"] == text for r, text, got_run, p in answers)
    first = {}
    for r, text, _, p in answers:  # the same input on the same run: the same answer
        assert first.setdefault((r, text), p) == p
    assert wb.pool.loads - before <= 2


def test_a_memory_budget_lets_go_of_the_least_recently_used_run(runs):
    a = (runs / "a" / "model.safetensors").stat().st_size
    srv = start(runs, memory_gb=1.5 * a / 1024**3)  # room for one run at a time
    try:
        for run in ("runs/a", "runs/b", "runs/a"):
            assert views(srv, run, TEXT, ["predict"])[0] == 200
            assert len(srv.workbench.pool.loaded()) == 1
        assert srv.workbench.pool.evictions == 2 and srv.workbench.pool.loads == 3
        statuses = []  # clients at once on both runs: the budget still holds
        threads = [threading.Thread(target=lambda r=r: statuses.extend(
            views(srv, r, TEXT, ["predict"])[0] for _ in range(3))) for r in ["runs/a", "runs/b"] * 2]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert statuses == [200] * 12 and len(srv.workbench.pool.loaded()) == 1
    finally:
        srv.stop()


def test_a_notebook_serves_a_loaded_run_inline(runs):
    from attnlab.run import load_run

    run = load_run(runs / "a")
    srv = start(run)
    try:
        html = srv._repr_html_()
        assert "<iframe" in html and f"token={srv.settings.token}" in html
        status, d = views(srv, "a", TEXT, ["predict"])
        assert status == 200 and srv.workbench.pool.loads == 0  # the Run object itself
    finally:
        srv.stop()


def _serve(*args, wait_for: str = "attnlab workbench: "):
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "attnlab", "serve", *map(str, args)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    line = p.stdout.readline()
    if line.strip() == wait_for.strip():  # into a pipe (80 columns) the address has its own line
        line = f"{wait_for.strip()} {p.stdout.readline().strip()}\n"
    return p, line


def test_the_cli_listens_on_127_0_0_1_and_warns_for_another_host(runs):
    p, line = _serve(runs / "a", "--port", "0")
    try:
        assert line.startswith("attnlab workbench: http://127.0.0.1:") and "?token=" in line
        url = line.split(": ", 1)[1].strip()
        status, _ = call(url.split("/?")[0], "/api/runs", token=url.split("token=")[1])
        assert status == 200
    finally:
        p.terminate()
        p.wait(timeout=30)
    p, line = _serve(runs / "a", "--port", "0", "--host", "0.0.0.0")
    try:
        assert line.startswith("attnlab workbench: http://127.0.0.1:")
    finally:
        p.terminate()
        p.wait(timeout=30)
    assert "warning: listening on 0.0.0.0" in p.stderr.read()


@pytest.mark.parametrize("args, says", [
    (["--port", "70000"], "--port must be at most 65535"),
    (["--memory-gb", "0"], "--memory-gb must be positive"),
    (["--max-text", "0"], "--max-text must be positive"),
    ([], "name a run directory"),
    (["/nonexistent/run"], "/nonexistent/run: no such run directory"),
])  # fmt: skip
def test_bad_options_exit_2_with_one_line(args, says, capsys):
    rc, out, err = run_main(capsys, "serve", *args)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and says in err, err


def test_the_demo_ends_by_printing_the_serve_command():
    import inspect

    from attnlab import demo

    src = inspect.getsource(demo.main).strip().splitlines()
    assert "serve_hint(RUN)" in src[-1]
    assert demo.serve_hint(Path("runs/demo")).endswith(" serve runs/demo")


@pytest.mark.slow
def test_a_run_being_trained_is_watched_without_disturbing_it(tmp_path):
    """``attnlab train`` writes the run while the workbench reads it: loss rows and snapshots
    appear, and training finishes as it would alone (the workbench never takes its lock)."""
    out = tmp_path / "runs" / "induction"
    out.parent.mkdir()
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    train = subprocess.Popen(
        [sys.executable, "-m", "attnlab", "train", "--task", "induction", "--out", str(out),
         "--n-layer", "2", "--n-head", "2", "--d-model", "16", "--max-iters", "120",
         "--snapshot-every", "20", "--eval-interval", "20", "--log-interval", "5",
         "--batch-size", "8"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    srv = None
    try:
        deadline = time.monotonic() + 240
        while not (out / "config.json").is_file() and time.monotonic() < deadline:
            time.sleep(0.5)
        srv = start(out.parent)
        seen = []
        while train.poll() is None and time.monotonic() < deadline:
            status, d = call(base(srv), "/api/learn?run=runs/induction", token=srv.settings.token)
            if status == 200:
                seen.append((len(d["loss"]), len(d["timeline"]["steps"]) if d["timeline"] else 0))
                if (out / "model.safetensors").is_file():
                    assert views(srv, "runs/induction", "ab", ["explorer"])[0] in (200, 404)
            time.sleep(0.5)
        assert train.wait(timeout=60) == 0, train.stderr.read()
        status, d = call(base(srv), "/api/learn?run=runs/induction", token=srv.settings.token)
        assert status == 200 and d["loss"] and d["timeline"]["steps"][-1] == 120
        from attnlab.inspect.step_explorer import step_data

        assert d["maps"] == json.loads(json.dumps(step_data(out)))  # explore --steps's maps
        assert d["maps"]["probes"]["repeat"]["frames"][-1]["step"] == 120
        assert len({s for s in seen}) >= 2, seen  # it changed while we watched
    finally:
        if train.poll() is None:
            train.kill()
        if srv is not None:
            srv.stop()


def test_generation_is_the_clis_and_gives_each_new_tokens_attention(server, runs, capsys):
    _, d = views(server, "runs/a", "I like", ["generate"], max_new_tokens=60, seed=3)
    g = d["views"]["generate"]
    cli_out = cli_json(capsys, "generate", runs / "a", "--prompt", "I like", "--max-new-tokens",
                       "60", "--seed", "3")  # fmt: skip
    assert g["samples"] == cli_out["samples"]
    assert len(g["steps"]) == 48 and g["offset"] == 66 - 48  # past the block: its last 48 tokens
    for s in g["steps"]:
        rows = s["attention"]["blocks.0.attn.weights"]
        assert all(abs(sum(r) - 1) < 1e-3 for r in rows)


def test_an_image_model_never_reads_a_path_typed_into_the_page(tmp_path):
    from serve_helpers import build_kind

    build_kind("vit", tmp_path)
    srv = start(tmp_path / "vit")
    try:
        for params in ({}, {"corrupt": "/etc/hostname", "target": "1"}):
            status, d = views(srv, "vit", "/etc/hostname" if not params else "test:0",
                              ["patch" if params else "predict"], **params)  # fmt: skip
            assert status == 400 and "a path on the server is not read" in d["error"], d
        assert views(srv, "vit", "test:0", ["predict"])[0] == 200
    finally:
        srv.stop()
