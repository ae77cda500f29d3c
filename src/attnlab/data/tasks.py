"""Sequence-to-sequence data: generated tasks and a user's parallel corpus.

Generated tasks (each a pure function of its parameters and a seed, split into train/val/test
with no source shared between splits):
    copy      "qhdxa"                  -> "qhdxa"
    reverse   "qhdxa"                  -> "axdhq"
    sort      "qhdxa"                  -> "adhqx"
    addition  "4821+97"                -> "4918"
    dates     "saturday 21 nov 2026"   -> "2026-11-21"   (many formats; test DATES never seen
                                                           in training, not just test strings)
A spec names a task and optionally overrides its parameters: ``reverse:min_len=5,max_len=40``,
``dates:n_train=30000``, ``addition:digits=3``.

A parallel corpus is a UTF-8 TSV file, one ``source<TAB>target`` pair per line; a seeded shuffle
holds out a validation and a test split. ``recipe`` records what rebuilds a dataset exactly (for
a TSV file: its path and SHA-256, so a changed file is noticed rather than silently re-split).
"""

from __future__ import annotations

import calendar
import datetime as dt
import hashlib
import random
import string
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnlab.data.corpus import DataError
from attnlab.tokenizers import BOS, PAD, PairTokenizer

Pair = tuple[str, str]


@dataclass
class Seq2SeqData:
    """Train/val/test pairs and the recipe that rebuilds them."""

    name: str
    train: list[Pair]
    val: list[Pair]
    test: list[Pair]
    recipe: dict
    alphabet: tuple[str, str] | None = None  # generated tasks: every source and target character
    info: dict = field(default_factory=dict)

    def split(self, name: str) -> list[Pair]:
        if name not in ("train", "val", "test"):
            raise DataError(f"unknown split {name!r}; choose train, val or test")
        return getattr(self, name)


# ---------------------------------------------------------------------------------------------
# Generated tasks
# ---------------------------------------------------------------------------------------------

LETTERS = string.ascii_lowercase

DEFAULTS: dict[str, dict] = {
    "copy": dict(min_len=5, max_len=20, symbols=26),
    "reverse": dict(min_len=5, max_len=20, symbols=26),
    "sort": dict(min_len=5, max_len=20, symbols=26),
    "addition": dict(digits=4),
    "dates": dict(start=1900, end=2099),
}
COMMON = dict(n_train=20000, n_val=500, n_test=1000)
TASKS = tuple(DEFAULTS)


def parse_spec(spec: str) -> tuple[str, dict]:
    """``"reverse:min_len=5,max_len=40"`` -> ("reverse", {"min_len": 5, "max_len": 40})."""
    name, _, rest = spec.partition(":")
    if name not in DEFAULTS:
        raise DataError(f"unknown task {name!r}; choose {', '.join(TASKS)} or give a .tsv file")
    params = {**COMMON, **DEFAULTS[name]}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in params:
            raise DataError(f"{name}: unknown parameter {key!r}; known: {', '.join(params)}")
        try:
            params[key] = int(value)
        except ValueError:
            raise DataError(f"{name}: {key} must be an integer, got {value!r}") from None
    _check_params(name, params)
    return name, params


def _check_params(name: str, p: dict) -> None:
    for k in ("n_train", "n_val", "n_test"):
        if p[k] < (1 if k == "n_train" else 0):
            raise DataError(f"{name}: {k} must be positive, got {p[k]}")
    if "min_len" in p and not 1 <= p["min_len"] <= p["max_len"]:
        raise DataError(f"{name}: need 1 <= min_len <= max_len, got {p['min_len']}, {p['max_len']}")
    if "symbols" in p and not 2 <= p["symbols"] <= 26:
        raise DataError(f"{name}: symbols must be in 2..26, got {p['symbols']}")
    if "digits" in p and not 1 <= p["digits"] <= 12:
        raise DataError(f"{name}: digits must be in 1..12, got {p['digits']}")
    if "start" in p and not 1 <= p["start"] <= p["end"] <= 9999:
        raise DataError(f"{name}: need 1 <= start <= end <= 9999 (years)")


def _unique_sources(make, n: int, rng: random.Random, name: str) -> list[str]:
    """Draw ``n`` distinct sources with ``make(rng)``; fail clearly if the space is too small."""
    seen: dict[str, None] = {}
    tries = 0
    while len(seen) < n:
        seen.setdefault(make(rng), None)
        tries += 1
        if tries > 20 * n + 1000:
            raise DataError(f"{name}: cannot draw {n} distinct examples; ask for fewer or longer")
    return list(seen)


def _string_task(name: str, p: dict, rng: random.Random) -> tuple[list[str], callable]:
    symbols = LETTERS[: p["symbols"]]

    def make(r):
        return "".join(r.choice(symbols) for _ in range(r.randint(p["min_len"], p["max_len"])))

    target = {
        "copy": lambda s: s,
        "reverse": lambda s: s[::-1],
        "sort": lambda s: "".join(sorted(s)),
    }
    total = p["n_train"] + p["n_val"] + p["n_test"]
    return _unique_sources(make, total, rng, name), target[name]


def _addition(p: dict, rng: random.Random) -> tuple[list[str], callable]:
    top = 10 ** p["digits"] - 1

    def make(r):  # the number of digits is uniform, so short numbers are not drowned out
        a, b = (r.randint(0, 10 ** r.randint(1, p["digits"]) - 1) for _ in range(2))
        return f"{a}+{b}"

    total = p["n_train"] + p["n_val"] + p["n_test"]
    if total > (top + 1) ** 2 // 2:
        raise DataError(f"addition: only {(top + 1) ** 2} sums with {p['digits']} digits")
    return _unique_sources(make, total, rng, "addition"), lambda s: str(sum(map(int, s.split("+"))))


def generate(spec: str, seed: int = 1337) -> Seq2SeqData:
    """Build a generated task from its spec; the same spec and seed give the same data."""
    name, p = parse_spec(spec)
    rng = random.Random(f"{name}:{seed}")
    if name == "dates":
        train, val, test = _dates(p, rng)
        src_chars, tgt_chars = DATE_SOURCE_CHARS, "0123456789-"
    else:
        sources, fn = _addition(p, rng) if name == "addition" else _string_task(name, p, rng)
        pairs = [(s, fn(s)) for s in sources]
        n_test, n_val = p["n_test"], p["n_val"]
        test, val, train = pairs[:n_test], pairs[n_test : n_test + n_val], pairs[n_test + n_val :]
        if name == "addition":
            src_chars, tgt_chars = "0123456789+", "0123456789"
        else:
            src_chars = tgt_chars = LETTERS[: p["symbols"]]
    recipe = {"task": name, "params": p, "seed": seed}
    return Seq2SeqData(name, train, val, test, recipe, alphabet=(src_chars, tgt_chars))


# -- dates ------------------------------------------------------------------------------------

MONTHS = [calendar.month_name[i].lower() for i in range(1, 13)]
MONTH_ABBR = [calendar.month_abbr[i].lower() for i in range(1, 13)]
WEEKDAYS = [calendar.day_name[i].lower() for i in range(7)]  # monday first, as date.weekday()
WEEKDAY_ABBR = [calendar.day_abbr[i].lower() for i in range(7)]
DATE_SOURCE_CHARS = string.ascii_letters + string.digits + " ,./"


def ordinal(n: int) -> str:
    """1 -> "1st", 2 -> "2nd", 11 -> "11th", 22 -> "22nd"."""
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# Word formats: {w} weekday (maybe empty), {d} day, {o} ordinal day, {m} month word, {y} year.
WORD_FORMATS = (
    "{w}{d} {m} {y}",  # saturday 21 nov 2026
    "{w}{m} {d}, {y}",  # saturday, november 21, 2026
    "{w}{d} {m}, {y}",
    "{w}the {o} of {m} {y}",
    "{w}{m} {o}, {y}",
    "{w}{o} {m} {y}",
    "{y} {m} {d}",
)
# Numeric formats, each with ONE day/month order so that no source is ambiguous:
# dots are day.month.year (European), slashes month/day/year (US), a leading year is y/m/d.
NUMERIC_FORMATS = (
    "{dd}.{mm}.{y}",
    "{d}.{mn}.{y}",
    "{mm}/{dd}/{y}",
    "{mn}/{d}/{y}",
    "{y}/{mm}/{dd}",
)


def format_date(date: dt.date, rng: random.Random) -> str:
    """One human-readable rendering of ``date``, drawn from many formats and cases."""
    if rng.random() < 0.3:
        fmt = rng.choice(NUMERIC_FORMATS)
        return fmt.format(d=date.day, dd=f"{date.day:02d}", mn=date.month, mm=f"{date.month:02d}",
                          y=date.year)  # fmt: skip
    fmt = rng.choice(WORD_FORMATS)
    wd = date.weekday()
    weekday = rng.choice(["", "", WEEKDAYS[wd] + " ", WEEKDAYS[wd] + ", ", WEEKDAY_ABBR[wd] + " "])
    month = rng.choice([MONTHS, MONTH_ABBR])[date.month - 1]
    text = fmt.format(w=weekday, d=date.day, o=ordinal(date.day), m=month, y=date.year)
    case = rng.random()
    return string.capwords(text) if case < 0.25 else text.upper() if case < 0.35 else text


def _dates(p: dict, rng: random.Random) -> tuple[list[Pair], list[Pair], list[Pair]]:
    first, last = dt.date(p["start"], 1, 1), dt.date(p["end"], 12, 31)
    days = list(range((last - first).days + 1))
    need = p["n_train"] + p["n_val"] + p["n_test"]
    if need > len(days):
        raise DataError(f"dates: {need} examples asked, but only {len(days)} days in the range")
    chosen = rng.sample(days, need)  # distinct dates: the splits share no date at all
    pairs = []
    for n in chosen:
        date = first + dt.timedelta(days=n)
        pairs.append((format_date(date, rng), date.isoformat()))
    n_test, n_val = p["n_test"], p["n_val"]
    return pairs[n_test + n_val :], pairs[n_test : n_test + n_val], pairs[:n_test]


# ---------------------------------------------------------------------------------------------
# A user's parallel corpus (TSV)
# ---------------------------------------------------------------------------------------------


def read_tsv(path: str | Path, encoding: str = "utf-8") -> list[Pair]:
    """``source<TAB>target`` lines -> pairs; blank lines skipped; anything else is a DataError."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    pairs = []
    with open(path, encoding=encoding) as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
                raise DataError(f"{path}:{lineno}: expected 'source<TAB>target', got {line[:60]!r}")
            pairs.append((parts[0].strip(), parts[1].strip()))
    if len(pairs) < 3:
        raise DataError(f"{path}: {len(pairs)} pairs; need at least 3 (train, val and test)")
    return pairs


def sha256_file(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_tsv(path: str | Path, seed: int = 1337, val_fraction: float = 0.1,
             test_fraction: float = 0.1, encoding: str = "utf-8") -> Seq2SeqData:  # fmt: skip
    """A parallel corpus split by a seeded shuffle into train/val/test (by distinct source)."""
    if not (0 < val_fraction < 0.5 and 0 < test_fraction < 0.5):
        raise DataError("val and test fractions must be in (0, 0.5)")
    pairs = read_tsv(path, encoding)
    sources = sorted({s for s, _ in pairs})  # split by distinct source: no source in two splits
    random.Random(f"tsv:{seed}").shuffle(sources)
    n_test = max(1, round(test_fraction * len(sources)))
    n_val = max(1, round(val_fraction * len(sources)))
    if n_test + n_val >= len(sources):
        raise DataError(
            f"{path}: too few distinct sources ({len(sources)}) to hold out val and test"
        )
    where = {s: "test" for s in sources[:n_test]}
    where.update({s: "val" for s in sources[n_test : n_test + n_val]})
    splits: dict[str, list[Pair]] = {"train": [], "val": [], "test": []}
    for s, t in pairs:
        splits[where.get(s, "train")].append((s, t))
    recipe = {"task": "tsv", "path": str(Path(path).resolve()), "sha256": sha256_file(path),
              "seed": seed, "val_fraction": val_fraction, "test_fraction": test_fraction,
              "encoding": encoding}  # fmt: skip
    return Seq2SeqData(Path(path).stem, splits["train"], splits["val"], splits["test"], recipe)


def load_data(spec: str, seed: int = 1337, val_fraction: float = 0.1, encoding: str = "utf-8"):
    """A generated task's spec, or the path of a TSV file."""
    name = spec.partition(":")[0]
    if name in DEFAULTS:
        return generate(spec, seed)
    if Path(spec).is_file() or spec.endswith((".tsv", ".txt")):
        return load_tsv(spec, seed, val_fraction, val_fraction, encoding)
    raise DataError(f"unknown seq2seq data {spec!r}; choose {', '.join(TASKS)} or a .tsv file")


def rebuild(recipe: dict) -> Seq2SeqData:
    """The dataset a run was trained on, from the recipe stored in its config.json."""
    task = recipe.get("task")
    if task in DEFAULTS:
        params = ",".join(f"{k}={v}" for k, v in recipe["params"].items())
        return generate(f"{task}:{params}", recipe["seed"])
    if task == "tsv":
        path = recipe["path"]
        if not Path(path).is_file():
            raise DataError(f"{path}: the run's TSV file is gone; cannot rebuild its test split")
        if sha256_file(path) != recipe["sha256"]:
            raise DataError(f"{path}: changed since training (SHA-256 differs); the test split "
                            "cannot be rebuilt")  # fmt: skip
        return load_tsv(path, recipe["seed"], recipe["val_fraction"], recipe["test_fraction"],
                        recipe.get("encoding", "utf-8"))  # fmt: skip
    raise DataError(f"cannot rebuild data of unknown task {task!r}")


# ---------------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------------


def encode_pairs(tokenizer: PairTokenizer, pairs: list[Pair]) -> list[tuple[list[int], list[int]]]:
    """Pairs -> (source ids + <eos>, target ids + <eos>), <eos> being the tokenizer's end id."""
    end = tokenizer.EOS  # attnlab's pair tokenizers: EOS; T5's (SharedPairTokenizer): </s>
    return [(tokenizer.encode_source(s), tokenizer.encode_target(t) + [end]) for s, t in pairs]


def collate(
    examples: list[tuple[list[int], list[int]]], start: int = BOS
) -> tuple[torch.Tensor, ...]:
    """-> src (B, S), tgt_in (B, T) = <bos> y, tgt_out (B, T) = y <eos>; <pad> = 0 fills.
    ``start`` is the decoder's first input (<bos>; T5's is <pad>)."""
    B = len(examples)
    S = max(len(s) for s, _ in examples)
    T = max(len(t) for _, t in examples)
    src = torch.full((B, S), PAD, dtype=torch.long)
    tgt_in = torch.full((B, T), PAD, dtype=torch.long)
    tgt_out = torch.full((B, T), PAD, dtype=torch.long)
    for i, (s, t) in enumerate(examples):
        src[i, : len(s)] = torch.tensor(s)
        tgt_out[i, : len(t)] = torch.tensor(t)
        tgt_in[i, 0] = start
        tgt_in[i, 1 : len(t)] = torch.tensor(t[:-1])
    return src, tgt_in, tgt_out
