"""attnlab serve's speed, over real HTTP: how long after an edit every visible panel is updated.

    PYTHONPATH=src python benchmarks/serve_speed.py                    # the baby GPT, 64 tokens
    PYTHONPATH=src python benchmarks/serve_speed.py --model 0.5b       # Qwen2.5-0.5B's shape
    PYTHONPATH=src python benchmarks/serve_speed.py --browser          # also in Chromium

The workbench runs as a user starts it (`python -m attnlab serve RUN --port 0`, its own
process, default threads). A client makes ``--edits`` edits of a 64-token text (one character
changed each time, as typing does) and, for each, asks for the views of the panels the page
shows open (prediction, attention, walkthrough, similarity, influence: one request, with the
page's params: the walkthrough's shown step, the similarity's shown layer), timing the whole
round trip over the socket, the JSON read, and counting its bytes. With ``--browser`` the same
edits are typed into the page in headless Chromium, and the page's own clock gives the time
from the edit to every open panel drawn (document.body.dataset.ms: "drawn") and to the next
frame after it, laid out and painted (dataset.painted: "painted"), the median split of that
time (the wait for the answer, reading it, JSON.parse, each panel's drawing), and the CPU time
Chromium's processes spent per edit ("page CPU": what load moves least). Also the first page
load's bytes. The load average at the start and the end is printed beside the figures.

The models have random weights (speed does not depend on them): the baby GPT is GPT preset
"baby" (4 layers, 4 heads, width 128, block 64) with a character vocabulary of the built-in
corpus; the 0.5B shape is built by benchmarks/real_size.py (transformers, from a config, no
download) and imported with `attnlab import-hf` (float32).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VISIBLE = ["predict", "explorer", "trace", "similarity", "influence"]  # the panels open at first
# what the page sends with them: the walkthrough's first step, its 24 x 24 numbers, the
# similarity panel's first layer (a server before these params answers every step and layer)
PARAMS = {"trace_step": 0, "trace_window": 24, "similarity_layer": 0}


def build_baby(out: Path) -> tuple[Path, str]:
    import torch

    from attnlab.data.corpus import load_text
    from attnlab.models.gpt import GPT, PRESETS, GPTConfig
    from attnlab.rundir import save_model
    from attnlab.tokenizers import CharTokenizer

    text = load_text("shakespeare")
    tok = CharTokenizer.from_text(text)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, dropout=0.0, **PRESETS["baby"])).eval()
    save_model(out, model, tok)
    start = text.find("ROMEO")
    return out, text[max(0, start) : max(0, start) + 64].replace("\n", " ")  # one line: a text box


def build_half_b(out: Path) -> tuple[Path, str]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import real_size

    hf = out.parent / "qwen-hf"
    real_size.build(hf, real_size.QWEN25_05B, 2000)
    run = out
    cmd = [sys.executable, "-m", "attnlab", "import-hf", str(hf / "fp32"), "--out", str(run)]
    subprocess.run(cmd, check=True, env=_env(), stdout=subprocess.DEVNULL)
    from attnlab.run import load_run

    r = load_run(run)
    text = "First Citizen: Before we proceed any further, hear me speak. All: Speak, speak. " * 3
    ids = r.tokenizer.encode(text)[:64]
    return run, r.tokenizer.decode(ids)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def serve(run: Path):
    p = subprocess.Popen([sys.executable, "-m", "attnlab", "serve", str(run), "--port", "0"],
                         env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    line = p.stdout.readline()
    if line.strip() == "attnlab workbench:":  # into a pipe the address wraps onto its own line
        line += p.stdout.readline()
    if not line.startswith("attnlab workbench:") or "http" not in line:
        p.kill()
        raise SystemExit(f"serve did not start: {line}{p.stderr.read()}")
    return p, line.split(":", 1)[1].strip()


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used: what an edit costs, whatever the load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and all its descendants (Chromium's browser, renderer and
    other processes: what drawing an edit costs the browser, whatever the load)."""
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            total += cpu_s(p)
            for t in os.listdir(f"/proc/{p}/task"):
                todo += [int(x) for x in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
        except OSError:  # it ended meanwhile
            pass
    return total


def post(url: str, token: str, body: dict) -> tuple[float, dict, int]:
    req = urllib.request.Request(url + "/api/views", data=json.dumps(body).encode(),
                                 headers={"X-Attnlab-Token": token,
                                          "Content-Type": "application/json"})  # fmt: skip
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        raw = r.read()
        d = json.loads(raw)
    return time.perf_counter() - t0, d, len(raw)


def edits(text: str, n: int, alphabet: str) -> list[str]:
    """n texts, each the one before with one character changed (a different position each time)."""
    out, cur = [], list(text)
    for i in range(n):
        k = (7 * i + 3) % len(cur)
        cur[k] = (
            alphabet[(alphabet.index(cur[k]) + 1) % len(alphabet)]
            if cur[k] in alphabet
            else alphabet[0]
        )
        out.append("".join(cur))
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def measure(name: str, run: Path, text: str, n: int, browser: bool) -> dict:
    proc, address = serve(run)
    base, token = address.split("/?")[0], address.split("token=")[1]
    try:
        with urllib.request.urlopen(address, timeout=60) as r:
            page_bytes = len(r.read())
        alphabet = "abcdefghijklmnopqrstuvwxyz "
        name_ = run.name
        texts = edits(text, n + 3, alphabet)  # each one new: none is answered from a cache
        for t in texts[:3]:  # warm-up: the run loaded, first calls made
            post(base, token, {"run": name_, "input": t, "views": VISIBLE, "params": PARAMS})
        times, server, cpu, sizes = [], [], [], []
        for t in texts[3:]:
            c0 = cpu_s(proc.pid)
            body = {"run": name_, "input": t, "views": VISIBLE, "params": PARAMS}
            dt, d, size = post(base, token, body)
            sizes.append(size)
            cpu.append(1000 * (cpu_s(proc.pid) - c0))
            bad = [k for k, v in d["views"].items() if "serve_error" in v]
            if bad:
                raise SystemExit(f"{name}: views refused: {bad}: {d['views'][bad[0]]}")
            times.append(dt * 1000)
            server.append(d["ms"])
        out = {"model": name, "tokens": len(text), "edits": n, "page_bytes": page_bytes,
               "bytes_per_edit": statistics.median(sizes),
               "view_bytes": {k: len(json.dumps(v)) for k, v in d["views"].items()},
               "http_ms": {"p50": pct(times, 0.5), "p95": pct(times, 0.95), "max": max(times)},
               "server_cpu_ms": {"p50": pct(cpu, 0.5), "p95": pct(cpu, 0.95)},
               "view_ms_p50": {k: statistics.median(s[k] for s in server) for k in VISIBLE}}  # fmt: skip
        if browser:
            out["browser_ms"] = in_browser(address, text, n, alphabet)
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# resolves once the page has drawn the input WANT in every column and painted it
PAINTED = """new Promise((ok) => {
  const d = () => document.body.dataset;
  const now = () => d().done === WANT && d().painted !== undefined
    && !attnlab.columns().some((c) => c.busy);
  if (now()) return ok(1);
  document.addEventListener("attnlab-painted", function f() {
    if (now()) { document.removeEventListener("attnlab-painted", f); ok(1); }
  });
})"""


def in_browser(address: str, text: str, n: int, alphabet: str) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from cdp import Browser

    with Browser(timeout=600) as b:
        b.open(address)

        def wait_done(t):  # the page says when it has drawn and painted the edit (a promise)
            js = PAINTED.replace("WANT", json.dumps(t))
            b.eval(js)
            d = b.eval("JSON.stringify(document.body.dataset)")
            return json.loads(d)

        ms, painted, parts, cpu = [], [], [], []
        for i, t in enumerate(edits(text, n + 3, alphabet)):
            b.eval(
                "(() => { const e = document.getElementById('text'); e.focus(); e.select(); })()"
            )
            b.eval("delete document.body.dataset.painted")
            c0 = tree_cpu_s(b.proc.pid)
            b.send("Input.insertText", {"text": t})
            d = wait_done(t)
            if i >= 3:
                cpu.append(1000 * (tree_cpu_s(b.proc.pid) - c0))
                ms.append(float(d["ms"]))
                painted.append(float(d["painted"]))
                parts.append(json.loads(d["timing"])[0])
    # where the time went (the page's own clock, median over the edits): the wait for the
    # answer's headers (the server's work and the socket), reading its body, JSON.parse, and
    # each panel's drawing
    split = {k: statistics.median(p["fetch"][k] for p in parts) for k in ("wait", "read", "parse")}
    split["draw"] = {
        k: statistics.median(p["draw"].get(k, 0) for p in parts) for k in parts[0]["draw"]
    }
    return {"p50": pct(ms, 0.5), "p95": pct(ms, 0.95), "max": max(ms),
            "painted": {"p50": pct(painted, 0.5), "p95": pct(painted, 0.95), "max": max(painted)},
            "chromium_cpu_ms": {"p50": pct(cpu, 0.5), "p95": pct(cpu, 0.95)},
            "split_ms_p50": split}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("baby", "0.5b", "both"), default="baby")
    ap.add_argument("--edits", type=int, default=60)
    ap.add_argument("--browser", action="store_true", help="also time the page in Chromium")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args()
    rows = []
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="attnlab-serve-bench-") as tmp:
        for name in ("baby", "0.5b") if args.model == "both" else (args.model,):
            d = Path(tmp) / name
            run, text = (build_baby if name == "baby" else build_half_b)(d)
            rows.append(measure(name, run, text, args.edits, args.browser))
            print(json.dumps(rows[-1]), flush=True)
    load = os.getloadavg()
    print(f"\nload average at the start: {load0[0]:.2f}, at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on "
          f"{os.cpu_count()} cores")  # fmt: skip
    print(f"{'model':>6} {'page KiB':>9} {'KiB/edit':>9} {'HTTP p50':>9} {'p95':>6} "
          f"{'server CPU':>10} {'drawn p50':>10} {'p95':>6} {'painted p50':>12} {'p95':>6} "
          f"{'page CPU':>9}")  # fmt: skip
    nan = {"p50": float("nan"), "p95": float("nan")}
    for r in rows:
        b = r.get("browser_ms") or {}
        p, c = b.get("painted", nan), b.get("chromium_cpu_ms", nan)
        print(f"{r['model']:>6} {r['page_bytes'] / 1024:>9.1f} {r['bytes_per_edit'] / 1024:>9.1f} "
              f"{r['http_ms']['p50']:>7.0f}ms {r['http_ms']['p95']:>4.0f}ms "
              f"{r['server_cpu_ms']['p50']:>8.0f}ms {b.get('p50', float('nan')):>8.0f}ms "
              f"{b.get('p95', float('nan')):>4.0f}ms {p['p50']:>10.0f}ms {p['p95']:>4.0f}ms "
              f"{c['p50']:>7.0f}ms")  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": rows, "load": load, "load_start": load0}, indent=2)
        )


if __name__ == "__main__":
    main()
