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


def test_the_fast_listing_is_the_whole_parsers():
    """The verb list answered from the declarations (Verb.help) is what the whole parser,
    every verb's options built, prints; and building one verb builds only its options."""
    from attnlab.cli import build_parser, registered, verb_list_parser, verbs

    assert verb_list_parser().format_help() == build_parser().format_help()
    for name in registered():
        assert list(verbs(build_parser(name))) == [name]


def test_the_fast_help_lists_every_verb_within_80_columns():
    from attnlab.cli import registered

    _, out, _ = probe("--help")
    for verb in registered():
        assert f"    {verb}" in out
    assert all(len(line) <= 80 and line == line.rstrip() for line in out.splitlines())


def test_help_shows_every_default_a_number_has():
    """`trace --help` showed no default for --layer and --head: a default of 0 compared equal
    to False, which the formatter skips (a switch off by default). Issue 32 item 5."""
    import argparse

    from attnlab.cli import build_parser, verbs

    for name, parser in verbs(build_parser()).items():
        fmt = parser._get_formatter()
        for a in parser._actions:
            if not a.option_strings or a.help is None or a.required:
                continue
            if any(a.default is x for x in (None, False, argparse.SUPPRESS)):
                continue
            shown = fmt._get_help_string(a) % {"default": a.default}
            assert "default" in shown.lower(), (name, a.option_strings, shown)
    trace = " ".join(verbs(build_parser())["trace"].format_help().split())
    assert "layer to open up (default: 0)" in trace and "head to open up (default: 0)" in trace


def test_a_help_line_is_a_whole_sentence():
    """patch --help stopped mid-sentence: "--target TOKEN  the token whose logit"."""
    from attnlab.cli import build_parser, verbs

    for name in ("patch", "attribute"):
        text = " ".join(verbs(build_parser())[name].format_help().split())
        assert "the token whose logit" in text
        assert not text.split("the token whose logit", 1)[1].startswith(" --")
        assert not text.split("the token whose logit", 1)[1].startswith(" (default")
