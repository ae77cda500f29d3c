"""How often the train path enters the run-directory package, counted as it runs.

    python benchmarks/train_walk.py                  # a language-model run: new, resumed, fine-tuned
    python benchmarks/train_walk.py --package checkpoint.py,training/rundir.py,run.py

``attnlab.training.run.train`` is called on a tiny run (a character GPT, one step) with a
profiler (``sys.setprofile``) watching every Python call from its start to the first call of
``Trainer.train_step``. An *entry* is a call whose function is defined in the package (its
files under src/attnlab, ``--package``; default ``rundir/``) whose nearest attnlab caller
(looking past torch's and the standard library's frames, such as contextlib's ``__enter__``)
is outside the package: attnlab code handing work to the run directory, callbacks included.
The package's calls to itself, and torch calling back into it, are not entries; nor are the
no-op stand-ins for torch.nn.init's initialisers that the loader installs while it builds a
model on the meta device (the model's own __init__ calls them). The script prints each entry (caller -> callee) and the counts, before the loop begins
(its first ``on_step``: the set-up) and to the first step (the loop's step-0 evaluation
writes its metrics row and checkpoint first), for a new run, its ``--resume``, a run
fine-tuned from it (``--init-from``, also with ``--snapshot-every``) and with ``--all-tasks``
a new run of every task. Nothing is timed: the count does not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
ATTNLAB = str(SRC / "attnlab") + "/"
sys.path.insert(0, str(SRC))

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40
TINY = {"n_layer": 1, "n_head": 2, "d_model": 16, "block_size": 16, "batch_size": 2,
        "max_iters": 1, "eval_interval": 1, "eval_iters": 1, "quiet": True, "threads": 1,
        "compile": False}  # fmt: skip
TASKS = {  # task -> (data, options)
    "lm": ("text", {"tokenizer": "char"}),
    "seq2seq": ("dates", {"arch": "transformer"}),
    "classify": ("lang", {}),
    "vision": ("digits", {}),
    "mlm": ("text", {"tokenizer": "char"}),
    "induction": ("repeat:min_period=4,max_period=8", {}),
}


def package_files(spec: str) -> list[str]:
    """Absolute path prefixes of the package's files (a folder ends in /)."""
    base = SRC / "attnlab"
    return [str(base / p) + ("/" if p.endswith("/") else "") for p in spec.split(",")]


def inside(filename: str, files: list[str]) -> bool:
    return any(filename.startswith(f) if f.endswith("/") else filename == f for f in files)


def walk(plan_args: dict, files: list[str]) -> tuple[list[tuple[str, str]], int]:
    """(caller, callee) of every entry into the package from train() to the first step, and
    how many of them came before the loop began (its first ``on_step``)."""
    from attnlab.training.loop import Trainer
    from attnlab.training.run import plan, train

    p = plan(plan_args)
    step_code, notify = Trainer.train_step.__code__, Trainer._notify.__code__
    entries: list[tuple[str, str]] = []
    state = {"on": True, "setup": None}

    def where(frame) -> str:
        name = frame.f_code.co_filename
        short = name.split("/src/attnlab/")[-1] if "/src/attnlab/" in name else Path(name).name
        return f"{short}:{frame.f_lineno} {frame.f_code.co_name}"

    def profile(frame, event, arg):
        if not state["on"] or event != "call":
            return
        if frame.f_code is step_code:
            state["on"] = False
            return
        is_step = frame.f_code is notify and frame.f_locals.get("event") == "on_step"
        if is_step and state["setup"] is None:
            state["setup"] = len(entries)
        if inside(frame.f_code.co_filename, files):
            caller = frame.f_back  # the nearest attnlab frame below (past torch, contextlib)
            while caller is not None and not caller.f_code.co_filename.startswith(ATTNLAB):
                caller = caller.f_back
            if (
                caller is not None
                and not inside(caller.f_code.co_filename, files)
                and (
                    frame.f_code.co_name != "<lambda>"  # a no-op initialiser (meta build), called
                )
            ):  # by the model's own __init__ while the loader builds it
                entries.append((where(caller), frame.f_code.co_qualname))

    sys.setprofile(profile)
    try:
        train(p)
    finally:
        sys.setprofile(None)
    return entries, state["setup"]


def data_for(kind: str, tmp: Path) -> str:
    if kind == "text":
        (tmp / "text.txt").write_text(TEXT, encoding="utf-8")
        return str(tmp / "text.txt")
    if kind == "lang":
        rows = [f"{'en' if i % 2 else 'es'}\t{'the bank' if i % 2 else 'el banco'} {i}"
                for i in range(40)]  # fmt: skip
        (tmp / "lang.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
        return str(tmp / "lang.tsv")
    return kind


def report(label: str, walked: tuple[list[tuple[str, str]], int]) -> None:
    entries, setup = walked
    print(f"{label}: {setup} entries before the loop begins, {len(entries)} to the first "
          f"train_step ({len(set(entries))} distinct call sites)")  # fmt: skip
    for (caller, callee), n in Counter(entries).items():
        print(f"    {n} x  {caller}  ->  {callee}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = "rundir/" if (SRC / "attnlab" / "rundir").is_dir() else (
        "checkpoint.py,training/rundir.py,run.py")  # fmt: skip
    ap.add_argument("--package", default=default,
                    help="the package's files under src/attnlab, comma separated (a folder ends "
                    "in /)")  # fmt: skip
    ap.add_argument("--all-tasks", action="store_true", help="a new run of every task too")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    files = package_files(args.package)
    print(f"package: {args.package}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        out = tmp / "run"
        lm = {
            "task": "lm",
            "data": data_for("text", tmp),
            "out": str(out),
            **TINY,
            "tokenizer": "char",
        }
        report("lm, a new run", walk(lm, files))
        report("lm, --resume", walk({**lm, "resume": True, "max_iters": 2}, files))
        fine = {**lm, "init_from": str(out), "out": str(tmp / "fine")}
        for k in ("n_layer", "n_head", "d_model", "tokenizer"):  # the source's
            fine.pop(k)
        report("lm, --init-from the run above", walk(fine, files))
        snap = {**fine, "out": str(tmp / "fine-snap"), "snapshot_every": 1}
        report("lm, --init-from with --snapshot-every", walk(snap, files))
        if args.all_tasks:
            from attnlab.tasks import task_class
            from attnlab.training.run import option_names

            for task, (data, options) in TASKS.items():
                names = option_names(task_class(task))  # the tiny sizes the task takes
                given = {"task": task, "data": data_for(data, tmp), "out": str(tmp / task),
                         **{k: v for k, v in TINY.items() if k in names or k in ("quiet",
                                                                                 "threads")},
                         **options}  # fmt: skip
                report(f"{task}, a new run", walk(given, files))


if __name__ == "__main__":
    main()
