"""The workbench's web application (Starlette, served by uvicorn): its page, and the JSON of
the views (``attnlab.serve.views``) for the runs it was started with.

    GET  /?token=T              the page (its script and styles inline: one request, no CDN)
    GET  /api/runs              the runs offered: kind, size, data, or why one cannot be read
    POST /api/views             {"run", "input", "views": [...], "params": {...}} -> each view's
                                JSON (the CLI's --json text), or its one-line refusal
    GET  /api/learn?run=NAME    what training has written so far (loss, snapshots' scores)
    POST /api/image             an image's bytes -> "upload:ID", an input a ViT reads

Safety, as a notebook server keeps it: every request carries the token the server printed (the
page's ``?token=``, then an ``X-Attnlab-Token`` header) or is refused (403); a Host header
that names another machine, or an Origin that is not the page's own, is refused (403: a page
elsewhere cannot drive it, nor can a DNS name rebound to 127.0.0.1); bodies past
``max_body`` bytes are refused (413) before they are read whole; a text past ``max_text``
characters, an image past ``MAX_IMAGE_BYTES`` or ``MAX_IMAGE_SIDE`` pixels a side, and a run
that was not offered are refused (400/404) in one line. Nothing a request names is read from
disk except the runs offered and the images it uploaded.
"""

from __future__ import annotations

import json
import secrets
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from attnlab.errors import AttnlabError
from attnlab.serve import views as V
from attnlab.serve.runs import RunPool, RunSet, RunUnavailable, ServeError, describe

MAX_TEXT = 2000  # characters of one input (the page says so past it)
MAX_BODY = 8 * 1024 * 1024  # bytes of one request (an image upload is the largest)
MAX_IMAGE_BYTES = 4 * 1024 * 1024
MAX_IMAGE_SIDE = 4096  # pixels a side of an uploaded image
MAX_VIEWS = 16  # views one request may ask for
LOCAL = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass
class Settings:
    """What a workbench serves and how: the runs, the token, where it listens, its limits."""

    paths: list
    host: str = "127.0.0.1"
    port: int = 8765
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    memory: int | None = None  # bytes the loaded runs may hold (None: runs.default_budget())
    device: str = "cpu"
    max_text: int = MAX_TEXT
    max_body: int = MAX_BODY
    preloaded: dict | None = None  # resolved path -> Run already loaded (a notebook's)

    def url(self, port: int | None = None) -> str:
        host = self.host if self.host not in ("0.0.0.0", "::") else "127.0.0.1"
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return f"http://{host}:{port or self.port}/?token={self.token}"


class Workbench:
    """The application's state: the runs offered, the pool of loaded ones, the uploads."""

    def __init__(self, settings: Settings):
        from attnlab.serve.runs import default_budget

        self.settings = settings
        self.runs = RunSet(settings.paths)
        self.pool = RunPool(self.runs, settings.memory or default_budget(), settings.device,
                            settings.preloaded)  # fmt: skip
        self.uploads = Path(tempfile.mkdtemp(prefix="attnlab-serve-"))
        self.port = settings.port  # the port bound (uvicorn may pick one for port 0)
        self.said: set[str] = set()  # load failures already written to the log
        self._said_lock = threading.Lock()

    def say_once(self, line: str) -> None:
        with self._said_lock:
            if line in self.said:
                return
            self.said.add(line)
        print(f"attnlab serve: {line}", file=sys.stderr, flush=True)

    # -- inputs -------------------------------------------------------------------------------

    def text(self, value, reads: str) -> str:
        """The input of a request, checked: text within ``max_text``; for a model that reads
        images, ``test:N`` or an image uploaded here (never a path on this machine)."""
        if not isinstance(value, str):
            raise ServeError("the input must be text")
        if len(value) > self.settings.max_text:
            raise ServeError(f"the input is {len(value):,} characters; this workbench takes at "
                             f"most {self.settings.max_text:,} (attnlab serve --max-text)")  # fmt: skip
        if reads != "image":
            return value
        if value.startswith("test:"):
            return value
        if value.startswith("upload:"):
            name = value[len("upload:") :]
            path = self.uploads / f"{name}.png"
            if not name.isalnum() or not path.is_file():
                raise ServeError(f"{value!r}: no such uploaded image (drop the image again)")
            return str(path)
        raise ServeError("this model reads images: pick test:N or drop an image on the page "
                         "(a path on the server is not read)")  # fmt: skip

    def upload(self, body: bytes) -> dict:
        """An uploaded image, checked by decoding it, kept as a PNG under a random name."""
        import io

        from PIL import Image, UnidentifiedImageError

        if len(body) > MAX_IMAGE_BYTES:
            raise ServeError(f"the image is {len(body) / 2**20:.1f} MiB; at most "
                             f"{MAX_IMAGE_BYTES / 2**20:.0f} MiB")  # fmt: skip
        if not body:
            raise ServeError("no image: the upload was empty")
        try:
            with Image.open(io.BytesIO(body)) as img:
                w, h = img.size
                if max(w, h) > MAX_IMAGE_SIDE:
                    raise ServeError(f"the image is {w} x {h} pixels; at most {MAX_IMAGE_SIDE} "
                                     "a side")  # fmt: skip
                img.load()
                img = img.convert("RGB") if img.mode not in ("L", "RGB") else img.copy()
        except ServeError:
            raise
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
            raise ServeError("that file is not an image this workbench can read (PNG, JPEG, "
                             "GIF, BMP, ...)") from None  # fmt: skip
        name = secrets.token_hex(8)
        img.save(self.uploads / f"{name}.png")
        return {"image": f"upload:{name}", "width": w, "height": h}

    # -- views --------------------------------------------------------------------------------

    def views(self, req: dict) -> str:
        """Each view asked for, on one run and one input: the response text, the views' JSON
        inlined as the CLI prints them."""
        if not isinstance(req, dict):
            raise ServeError("the request must be a JSON object")
        names = req.get("views") or []
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ServeError("views must be a list of view names")
        if len(names) > MAX_VIEWS:
            raise ServeError(f"at most {MAX_VIEWS} views a request")
        unknown = [n for n in names if n not in V.VIEWS or not V.VIEWS[n].needs_text]
        if unknown:
            raise ServeError(f"unknown view {unknown[0]!r}; the views: "
                             f"{', '.join(n for n, v in V.VIEWS.items() if v.needs_text)}")  # fmt: skip
        params = req.get("params") or {}
        if not isinstance(params, dict):
            raise ServeError("params must be an object")
        parts, times = [], {}
        with self.pool.use(req.get("run")) as (run, cache):
            text = self.text(req.get("input", ""), run.model.reads)
            if params.get("corrupt") is not None:  # patching's second input: checked alike
                params = {**params, "corrupt": self.text(params["corrupt"], run.model.reads)}
            for name in names:
                t0 = time.perf_counter()
                try:
                    body = V.VIEWS[name].fn(run, params, cache, text)
                except _user_errors() as e:
                    body = json.dumps({"serve_error": _line(e)}, ensure_ascii=False)
                except Exception as e:  # a bug: one line for the page, the traceback here
                    traceback.print_exc(file=sys.stderr)
                    body = json.dumps({"serve_error": f"internal error: {type(e).__name__}: "
                                                f"{_line(e)}"}, ensure_ascii=False)  # fmt: skip
                times[name] = round(1000 * (time.perf_counter() - t0), 2)
                parts.append(f"{json.dumps(name)}:{body}")
        head = json.dumps({"run": req.get("run"), "input": req.get("input", ""), "ms": times},
                          ensure_ascii=False)  # fmt: skip
        return head[:-1] + ',"views":{' + ",".join(parts) + "}}"

    def learn(self, name: str) -> str:
        return V.VIEWS["learn"].fn(self.runs.path(name), {}, {})

    def listing(self) -> dict:
        rows = [describe(n, p) for n, p in self.runs.names().items()]
        for r in rows:
            if r.get("error"):
                self.say_once(f"{r['name']}: {r['error']}")
        return {"runs": rows, "loaded": self.pool.loaded(), "loads": self.pool.loads,
                "evictions": self.pool.evictions, "budget": self.pool.budget,
                "max_text": self.settings.max_text, "views": list(V.VIEWS)}  # fmt: skip


def _user_errors():
    return (AttnlabError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
            PermissionError, UnicodeDecodeError)  # fmt: skip


def _line(e: BaseException) -> str:
    if isinstance(e, FileNotFoundError) and e.filename:
        return f"{e.filename}: no such file or directory"
    return " ".join((str(e).strip() or type(e).__name__).split())


def page_html() -> str:
    """The page: index.html with its styles and scripts put inline (one response, no CDN)."""
    files = resources.files("attnlab.serve").joinpath("page")
    html = files.joinpath("index.html").read_text(encoding="utf-8")
    css = files.joinpath("app.css").read_text(encoding="utf-8")
    scripts = "".join(
        f"<script>\n{files.joinpath(n).read_text(encoding='utf-8')}\n</script>\n"
        for n in ("app.js", "panels.js")
    )
    return html.replace("<!--CSS-->", f"<style>\n{css}</style>").replace("<!--JS-->", scripts)


def create_app(settings: Settings):
    """The Starlette application serving ``settings``' runs (its ``state.workbench`` holds them)."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    wb = Workbench(settings)
    page = page_html()

    def refuse(status: int, line: str) -> Response:
        return JSONResponse({"error": line}, status_code=status)

    async def index(request: Request) -> Response:
        return HTMLResponse(page, headers={"Cache-Control": "no-store",
                                           "Referrer-Policy": "no-referrer"})  # fmt: skip

    async def runs(request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(wb.listing))

    async def body_json(request: Request):
        raw = await read_body(request, settings.max_body)
        try:
            return json.loads(raw or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ServeError("the request body is not JSON") from None

    async def views(request: Request) -> Response:
        req = await body_json(request)
        text = await run_in_threadpool(wb.views, req)
        return Response(text, media_type="application/json")

    async def learn(request: Request) -> Response:
        name = request.query_params.get("run", "")
        text = await run_in_threadpool(wb.learn, name)
        return Response(text, media_type="application/json")

    async def image(request: Request) -> Response:
        raw = await read_body(request, settings.max_body)
        return JSONResponse(await run_in_threadpool(wb.upload, raw))

    async def on_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, RunUnavailable):
            wb.say_once(_line(exc))
            return refuse(404, _line(exc))
        if isinstance(exc, TooLarge):
            return refuse(413, str(exc))
        if isinstance(exc, _user_errors()):
            return refuse(400, _line(exc))
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        return refuse(500, f"internal error: {type(exc).__name__}: {_line(exc)}")

    routes = [
        Route("/", index, methods=["GET"]),
        Route("/api/runs", runs, methods=["GET"]),
        Route("/api/views", views, methods=["POST"]),
        Route("/api/learn", learn, methods=["GET"]),
        Route("/api/image", image, methods=["POST"]),
    ]
    handlers = {t: on_error for t in (*_user_errors(), Exception)}
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.state.workbench = wb
    return Guard(app, wb)


class TooLarge(ServeError):
    pass


async def read_body(request, limit: int) -> bytes:
    """The request body, refused (TooLarge) as soon as it passes ``limit`` bytes."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise TooLarge(f"the request is {int(size):,} bytes; at most {limit:,}")
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise TooLarge(f"the request is over {limit:,} bytes; at most {limit:,}")
        chunks.append(chunk)
    return b"".join(chunks)


class Guard:
    """ASGI middleware in front of every route: the token, the Host and the Origin (refused
    with 403 and one line), and the request size (413) before the route reads anything."""

    def __init__(self, app, wb: Workbench):
        self.app, self.wb = app, wb
        self.state = app.state

    def allowed_hosts(self) -> set[str]:
        s = self.wb.settings
        names = set(LOCAL) | {s.host, f"[{s.host}]"}
        return {f"{n}:{self.wb.port}" for n in names} | (names if self.wb.port == 80 else set())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        line = self.check(scope, headers)
        if line is not None:
            status, text = line
            body = json.dumps({"error": text}).encode()
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})  # fmt: skip
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def check(self, scope, headers: dict) -> tuple[int, str] | None:
        host = headers.get("host", "")
        if host not in self.allowed_hosts():
            return 403, (f"foreign Host header {host!r} refused: open the address attnlab "
                         "serve printed")  # fmt: skip
        origin = headers.get("origin")
        if origin is not None and origin.split("://", 1)[-1] not in self.allowed_hosts():
            return 403, f"foreign Origin {origin!r} refused: this workbench answers its own page"
        from urllib.parse import parse_qs

        given = headers.get("x-attnlab-token")
        if given is None:
            given = (parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token")
                     or [""])[0]  # fmt: skip
        if not secrets.compare_digest(given.encode(), self.wb.settings.token.encode()):
            return 403, ("no valid token: open the address attnlab serve printed (it ends in "
                         "?token=...)")  # fmt: skip
        size = headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > self.wb.settings.max_body:
            return 413, f"the request is {int(size):,} bytes; at most {self.wb.settings.max_body:,}"
        return None
