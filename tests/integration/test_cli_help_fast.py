"""`attnlab --help`, a missing or mistyped verb and a mistyped option before the verb answer from
the verb table alone: torch is never imported, and the answer takes a fraction of the CPU time
that importing torch alone does (issue 32, item 9)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cli_helpers import SRC

PROBE = """
import json, resource, sys, time
t0 = time.process_time()
from attnlab.cli import main
code = None
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code
cpu = time.process_time() - t0
print(json.dumps({"torch": "torch" in sys.modules, "code": code, "cpu": cpu}), file=sys.stderr)
"""


def probe(*args: str) -> tuple[dict, str, str]:
    r = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                       env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}, timeout=120)  # fmt: skip
    *said, last = r.stderr.strip().splitlines()
    return json.loads(last), r.stdout, "\n".join(said)


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["--help"], 0, "train a model on a text"),
        ([], 2, "give a verb"),
        (["trian"], 2, "did you mean 'train'?"),
        (["--max-iters", "3"], 2, "unknown option '--max-iters'"),
    ],
)
def test_help_and_top_level_errors_never_import_torch(args, code, words):
    facts, out, err = probe(*args)
    assert facts["code"] == code, (out, err)
    assert not facts["torch"], "torch was imported"
    assert facts["cpu"] < 0.5, facts  # importing torch alone takes ~1.5 s of CPU
    assert words in (out if code == 0 else err)
    if code:
        assert len(err.splitlines()) == 1 and not out


def test_the_verb_table_is_what_the_verbs_register():
    """VERBS (the fast list) names every verb with the help its module gives it, in order."""
    import argparse

    from attnlab.cli import VERBS, build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    registered = {a.dest: a.help for a in sub._choices_actions}
    assert registered == {verb: help for verb, (_, help) in VERBS.items()}
    assert list(registered) == list(VERBS)
    for verb, (area, _) in VERBS.items():  # building one verb imports only its module
        assert verb in dict(next(a for a in build_parser(verb)._actions
                                 if isinstance(a, argparse._SubParsersAction)).choices), area  # fmt: skip


def test_the_fast_help_lists_every_verb_within_80_columns():
    from attnlab.cli import VERBS

    _, out, _ = probe("--help")
    for verb in VERBS:
        assert f"    {verb}" in out
    assert all(len(line) <= 80 and line == line.rstrip() for line in out.splitlines())
