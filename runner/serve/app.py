"""The desk's web app (aiohttp): routes, the token check, and serving until stopped.

Bound to 127.0.0.1 the desk is for the user of this machine. Bound to another address
(`--host 0.0.0.0`), anyone who can reach the port could read every answer and add ratings, so
a random token is then required: the URL `judge serve` prints carries it (`?token=`), and the
first page opened with it sets a cookie, so every later link works without it.

Work that reads large files or bootstraps runs in a worker thread, so one slow page never
stops the others.
"""

from __future__ import annotations

import asyncio
import hmac
import html
import secrets
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from runner.errors import ConfigError, RunnerError
from runner.reduce.jury import judge_name
from runner.report.diff import diff_folders
from runner.report.folder import read_csv
from runner.serve import items, rate
from runner.serve.desk import Desk
from runner.serve.forms import items_page, rate_page
from runner.serve.live import LiveRuns
from runner.serve.pages import diff_page, index_page, layout, link, run_page

__all__ = ["LOOPBACK", "make_app", "new_token", "serve"]

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
"""Hosts bound without a token."""
COOKIE = "judge_desk_token"
DESK: web.AppKey[Desk] = web.AppKey("desk", Desk)
TOKEN: web.AppKey[str | None] = web.AppKey("token", str)
LIVE: web.AppKey[LiveRuns] = web.AppKey("live", LiveRuns)
RATING: web.AppKey[asyncio.Lock] = web.AppKey("rating", asyncio.Lock)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def new_token(host: str) -> str | None:
    """A random token for a desk bound to `host`, None on a loopback address.

    Args:
        host: the address the desk binds.

    Returns:
        The token a non-loopback desk requires in every request, or None.
    """
    return None if host in LOOPBACK else secrets.token_urlsafe(16)


def make_app(desk: Desk, token: str | None = None) -> web.Application:
    """The desk's application.

    Args:
        desk: what it serves.
        token: required on every request if set (see the module docstring).

    Returns:
        The aiohttp application.
    """
    app = web.Application(middlewares=[_guard])
    app[DESK], app[TOKEN], app[LIVE] = desk, token, LiveRuns(desk)
    app[RATING] = asyncio.Lock()
    app.router.add_get("/", _index)
    app.router.add_get("/run/{job}/{run}", _run)
    app.router.add_get("/run/{job}/{run}/{name}", _file)
    app.router.add_get("/diff", _diff)
    app.router.add_get("/items", _items)
    app.router.add_get("/judgment", _judgment)
    app.router.add_get("/live/{job}", _live)
    app.router.add_get("/rate", _rate_jobs)
    app.router.add_get("/rate/{job}", _rate)
    app.router.add_post("/rate/{job}", _rated)
    return app


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The token check, and a RunnerError as a page saying what is wrong (400)."""
    token = request.app[TOKEN]
    given = request.query.get("token") or request.cookies.get(COOKIE, "")
    if token is not None and not hmac.compare_digest(given.encode(), token.encode()):
        return web.Response(status=403, text="This desk needs its token: open the URL "
                                             "`judge serve` printed (…/?token=…).")
    if (why := _foreign(request, token)) is not None:
        return web.Response(status=403, text=why)
    try:
        response = await handler(request)
    except RunnerError as exc:
        response = web.Response(status=400, body=layout("Cannot show this", f"<p id=error>"
                                                        f"{html.escape(str(exc))}</p>"),
                                content_type="text/html")
    if token is not None and "token" in request.query:
        response.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
    return response


def _foreign(request: web.Request, token: str | None) -> str | None:
    """Why a request comes from another site's page, or None. A desk on 127.0.0.1 has no
    token, so a page of any site the user opens could ask it (a name of the attacker's that
    resolves to 127.0.0.1) or post ratings to it: the Host must be a loopback name, and a
    POST's Origin the desk's own."""
    if token is None and request.host.rpartition(":")[0].strip("[]") not in LOOPBACK:
        return f"Host {request.host}: this desk answers 127.0.0.1 and localhost only"
    origin = request.headers.get("Origin")
    if request.method == "POST" and origin and urlsplit(origin).netloc != request.host:
        return f"Origin {origin}: only the desk's own pages may post to it"
    return None


def _html(title: str, body: str) -> web.Response:
    return web.Response(body=layout(title, body), content_type="text/html")


async def _index(request: web.Request) -> web.Response:
    desk = request.app[DESK]
    jobs = await asyncio.to_thread(lambda: {job: desk.runs(job) for job in desk.folders()})
    live = await asyncio.to_thread(request.app[LIVE].lines, jobs)
    return _html("Runs", await asyncio.to_thread(index_page, jobs, live))  # reads each run


async def _run(request: web.Request) -> web.Response:
    desk, job = request.app[DESK], request.match_info["job"]
    runs = desk.runs(job)
    run = desk.run(job, request.match_info["run"], runs)
    live = await asyncio.to_thread(request.app[LIVE].line, job, runs)  # not every job's
    return _html(f"{job}: {run.id}", run_page(job, run, read_csv(run.path / "correlations.csv"),
                                              live if run is runs[-1] else None))


async def _file(request: web.Request) -> web.FileResponse:
    run = request.app[DESK].run(request.match_info["job"], request.match_info["run"])
    name = request.match_info["name"]
    path = run.path / name
    if "/" in name or name.startswith(".") or not path.is_file():
        raise web.HTTPNotFound(text=f"{run.id} has no file {name}")
    return web.FileResponse(path)


async def _diff(request: web.Request) -> web.Response:
    desk, q = request.app[DESK], request.query
    job, a, b = q.get("job", ""), q.get("a", ""), q.get("b", "")
    kept = desk.runs(job)
    runs = [desk.run(job, a, kept), desk.run(job, b, kept)]
    compared = await asyncio.to_thread(diff_folders, runs[0].path, runs[1].path,
                                       desk.job(job, kept))
    return _html(f"{job}: {a} vs {b}", diff_page(job, a, b, compared))


async def _items(request: web.Request) -> web.Response:
    desk, q = request.app[DESK], request.query
    jobs = list(desk.folders())
    job = q.get("job") or (jobs[0] if len(jobs) == 1 else "")
    if not job:
        return _html("Items", "<p>Pick a job: " + " ".join(
            link(j, "/items", {"job": j}) for j in jobs) + "</p>")
    runs = desk.runs(job)
    chosen = q.getall("run", []) or [runs[-1].id]
    filters = items.Filters.of(q)
    picked = [desk.run(job, r, runs) for r in chosen]
    rows = await asyncio.to_thread(items.find, picked, filters)
    summary = [s for r in picked for s in read_csv(r.path / "summary.csv")]
    choices = {"dataset": sorted({s["dataset"] for s in summary}),
               "aspect": sorted({s["aspect"] for s in summary}),
               "judge": sorted({judge_name(s["model"], s["prompt"]) for s in summary})}
    return _html(f"{job}: items", items_page(job, [r.id for r in runs], chosen, filters,
                                             choices, rows))


async def _judgment(request: web.Request) -> web.Response:
    q = request.query
    found = await asyncio.to_thread(items.judgment, request.app[DESK], q.get("job", ""),
                                    q.get("run", ""), q.get("key", ""))
    return web.json_response(found)


async def _live(request: web.Request) -> web.Response:
    progress = await asyncio.to_thread(request.app[LIVE].progress, request.match_info["job"])
    return web.json_response(progress)


def _annotator(desk: Desk) -> str:
    if desk.annotator is None:
        raise ConfigError("this desk takes no ratings: restart it with `judge serve "
                          "--annotator NAME`")
    return desk.annotator


async def _rate_jobs(request: web.Request) -> web.Response:
    desk = request.app[DESK]
    _annotator(desk)
    return _html("Rate", "<p>Rate the items of: " + " ".join(
        link(j, f"/rate/{j}") for j in desk.folders()) + "</p>")


async def _rate(request: web.Request) -> web.Response:
    desk, job = request.app[DESK], request.match_info["job"]
    annotator = _annotator(desk)
    latest = await asyncio.to_thread(desk.run, job, "latest")
    expansion = (await asyncio.to_thread(desk.selection, job, latest, whole=True)).expansion
    upcoming = await asyncio.to_thread(rate.next_item, expansion, annotator, latest.seed)
    scores = None  # blind unless --show-scores
    if desk.show_scores and upcoming is not None:
        scores = await asyncio.to_thread(items.find, [latest], items.Filters(
            dataset=upcoming.dataset, item=upcoming.item.item_id))
    saved = request.query.get("saved", "")
    saved_n = int(saved) if saved.isdigit() else 0
    return _html(f"{job}: rate", rate_page(job, annotator, upcoming, saved_n, scores))


async def _rated(request: web.Request) -> web.Response:
    desk, job = request.app[DESK], request.match_info["job"]
    annotator = _annotator(desk)
    form = await request.post()
    answers = {k: str(v) for k, v in form.items() if k not in ("dataset", "item")}
    expansion = (await asyncio.to_thread(desk.selection, job, whole=True)).expansion
    async with request.app[RATING]:  # one appender at a time: lines never interleave
        n = await asyncio.to_thread(rate.record, expansion, annotator,
                                    str(form.get("dataset", "")), str(form.get("item", "")),
                                    answers)
    raise web.HTTPSeeOther(f"/rate/{job}?saved={n}")


async def serve(app: web.Application, host: str, port: int,
                ready: Callable[[str], None]) -> None:
    """Serve `app` on host:port until cancelled (Ctrl-C).

    Args:
        app, host, port: the desk's application, the address to bind and the port (0: any).
        ready: called once with the URL to open (the token in it, if one is needed).
    """
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1]
        token = app[TOKEN]
        shown = f"[{host}]" if ":" in host else host
        ready(f"http://{shown}:{bound}/" + (f"?token={token}" if token else ""))
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()

