"""The live workbench: ``attnlab serve [RUN or DIR ...]``, a local web application on uvicorn.

Type a text and every panel answers for it: the prediction, every layer x head, one head large
(lines and matrix), the Q·K neuron view, similarity before and after each block, influence,
the walkthrough of one forward pass with its numbers, generation token by token; click a head
to ablate it; patch a clean input with a corrupt one; read the logit lens and DLA; watch a run
that is training. Each panel's data is what the ``Run`` method (or the verb's ``--json``)
returns for the same input (``attnlab.serve.views``); the page (``page/``) only draws it.

    attnlab serve runs/mine runs/            # prints http://127.0.0.1:8765/?token=...

From Python or a notebook:

    wb = attnlab.serve.start(run)            # a Run, a run directory, or several
    wb                                       # in Jupyter: the page, inline (an iframe)
    wb.url; wb.stop()
"""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

from attnlab.serve.app import Settings, create_app
from attnlab.serve.runs import ServeError

__all__ = ["Settings", "Server", "ServeError", "create_app", "listen", "serve", "start"]


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (0: a free port), bound before uvicorn starts, so
    the address printed is the one bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _uvicorn(app, log_level: str = "warning"):
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off",
                            timeout_graceful_shutdown=2)  # fmt: skip
    return uvicorn.Server(config)


def serve(settings: Settings, announce=print) -> None:
    """Serve until interrupted (what ``attnlab serve`` runs): bind, print the address, run.

    numpy's BLAS runs on one thread in this process: the views' matrices are small (tokens x
    width), and a BLAS pool of one thread per core spends longer waking and waiting for its
    threads than computing, the more so when other processes keep the cores busy."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")
    app = create_app(settings)  # the runs named are checked before anything listens
    sock = listen(settings.host, settings.port)
    settings.port = app.wb.port = sock.getsockname()[1]
    announce(settings.url())
    server = _uvicorn(app)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


class Server:
    """A workbench running in a background thread of this process (a notebook's, a test's):
    ``url``, ``stop()``; in Jupyter it shows the page inline."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.app = create_app(settings)
        self.sock = listen(settings.host, settings.port)
        settings.port = self.app.wb.port = self.sock.getsockname()[1]
        self.workbench = self.app.wb
        self._server = _uvicorn(self.app)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self.sock]},
                                        daemon=True, name="attnlab-serve")  # fmt: skip
        self._thread.start()
        import time

        for _ in range(500):  # until uvicorn says it has started (at most 10 s)
            if self._server.started or not self._thread.is_alive():
                break
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return self.settings.url()

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self.sock.close()

    def __repr__(self) -> str:
        return f"attnlab workbench at {self.url}"

    def _repr_html_(self) -> str:
        import html

        url = html.escape(self.url, quote=True)
        return (f'<iframe src="{url}" style="width:100%;height:900px;border:1px solid #ddd">'
                f'</iframe><div><a href="{url}" target="_blank">open in a tab</a></div>')  # fmt: skip


def start(*runs, host: str = "127.0.0.1", port: int = 0, memory_gb: float | None = None,
          device: str = "cpu") -> Server:  # fmt: skip
    """A workbench in the background serving ``runs`` (Run objects, already loaded, are used
    as they are; paths are run directories or directories of runs). In Jupyter, the returned
    object shows the page inline; ``stop()`` ends it."""
    from attnlab.run import Run

    paths, preloaded = [], {}
    for r in runs:
        if isinstance(r, Run):
            paths.append(r.path)
            preloaded[Path(r.path).resolve()] = r
        else:
            paths.append(r)
    memory = int(memory_gb * 1024**3) if memory_gb else None
    s = Settings(paths, host=host, port=port, memory=memory, device=device, preloaded=preloaded)
    return Server(s)


def warn_host(host: str) -> str | None:
    """The warning for a workbench that listens beyond this machine."""
    if host in ("127.0.0.1", "localhost", "::1", "[::1]"):
        return None
    return (
        f"listening on {host}: other machines that reach it can use this workbench (with "
        "the token); it runs your models on your CPU, and reads the runs it was given"
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as: attnlab serve RUN")
