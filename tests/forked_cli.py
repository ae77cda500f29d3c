"""Run the real ``attnlab`` command many times, fast: one warm interpreter forks a process per call.

Starting ``python -m attnlab`` costs ~1.5 s of CPU, almost all of it importing torch. This server
imports torch, numpy and safetensors once (never attnlab, never runs a tensor op), then for each
request forks a child that does exactly what ``python -m attnlab ARGS`` does: its own cwd and
environment, stdin from /dev/null, stdout and stderr on fresh file descriptors, ``attnlab``
imported from scratch and run as ``__main__``. An exception that escapes prints Python's own
traceback and exits 1, as the interpreter would; ``sys.exit`` codes pass through.

Protocol: one JSON request per line on stdin ``{"argv", "cwd", "env", "stdout", "stderr"}``,
one JSON reply per line on stdout ``{"rc", "maxrss_kb", "peak_anon_kb"}`` (the exit code, the
child's peak resident set, and the peak of its anonymous memory, polled: see ``watch``). ``ForkedCLI`` is the client the tests use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from printed import printed

SRC = Path(__file__).resolve().parents[1] / "src"


def _child(req: dict) -> None:  # pragma: no cover - runs in the forked process
    code = 1
    try:
        os.chdir(req["cwd"])
        sys.path[0] = os.getcwd()  # as `python -m` does
        os.environ.clear()
        os.environ.update(req["env"])
        for fd, path, flags in (
            (0, os.devnull, os.O_RDONLY),
            (1, req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (2, req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        ):
            new = os.open(path, flags, 0o644)
            os.dup2(new, fd)
            os.close(new)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        sys.argv = ["attnlab", *req["argv"]]
        import runpy

        try:
            runpy.run_module("attnlab", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        import atexit
        import contextlib

        atexit._run_exitfuncs()  # as the interpreter does at exit
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    finally:
        os._exit(code)


def anon_kb(pid: int) -> int | None:
    """The process's anonymous resident memory (RssAnon, Linux), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def watch(pid: int) -> tuple[int, os.struct_rusage | None, int]:  # type: ignore[name-defined]
    """Wait for child ``pid``; return its wait status, rusage and the peak of its RssAnon,
    polled every millisecond for its first two seconds and every 20 ms after.

    Why not ``ru_maxrss``: it counts the pages of shared libraries a process maps, and how many
    of those a process touches depends on the page cache (a freshly installed torch maps ~50 MB
    more of itself than one installed weeks ago). Allocations are anonymous memory."""
    import time

    start, peak = time.monotonic(), 0
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage, peak
        peak = max(peak, anon_kb(pid) or 0)
        time.sleep(0.001 if time.monotonic() - start < 2 else 0.02)


def serve() -> None:  # pragma: no cover - runs in the server process
    import numpy  # noqa: F401
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (torch.optim imports it on first use: ~1 s)

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req)
        status, usage, peak_anon_kb = watch(pid)
        reply = {
            "rc": os.waitstatus_to_exitcode(status),
            "maxrss_kb": usage.ru_maxrss,
            "peak_anon_kb": peak_anon_kb,
        }
        print(json.dumps(reply), flush=True)


class ForkedCLI:
    """``cli(*args, cwd=, env=)`` -> ``subprocess.CompletedProcess``, each call its own process."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        self.proc = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}
        self.tmp = tempfile.TemporaryDirectory(prefix="attnlab-cli-")

    def __call__(
        self, *args, cwd: str | Path | None = None, env: dict | None = None
    ) -> subprocess.CompletedProcess:
        out, err = Path(self.tmp.name, "stdout"), Path(self.tmp.name, "stderr")
        req = {
            "argv": [str(a) for a in args],
            "cwd": str(cwd or os.getcwd()),
            "env": {
                k: v
                for k, v in {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}.items()
                if v is not None  # None: unset it
            },
            "stdout": str(out),
            "stderr": str(err),
        }
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        result = subprocess.CompletedProcess(
            ["attnlab", *req["argv"]],
            reply["rc"],
            out.read_text(errors="replace"),
            err.read_text(errors="replace"),
        )
        printed(result)  # tests/printed.py: read wherever lines wrapped
        result.maxrss_kb = reply["maxrss_kb"]  # the child's peak resident set (getrusage)
        result.peak_anon_kb = reply["peak_anon_kb"]  # its peak anonymous memory (polled)
        return result

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.tmp.cleanup()


if __name__ == "__main__":
    serve()
