"""benchmarks/real_size.py --quick: the real-size benchmark's whole code path on a small shape
(build a random Qwen2 in bf16 and fp32, import-hf, predict, generate against transformers,
record, patch by head), so the script that gives the README's figures keeps working."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_real_size_quick(tmp_path):
    out = tmp_path / "figures.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "real_size.py"), "--quick", "--pairs", "1",
           "--repeats", "1", "--threads", "1", "--dir", str(tmp_path), "--json", str(out)]  # fmt: skip
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=590)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    for name in ("bf16", "fp32"):
        rss = res["rss"][name]
        assert rss["import_peak_rss"] > 0 and rss["predict_peak_rss"] > 0
        # a half-precision directory imports as a run of the same size, not a float32 one
        assert rss["run_weights_bytes"] <= rss["weights_bytes"] * 1.01
    gen = res["generate"]
    assert len(gen["attnlab"]) == len(gen["transformers"]) == 1
    assert gen["same_tokens"] == res["new_tokens"]  # greedy: the same tokens as transformers
    assert res["record"]["hook_points"] > 0 and res["record"]["ratio"] > 0
    assert res["patch"]["cells"] == 2 * 4 and res["patch"]["per_cell_s"] > 0
    assert "patch --by head" in p.stdout
    assert not list(tmp_path.glob("real_size_*"))  # its models are removed afterwards
