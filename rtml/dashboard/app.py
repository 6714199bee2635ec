"""The dashboard's HTTP routes: one page (``static/index.html`` and its script) and a
JSON API under ``/api/`` that serves what ``rtml.state.StateReader`` reads, the rows
the command line prints.

::

    browser / script --HTTP--> auth middleware (rtml.dashboard.auth)
        /login, /static/*      served to anyone
        /api/*                 401 without the token  --> handler --> one reader thread
        /, other pages         redirect to /login          --> StateReader --> Redis
        POST                   403 from another site
        /api/logs              each alive node's log files  --> LogReader --ListLogs-->
        /api/logs/{node}/{name}  one, from ?offset=; with          the node's --ReadLog-->
                               ?wait=S a follower's read waits     manager (TCP)
                               up to S s for more

The reader's calls block (Redis), so they run on one thread of their own, in turn: the
event loop only moves bytes, and a slow Redis delays pages, never the server. Log
requests (a TCP connection to a node manager each, as ``rtml logs`` makes them) run on
threads of asyncio's default pool, each node's listing at once, so a node that does not
answer delays only its own part.
"""

from __future__ import annotations

import asyncio
import functools
import html
import json
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web

from rtml.dashboard import auth
from rtml.exceptions import LogNotFoundError, RtmlSystemError
from rtml.logs import FOLLOW_INTERVAL, LogReader, LogSource, bad_name
from rtml.state import KINDS, StateReader
from rtml.state.common import parse_filter

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
LIST_LIMIT = 1000
"""Rows a list returns unless ``?limit=`` says otherwise."""
FOLLOW_WAIT_MAX = 25.0
"""Seconds a log follower's read may wait for more (under proxies' idle timeouts)."""
READ_MAX = 256 * 1024
"""Bytes of a log one answer carries at most (a follower reads on from where it ended)."""
_HEADERS = {"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin", "Cache-Control": "no-store",
            "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                       "style-src 'self' 'unsafe-inline'; "
                                       "frame-ancestors 'none'; form-action 'self'"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Dashboard:
    """The routes' state: the state reader (used from one thread), the log reader, the
    token."""

    def __init__(self, reader: StateReader, logs: LogReader, token: str) -> None:
        self.reader = reader
        self.logs = logs
        self.token = token
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rtml-dashboard-read")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def read(self, call: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, call, *args)

    # -- pages ------------------------------------------------------------------------------

    async def index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html")

    async def login_page(self, request: web.Request) -> web.StreamResponse:
        return _login_form("")

    async def login(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        if not auth.token_matches(str(form.get("token", "")), self.token):
            log.warning("a login to the dashboard from %s gave a wrong token", request.remote)
            return _login_form("That is not this cluster's token.", status=401)
        response = web.HTTPSeeOther("/")
        response.set_cookie(auth.COOKIE, auth.session_value(self.token), httponly=True,
                            samesite="Strict", path="/", secure=request.secure)
        raise response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        response = web.HTTPSeeOther("/login")
        response.del_cookie(auth.COOKIE, path="/")
        raise response

    # -- the JSON API ---------------------------------------------------------------------

    async def cluster(self, request: web.Request) -> web.StreamResponse:
        return _json(await self.read(self.reader.cluster))

    async def listing(self, request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        filters = [parse_filter(text) for text in request.query.getall("filter", [])]
        limit = _int(request.query.get("limit", str(LIST_LIMIT)), "limit")
        detail = request.query.get("detail", "") in ("1", "true")
        rows = await self.read(self.reader.listing, kind, filters, limit, detail)
        return _json([row.asdict() for row in rows])

    async def task(self, request: web.Request) -> web.StreamResponse:
        return _found(await self.read(self.reader.task, request.match_info["id"]), "task")

    async def actor(self, request: web.Request) -> web.StreamResponse:
        return _found(await self.read(self.reader.actor, request.match_info["id"]), "actor")

    async def summary(self, request: web.Request) -> web.StreamResponse:
        return _json(await self.read(self.reader.summarize, request.match_info["kind"]))

    async def memory(self, request: web.Request) -> web.StreamResponse:
        return _json(await self.read(self.reader.memory))

    async def timeline(self, request: web.Request) -> web.StreamResponse:
        response = _json(await self.read(self.reader.timeline))
        if request.query.get("download"):
            response.headers["Content-Disposition"] = 'attachment; filename="timeline.json"'
        return response

    async def log_files(self, request: web.Request) -> web.StreamResponse:
        """``[{node_id, address, files: [{name, size, modified, pid, actor_id}], error}]``
        of each alive node (``?node=``: those whose id starts with it); a node whose
        manager does not answer has no files and says why in ``error``."""
        node = request.query.get("node", "")
        try:
            nodes = await self.read(self.logs.nodes, node)
        except LogNotFoundError:
            if node:
                raise
            nodes = []  # (none alive: an empty list, not an error)
        return _json(await asyncio.gather(*(self._node_files(record) for record in nodes)))

    async def _node_files(self, node: dict[str, Any]) -> dict[str, Any]:
        listed: dict[str, Any] = {"node_id": node["NodeID"],
                                  "address": node["NodeManagerAddress"], "files": [],
                                  "error": ""}
        try:
            files = await asyncio.to_thread(self.logs.files, node)
        except RtmlSystemError as exc:
            listed["error"] = str(exc)
            return listed
        listed["files"] = [{"name": f.name, "size": f.size, "modified": f.mtime,
                            "pid": f.pid, "actor_id": f.actor_id.hex()} for f in files]
        return listed

    async def log_file(self, request: web.Request) -> web.StreamResponse:
        """A piece of one node's log from ``?offset=`` (negative: from its end); with
        ``?wait=S`` (a follower at the end) the answer waits up to S s for it to grow."""
        name = request.match_info["name"]
        wrong = bad_name(name)
        if wrong:
            raise ValueError(wrong)
        offset = _int(request.query.get("offset", "-65536"), "offset")
        wait = min(float(_int(request.query.get("wait", "0"), "wait")), FOLLOW_WAIT_MAX)
        source = await self._source(request.match_info["node"], name)
        chunk = await asyncio.to_thread(self.logs.read, source, offset, READ_MAX)
        deadline = time.monotonic() + wait
        while not chunk.data and time.monotonic() < deadline:
            await asyncio.sleep(FOLLOW_INTERVAL)
            chunk = await asyncio.to_thread(self.logs.read, source, chunk.offset, READ_MAX)
        return _json({"node_id": source.node_id, "name": name, "offset": chunk.offset,
                      "next_offset": chunk.offset + len(chunk.data), "size": chunk.size,
                      "text": chunk.data.decode("utf-8", "replace")})

    async def _source(self, node: str, name: str) -> LogSource:
        """File ``name`` of the one alive node whose id starts with ``node``."""
        nodes = await self.read(self.logs.nodes, node)
        if len(nodes) > 1:
            raise ValueError(f"node id {node!r} is the start of {len(nodes)} nodes' ids: give "
                             f"more of it (/api/logs lists them)")
        return LogSource(nodes[0]["NodeID"], nodes[0]["NodeManagerAddress"], name)


def _json(value: Any, status: int = 200) -> web.Response:
    return web.json_response(value, status=status,
                             dumps=functools.partial(json.dumps, default=str))


def _found(value: dict[str, Any] | None, what: str) -> web.Response:
    if value is None:
        raise LookupError(f"no {what} with that id is recorded in the control plane")
    return _json(value)


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"?{name}= takes a whole number, got {text!r}") from None


def _login_form(error: str, status: int = 200) -> web.Response:
    page = (STATIC / "login.html").read_text()
    note = f'<p class="error" id="login-error">{html.escape(error)}</p>' if error else ""
    return web.Response(text=page.replace("<!--error-->", note), status=status,
                        content_type="text/html")


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The token on every route but the public ones; no POST from another site; errors
    as JSON naming the problem; the security headers on every answer."""
    dashboard: Dashboard = request.app["dashboard"]
    try:
        if request.method == "POST":
            why = auth.cross_origin(request.headers, request.scheme)
            if why:
                raise web.HTTPForbidden(text=f"refused a cross-site request: {why}")
        if not auth.is_public(request.path) and not auth.authorized(
                request.headers, request.cookies, dashboard.token):
            if request.path.startswith("/api/"):
                raise web.HTTPUnauthorized(
                    text=json.dumps({"error": "log in first: POST the cluster token to "
                                              "/login, or send Authorization: Bearer <token>"}),
                    content_type="application/json")
            raise web.HTTPFound("/login")
        response = await handler(request)
    except ValueError as exc:
        response = _json({"error": str(exc)}, status=400)
    except LookupError as exc:
        response = _json({"error": str(exc)}, status=404)
    except RtmlSystemError as exc:
        response = _json({"error": str(exc)}, status=503)
    except web.HTTPException as exc:
        exc.headers.update(_HEADERS)
        raise
    response.headers.update(_HEADERS)
    return response


def build_app(dashboard: Dashboard) -> web.Application:
    """The application, its routes as ROUTES lists them."""
    app = web.Application(middlewares=[_guard], client_max_size=64 * 1024)
    app["dashboard"] = dashboard
    for method, path, name in ROUTES:
        app.router.add_route(method, path, getattr(dashboard, name))
    app.router.add_static("/static/", STATIC, show_index=False, follow_symlinks=False)
    return app


ROUTES: list[tuple[str, str, str]] = [
    ("GET", "/", "index"),
    ("GET", "/login", "login_page"),
    ("POST", "/login", "login"),
    ("POST", "/logout", "logout"),
    ("GET", "/api/cluster", "cluster"),
    ("GET", "/api/{kind:" + "|".join(KINDS) + "}", "listing"),
    ("GET", "/api/tasks/{id}", "task"),
    ("GET", "/api/actors/{id}", "actor"),
    ("GET", "/api/summary/{kind}", "summary"),
    ("GET", "/api/memory", "memory"),
    ("GET", "/api/timeline", "timeline"),
    ("GET", "/api/logs", "log_files"),
    ("GET", "/api/logs/{node}/{name}", "log_file"),
]
"""(method, path, Dashboard method) of every route but the static assets'."""
