"""A run whose weights hold NaN or infinity is refused where it is loaded, by every verb: one
line on stderr, exit 2, before any output, nothing written (issue 32, item 1). Before: predict
printed nan scores, attention a table of nan, and generate printed the prompt and then an
internal error (a sampler cannot draw from NaN probabilities)."""

from __future__ import annotations

import shutil

import pytest

from attnlab.safetensors_io import read_header

VERBS = [
    ["predict", "RUN", "First"],
    ["generate", "RUN", "First", "--max-new-tokens", "5"],
    ["eval", "RUN"],
    ["trace", "RUN", "First"],
    ["attention", "RUN", "First", "--png", "OUT/a.png"],
    ["similarity", "RUN", "First"],
    ["influence", "RUN", "First", "--csv", "OUT/i.csv"],
    ["explore", "RUN", "First", "--html", "OUT/e.html"],
    ["check", "RUN"],
    ["ablate", "RUN", "First", "--head", "0.0"],
    ["patch", "RUN", "--clean", "First", "--corrupt", "Firsu", "--target", "e"],
    ["lens", "RUN", "First"],
    ["attribute", "RUN", "First", "--method", "rollout"],
    ["heads", "RUN"],
    ["export-hf", "RUN", "OUT/hf"],
    ["train", "--data", "DATA", "--init-from", "RUN", "--out", "OUT/tuned", "--max-iters", "2"],
    ["train", "--data", "DATA", "--out", "RUN", "--max-iters", "4", "--resume"],
]


@pytest.fixture(scope="module")
def poisoned(tiny_trained_run, tmp_path_factory):
    """The tiny run with values inside model.safetensors overwritten by NaN and +inf, its
    header intact (what a disk error or a diverged write leaves)."""
    run = tmp_path_factory.mktemp("nan") / "run"
    shutil.copytree(tiny_trained_run, run)
    header = read_header(run / "model.safetensors")
    name, info = next((n, t) for n, t in header.tensors.items() if t.dtype.is_floating_point)
    assert info.dtype.itemsize == 4, name
    with open(run / "model.safetensors", "r+b") as f:
        f.seek(header.data_start + info.start)
        f.write(b"\x00\x00\xc0\x7f" * 3 + b"\x00\x00\x80\x7f")  # NaN x3, +inf (float32)
    return run


@pytest.mark.parametrize("argv", VERBS, ids=lambda a: " ".join(a[:1] + a[3:4]))
def test_every_verb_refuses_weights_that_are_not_finite(poisoned, cli, tmp_path, argv):
    data = poisoned.parent / "corpus.txt"
    data.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40)
    before = sorted(p.name for p in poisoned.iterdir())
    args = [a.replace("RUN", str(poisoned)).replace("OUT", str(tmp_path))
            .replace("DATA", str(data)) for a in argv]  # fmt: skip
    r = cli(*args, *([] if argv[0] == "export-hf" else ["--threads", "1"]))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnlab: error:"), r.stderr
    assert "not finite" in lines[0] and "model.safetensors" in lines[0]
    assert r.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing written
    assert sorted(p.name for p in poisoned.iterdir()) == before


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_nonfinite_counts_every_bad_value_across_chunks(dtype):
    """The check reads a tensor in chunks (small masks, no second copy of the weights): a bad
    value in any chunk, the last partial one included, is counted once, and integer tensors
    are skipped."""
    import torch

    from attnlab.safetensors_io import nonfinite

    chunk = 1 << 16
    w = torch.zeros(3 * chunk + 17, dtype=getattr(torch, dtype))
    w[[0, chunk - 1, chunk, 2 * chunk + 5, 3 * chunk + 16]] = torch.tensor(
        [float("nan"), float("inf"), -float("inf"), float("nan"), float("inf")], dtype=w.dtype
    )
    tensors = {"ids": torch.arange(5), "fine": torch.ones(7), "w": w}
    assert nonfinite(tensors, chunk) == ("w", 5)
    assert nonfinite(tensors) == ("w", 5)  # the default chunk
    assert nonfinite({"fine": torch.ones(chunk + 1)}, chunk) is None
