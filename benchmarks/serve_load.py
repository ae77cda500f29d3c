"""attnlab serve under load: 8 clients at once on 2 runs, 200 requests each, over real HTTP.

    PYTHONPATH=src python benchmarks/serve_load.py [--clients 8] [--requests 200]
        [--views predict,explorer] [--memory-gb G] [--json out.json]

The workbench runs as a user starts it (`python -m attnlab serve DIR --port 0`, its own process,
default threads) on a directory of two runs: the baby GPT (GPT preset "baby", random weights)
and a smaller GPT (2 layers, 2 heads, width 64). Each client picks a run (clients alternate),
and sends its own texts (each client's texts differ from every other client's), one request at
a time, as fast as answers come. It checks:

- no error: every answer is 200 and no view was refused;
- no answer crosses clients: each answer names the run and the input its request sent, and
  the prediction is for that input; the same input on the same run always gets the same answer;
- memory bounded: each run loaded once (the workbench's own count), and the server process's
  peak resident memory (VmHWM) against its weights;

and reports the latency of a request, p50 and p95 (and the load average: the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def build(root: Path) -> str:
    import torch

    from attnlab.data.corpus import load_text
    from attnlab.models.gpt import GPT, PRESETS, GPTConfig
    from attnlab.rundir import save_model
    from attnlab.tokenizers import CharTokenizer

    text = load_text("shakespeare")
    tok = CharTokenizer.from_text(text)
    torch.manual_seed(0)
    for name, size in (("baby", PRESETS["baby"]),
                       ("small", dict(n_layer=2, n_head=2, d_model=64, block_size=64))):  # fmt: skip
        save_model(root / name, GPT(GPTConfig(vocab_size=tok.vocab_size, dropout=0.0, **size)), tok)
    return text


def rss_peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--views", default="predict,explorer")
    ap.add_argument("--memory-gb", type=float, default=None)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    views = args.views.split(",")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with tempfile.TemporaryDirectory(prefix="attnlab-serve-load-") as tmp:
        root = Path(tmp) / "runs"
        corpus = build(root)
        weights = sum((root / n / "model.safetensors").stat().st_size for n in ("baby", "small"))
        cmd = [sys.executable, "-m", "attnlab", "serve", str(root), "--port", "0"]
        if args.memory_gb:
            cmd += ["--memory-gb", str(args.memory_gb)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
        address = proc.stdout.readline().split(": ", 1)[1].strip()
        base, token = address.split("/?")[0], address.split("token=")[1]
        headers = {"X-Attnlab-Token": token, "Content-Type": "application/json"}

        def ask(body: dict) -> tuple[int, dict, float]:
            req = urllib.request.Request(base + "/api/views", json.dumps(body).encode(), headers)
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(req, timeout=600) as r:
                    return r.status, json.loads(r.read()), time.perf_counter() - t0
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read() or b"{}"), time.perf_counter() - t0

        latencies, errors, crossed, answers = [], [], [], {}
        lock = threading.Lock()

        def client(i: int) -> None:
            run = "runs/baby" if i % 2 == 0 else "runs/small"
            for k in range(args.requests):
                a = (1000 * i + 37 * k) % (len(corpus) - 64)
                text = f"{i}:" + corpus[a : a + 40]  # the client's own texts
                status, d, dt = ask({"run": run, "input": text, "views": views})
                with lock:
                    latencies.append(dt * 1000)
                    if status != 200 or any(
                        "serve_error" in v for v in d.get("views", {}).values()
                    ):
                        errors.append((i, k, status, str(d)[:200]))
                        continue
                    pred = d["views"]["predict"]["predictions"][0]
                    if d["run"] != run or d["input"] != text or pred["input"] != text:
                        crossed.append((i, k))
                    key = (run, text)
                    if answers.setdefault(key, pred) != pred:
                        crossed.append((i, k, "differs"))

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        listing = json.loads(urllib.request.urlopen(urllib.request.Request(
            base + "/api/runs", headers=headers), timeout=60).read())  # fmt: skip
        peak = rss_peak_kib(proc.pid)
        proc.terminate()
        proc.wait(timeout=30)
        log = proc.stderr.read()
    load = os.getloadavg()
    out = {
        "clients": args.clients, "requests_each": args.requests, "views": views,
        "requests": len(latencies), "errors": len(errors), "crossed": len(crossed),
        "p50_ms": statistics.median(latencies), "p95_ms": sorted(latencies)[int(0.95 * (len(latencies) - 1))],
        "max_ms": max(latencies), "wall_s": wall, "loaded_runs": listing["loaded"],
        "loads": listing["loads"], "evictions": listing["evictions"], "budget_mib": listing["budget"] / 2**20,
        "server_peak_rss_mib": peak / 1024, "weights_mib": weights / 2**20,
        "load_average": load, "cores": os.cpu_count(),
    }  # fmt: skip
    print(json.dumps(out, indent=2))
    if errors:
        print("first errors:", errors[:3], log[-2000:], file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    sys.exit(1 if errors or crossed else 0)


if __name__ == "__main__":
    main()
