"""Real sizes on a laptop: a random-weights model of Qwen2.5-0.5B's shape, imported and used.

    PYTHONPATH=src python benchmarks/real_size.py [--pairs 3] [--threads 1] [--json out.json]
        [--only rss,generate,record,patch] [--dir DIR]
    PYTHONPATH=src python benchmarks/real_size.py --quick      # a small shape: the code path

The model is built by transformers from a config (no download): Qwen2ForCausalLM with 24
layers, width 896, 14 query heads and 2 K/V heads, feed-forward 4864, a vocabulary of 151,936,
tied embeddings, rope base 1e6 -- Qwen2.5-0.5B's shape -- with random weights (speed and
memory do not depend on them). It is saved twice, in bfloat16 and in float32 (safetensors),
with a byte-level BPE tokenizer.json trained here on the built-in corpus (its vocabulary is
smaller than the model's, as import-hf allows). Every figure comes from its own process:

    rss            peak resident memory (the process's maximum RSS, read with os.wait4) of
                   `attnlab import-hf DIR --out RUN` and of the first `attnlab predict RUN
                   TEXT`, over the bytes of DIR's weights; beside it, the same beyond the peak
                   of `python -c "import torch"` (the interpreter and torch: ~0.22 GiB)
    generate       128 new tokens, greedy, KV cache, one prompt, the same thread count: attnlab
                   (`load_run` + `generate_ids`) against transformers (`from_pretrained` +
                   `generate`, sdpa attention) on the float32 directory. Each process loads,
                   generates one warm-up token (every weight read once: attnlab maps them
                   lazily), then the timed 128. The processes alternate attnlab / transformers
                   for ``--pairs`` pairs; the ratio is the median over pairs of attnlab's time
                   over transformers' in that pair (< 1: attnlab faster); also by the process's
                   CPU time over the 128 tokens, which other jobs on the machine inflate less
    record         one forward over 128 tokens recording every named activation
                   (``attnlab.hooks.record``) against the plain forward, alternated, medians
    patch          `Run.patch(..., by="head")`: one patched forward per layer x head; the
                   time per cell
Peak RSS counts the pages of memory-mapped weights a process touched, so a run that maps its
weights and one that reads them count alike.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()

QWEN25_05B = dict(num_hidden_layers=24, hidden_size=896, num_attention_heads=14,
                  num_key_value_heads=2, intermediate_size=4864, vocab_size=151936)  # fmt: skip
QUICK = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=1024)  # fmt: skip
COMMON = dict(tie_word_embeddings=True, max_position_embeddings=32768, rms_norm_eps=1e-6,
              hidden_act="silu", use_sliding_window=False, bos_token_id=None, eos_token_id=None,
              pad_token_id=None)  # fmt: skip
ROPE_BASE = 1e6
NEW_TOKENS = 128
PROMPT = "First Citizen: Before we proceed any further, hear me speak."
CLEAN = "The king and the queen sat on the"  # the corrupt input: another word for king
SIDES = ("attnlab", "transformers")
PARTS = ("rss", "generate", "record", "patch")


# ---------------------------------------------------------------------------------------------
# Workers: each runs in a process of its own (python real_size.py --worker NAME ...)
# ---------------------------------------------------------------------------------------------


def build(out: Path, shape: dict, tokenizer_vocab: int) -> None:
    """Write out/bf16 and out/fp32: config.json, model.safetensors, tokenizer.json."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from attnlab.data.corpus import load_text

    config = transformers.Qwen2Config(
        **shape, **COMMON, rope_parameters={"rope_type": "default", "rope_theta": ROPE_BASE}
    )
    with torch.device("meta"):
        model = transformers.Qwen2ForCausalLM(config)
    model.to_empty(device="cpu")  # no init pass over 494M parameters, then a fast one here
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
        model.model.rotary_emb.__init__(config)  # its inv_freq was left empty on the meta device
    model.tie_weights()
    model.eval()

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=tokenizer_vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    text = load_text("shakespeare")[:200_000]
    tok.train_from_iterator([text[i : i + 1000] for i in range(0, len(text), 1000)], trainer)
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        d = out / name
        model.to(dtype).save_pretrained(d, safe_serialization=True)
        tok.save(str(d / "tokenizer.json"))
        model.tie_weights()


def _threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def worker_generate(side: str, path: str, threads: int, new_tokens: int) -> dict:
    """Load (attnlab: a run; transformers: the HF directory) and generate twice, timed."""
    t0 = time.perf_counter()
    import torch

    _threads(threads)
    if side == "attnlab":
        from attnlab.generation import SamplingConfig, generate_ids
        from attnlab.run import load_run

        run = load_run(path)
        ids = torch.tensor([run.tokenizer.encode(PROMPT)])

        def gen(n):
            with torch.inference_mode():
                return generate_ids(run.model, ids, SamplingConfig(n, temperature=0.0))[0].tolist()
    else:
        import transformers
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
        ids = torch.tensor([tok.encode(PROMPT).ids])

        def gen(n):
            with torch.inference_mode():
                out = model.generate(ids, max_new_tokens=n, min_new_tokens=n,
                                     do_sample=False, eos_token_id=None, pad_token_id=0)  # fmt: skip
            return out[0, ids.size(1) :].tolist()

    t1 = time.perf_counter()
    gen(1)  # a warm-up token: every weight read once (attnlab maps them lazily)
    t2, c2 = time.perf_counter(), time.process_time()
    tokens = gen(new_tokens)
    t3, c3 = time.perf_counter(), time.process_time()
    assert len(tokens) == new_tokens, len(tokens)
    return {"load_s": t1 - t0, "warmup_s": t2 - t1, "generate_s": t3 - t2,
            "generate_cpu_s": c3 - c2, "tokens": tokens}  # fmt: skip


def worker_record(run_path: str, threads: int, n_tokens: int, repeats: int) -> dict:
    """Plain forward vs recording every named activation, alternated, over n_tokens tokens."""
    import torch

    from attnlab.hooks import hook_points, record
    from attnlab.run import load_run

    _threads(threads)
    run = load_run(run_path)
    model = run.model
    vocab = run.tokenizer.vocab_size
    ids = torch.randint(0, vocab, (1, n_tokens), generator=torch.Generator().manual_seed(0))
    plain, rec = [], []
    n_points = len(hook_points(model))
    with torch.inference_mode():
        model(ids)  # warm-up: reads the mapped weights
        with record(model) as cache:
            model(ids)
        size = sum(t.numel() * t.element_size() for t in cache.values())
        del cache
        for _ in range(repeats):
            t = time.perf_counter()
            model(ids)
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            with record(model) as cache:
                model(ids)
            rec.append(time.perf_counter() - t)
            del cache
    return {"plain_s": plain, "record_s": rec, "hook_points": n_points, "recorded_bytes": size}


def worker_patch(run_path: str, threads: int) -> dict:
    import torch

    from attnlab.data.corpus import load_text
    from attnlab.run import load_run

    _threads(threads)
    run = load_run(run_path)
    tok = run.tokenizer
    target = tok.decode(tok.encode(" throne")[:1])
    n = len(tok.encode(CLEAN))
    words = dict.fromkeys(re.findall(r"[a-z]+", load_text("shakespeare")[:50_000]))
    corrupt = next(c for w in words if w != "king"
                   and len(tok.encode(c := CLEAN.replace(" king", " " + w))) == n)  # fmt: skip
    t0 = time.perf_counter()
    with torch.inference_mode(False):
        run.patch(CLEAN, corrupt, target, by="head")
    dt = time.perf_counter() - t0
    c = run.model.config
    cells = c.n_layer * c.n_head
    return {"patch_s": dt, "cells": cells, "per_cell_s": dt / cells}


WORKERS = {"generate": worker_generate, "record": worker_record, "patch": worker_patch}


# ---------------------------------------------------------------------------------------------
# The parent: processes, peak RSS, the table
# ---------------------------------------------------------------------------------------------


def _env(threads: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = str(threads)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def measured(cmd: list[str], threads: int) -> tuple[float, int, str]:
    """(wall seconds, 0, stdout) of one whole process; a failure stops us."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=_env(threads), capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return time.perf_counter() - t0, 0, p.stdout


def measured_rss(cmd: list[str], threads: int) -> tuple[float, int, str]:
    """(wall, peak RSS bytes, stdout) of ``cmd``, run under a wrapper that waits for it with
    os.wait4 and prints its rusage: the child's own peak, not the wrapper's."""
    wrapper = (
        "import os,sys,json,time,subprocess;"
        "t=time.perf_counter();p=subprocess.Popen(sys.argv[1:],stdout=subprocess.PIPE);"
        "out=p.stdout.read();_,st,ru=os.wait4(p.pid,0);p.returncode=os.waitstatus_to_exitcode(st);"
        "sys.stderr.write(json.dumps({'rc':p.returncode,'wall':time.perf_counter()-t,"
        "'maxrss_kib':ru.ru_maxrss})+'\\n');sys.stdout.write(out.decode())"
    )
    p = subprocess.run([sys.executable, "-c", wrapper, *cmd], env=_env(threads),
                       capture_output=True, text=True)  # fmt: skip
    info = json.loads(p.stderr.strip().splitlines()[-1]) if p.stderr.strip() else {"rc": -1}
    if p.returncode or info["rc"]:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return info["wall"], info["maxrss_kib"] * 1024, p.stdout


def _worker(name: str, *args) -> list[str]:
    return [sys.executable, str(SCRIPT), "--worker", name, *map(str, args)]


def _attnlab(*args) -> list[str]:
    return [sys.executable, "-m", "attnlab", *map(str, args)]


def weights_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.glob("*.safetensors"))


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small shape (the code path only)")
    ap.add_argument("--pairs", type=int, default=3, help="attnlab/transformers generate pairs")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads on both sides (default 1: on a shared machine a second "
        "thread waits for a core other jobs hold)",
    )
    ap.add_argument("--repeats", type=int, default=5, help="record: alternated forward pairs")
    ap.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument(
        "--only",
        default=",".join(PARTS),
        help=f"comma-separated parts to measure (default: all of {','.join(PARTS)})",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args(argv)
    if args.worker:
        print(json.dumps(WORKERS[args.worker](*_typed(rest))))
        return {}
    shape = QUICK if args.quick else QWEN25_05B
    new_tokens = 16 if args.quick else NEW_TOKENS
    with tempfile.TemporaryDirectory(prefix="real_size_", dir=args.dir) as tmp:
        return _measure(Path(tmp), shape, new_tokens, args)


def _typed(rest: list[str]) -> list:
    return [int(a) if a.isdigit() else a for a in rest]


def _measure(tmp: Path, shape: dict, new_tokens: int, args) -> dict:
    T = args.threads
    print(f"building a random {shape} Qwen2 model (bf16 and fp32) in {tmp}", flush=True)
    code = f"import sys; sys.path.insert(0, {str(SCRIPT.parent)!r}); import real_size as r; " \
           f"r.build(r.Path({str(tmp)!r}), {shape!r}, {512 if args.quick else 4096})"  # fmt: skip
    wall, _, _ = measured([sys.executable, "-c", code], T)
    print(f"  built in {wall:.1f} s", flush=True)
    res: dict = {"shape": shape, "threads": T, "new_tokens": new_tokens, "cpu_count": os.cpu_count(),
                 "loadavg_start": os.getloadavg()}  # fmt: skip
    parts = set(args.only.split(","))
    if "rss" in parts:
        res["rss"] = _rss(tmp, T)
    for name in ("bf16", "fp32"):  # the runs the parts below read
        if not (tmp / f"run_{name}").is_dir():
            measured(_attnlab("import-hf", tmp / name, "--out", tmp / f"run_{name}"), T)
    if "generate" in parts:  # the float32 directory and its run
        res["generate"] = _generate(tmp, T, new_tokens, args.pairs)
    if "record" in parts:
        _, _, out = measured(_worker("record", tmp / "run_fp32", T, new_tokens, args.repeats), T)
        r = json.loads(out.strip().splitlines()[-1])
        r["ratio"] = statistics.median(x / y for x, y in zip(r["record_s"], r["plain_s"]))
        res["record"] = r
    if "patch" in parts:
        _, _, out = measured(_worker("patch", tmp / "run_fp32", T), T)
        res["patch"] = json.loads(out.strip().splitlines()[-1])
    res["loadavg_end"] = os.getloadavg()
    _table(res)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    return res


def _rss(tmp: Path, T: int) -> dict:
    """Peak RSS of import-hf and the first predict, bf16 and fp32, and of `import torch`."""
    _, torch_rss, _ = measured_rss([sys.executable, "-c", "import torch"], T)
    rss = {"import_torch_peak_rss": torch_rss}
    print(f"  python -c 'import torch': {_gib(torch_rss)}", flush=True)
    for name in ("bf16", "fp32"):
        d, run = tmp / name, tmp / f"run_{name}"
        wb = weights_bytes(d)
        wall_i, peak_i, _ = measured_rss(_attnlab("import-hf", d, "--out", run), T)
        wall_p, peak_p, _ = measured_rss(_attnlab("predict", run, PROMPT, "--threads", T), T)
        rss[name] = {"weights_bytes": wb, "run_weights_bytes": weights_bytes(run),
                     "import_peak_rss": peak_i, "import_ratio": peak_i / wb, "import_s": wall_i,
                     "predict_peak_rss": peak_p, "predict_ratio": peak_p / wb,
                     "predict_s": wall_p,
                     "import_beyond_torch": (peak_i - torch_rss) / wb,
                     "predict_beyond_torch": (peak_p - torch_rss) / wb}  # fmt: skip
        print(f"  {name}: import {_gib(peak_i)} ({peak_i / wb:.2f}x of {_gib(wb)}), "
              f"predict {_gib(peak_p)} ({peak_p / wb:.2f}x)", flush=True)  # fmt: skip
    return rss


def _generate(tmp: Path, T: int, new_tokens: int, pairs: int) -> dict:
    gens: dict[str, list] = {"attnlab": [], "transformers": []}
    for i in range(pairs):
        order = ("attnlab", "transformers") if i % 2 == 0 else ("transformers", "attnlab")
        for side in order:
            path = tmp / ("run_fp32" if side == "attnlab" else "fp32")
            wall, peak, out = measured_rss(_worker("generate", side, path, T, new_tokens), T)
            r = json.loads(out.strip().splitlines()[-1])
            r.update(wall_s=wall, peak_rss=peak)
            gens[side].append(r)
            print(f"  pair {i + 1} {side}: load {r['load_s']:.1f} s, {new_tokens} tokens "
                  f"{r['generate_s']:.2f} s", flush=True)  # fmt: skip
    a, h = gens["attnlab"], gens["transformers"]
    same = sum(x == y for x, y in zip(a[0]["tokens"], h[0]["tokens"], strict=True))
    return {
        "attnlab": [{k: v for k, v in r.items() if k != "tokens"} for r in a],
        "transformers": [{k: v for k, v in r.items() if k != "tokens"} for r in h],
        "ratio": statistics.median(x["generate_s"] / y["generate_s"] for x, y in zip(a, h)),
        "ratio_wall": statistics.median(x["wall_s"] / y["wall_s"] for x, y in zip(a, h)),
        "ratio_cpu": statistics.median(
            x["generate_cpu_s"] / y["generate_cpu_s"] for x, y in zip(a, h)
        ),  # fmt: skip
        "same_tokens": same,
    }


def _table(res: dict) -> None:
    rows = [("figure", "measured", "target")]
    n = res["new_tokens"]
    if "rss" in res:
        torch_rss = res["rss"]["import_torch_peak_rss"]
        for name in ("bf16", "fp32"):
            d = res["rss"][name]
            for verb, key in (("import-hf", "import"), ("first predict", "predict")):
                rows.append((f"{verb} peak RSS ({name}, {_gib(d['weights_bytes'])} of weights)",
                             f"{_gib(d[key + '_peak_rss'])}: {d[key + '_ratio']:.2f}x "
                             f"({d[key + '_beyond_torch']:.2f}x beyond `import torch`)",
                             "<= 1.25x"))  # fmt: skip
        rows.append(("`python -c 'import torch'` peak RSS", _gib(torch_rss), ""))
    if "generate" in res:
        g = res["generate"]
        med = {s: statistics.median(x["generate_s"] for x in g[s]) for s in g if s in SIDES}
        rows.append((f"generate {n} tokens, fp32 (median of {len(g['attnlab'])} pairs)",
                     f"attnlab {med['attnlab']:.1f} s, transformers {med['transformers']:.1f} s:"
                     f" ratio {g['ratio']:.2f}", "<= 1.00"))  # fmt: skip
        rows.append(("generate, CPU time (both threads)", f"ratio {g['ratio_cpu']:.2f}", ""))
        rows.append(("generate, whole process", f"ratio {g['ratio_wall']:.2f}", ""))
        rows.append(("greedy tokens equal to transformers'", f"{g['same_tokens']} of {n}", ""))
    if "record" in res:
        r = res["record"]
        rows.append((f"record all {r['hook_points']} points, {n} tokens",
                     f"{statistics.median(r['record_s']):.2f} s vs plain "
                     f"{statistics.median(r['plain_s']):.2f} s: {r['ratio']:.2f}x", "<= 1.5x"))  # fmt: skip
    if "patch" in res:
        p = res["patch"]
        rows.append((f"patch --by head ({p['cells']} cells)",
                     f"{p['patch_s']:.1f} s, {1000 * p['per_cell_s']:.0f} ms a cell", ""))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    print(f"threads {res['threads']}, {res['cpu_count']} cores, load average "
          f"{res['loadavg_start'][0]:.1f} at start, {res['loadavg_end'][0]:.1f} at end")  # fmt: skip


if __name__ == "__main__":
    main()
