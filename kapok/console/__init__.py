"""The web console: server-rendered pages over the node's own state, at ``/`` and ``/console/``.

``setup_console(app)`` is all ``make_app`` calls. The parts:

* ``session``: login with the secret key, session cookies, CSRF tokens, and the guard
  middleware that keeps every console path behind a login;
* ``views``: the pages (Jinja2 templates and static files from the top-level ``view/``
  folder, shipped in the wheel as ``kapok/view``) and the form actions;
* ``api``: the JSON under ``/console/api/`` the pages refresh from;
* ``figures``, ``messages``, ``analytics``: what the pages show, built from the same
  service and broker state the HTTP API reads;
* ``rates``: the ring of counter samples that publish / deliver / ack rates come from;
* ``peers``: the other members' analytics summaries, so every node shows the newest.
"""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp_jinja2
import jinja2
from aiohttp import web

from kapok.console import api, views
from kapok.console.format import FILTERS
from kapok.console.peers import PEER_SUMMARIES, PeerSummaries
from kapok.console.rates import RATES, RateSampler, rates_ctx
from kapok.console.session import SESSIONS, Sessions, console_guard
from kapok.server.keys import SERVICE
from kapok.server.ws.base import frame_limit

__all__ = ["setup_console", "view_dir"]


def view_dir() -> Path:
    """``view/``: inside the installed package (a wheel), else at the repository root."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "view", package.parent / "view"):
        if (candidate / "templates").is_dir():
            return candidate
    raise FileNotFoundError(f"the console's view/ folder is missing (looked in {package} and its parent)")


def setup_console(app: web.Application) -> None:
    """Add the console's routes, middleware and sampler to ``app`` (when ``console.enabled``)."""
    service = app[SERVICE]
    cfg = service.config.console
    if not cfg.enabled:
        return
    folder = view_dir()
    env = aiohttp_jinja2.setup(
        app,
        loader=jinja2.FileSystemLoader(folder / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        filters=FILTERS,
        auto_reload=False,  # each template read once: no file check on the loop per page
    )
    env.trim_blocks = env.lstrip_blocks = True
    for name in env.list_templates():  # compiled once, at start-up: pages read no file
        env.get_template(name)
    app[SESSIONS] = Sessions(service.node_name, cfg.session_idle_s, service.now)
    app[RATES] = RateSampler(service)
    limit = frame_limit(service.config.mq.max_message_bytes, service.config.server.max_batch)
    app[PEER_SUMMARIES] = PeerSummaries(service.config.mq.secret_key, limit, time.monotonic)
    app.cleanup_ctx.append(rates_ctx)
    app.middlewares.append(console_guard)
    app.add_routes(views.routes)
    app.add_routes(api.routes)
    static = app.router.add_static("/console/static/", folder / "static", name="static", append_version=True)
    # The versioned URLs (a hash of each file) made once here, not on every page render.
    env.globals["assets"] = {
        path.name: str(static.url_for(filename=path.name)) for path in (folder / "static").iterdir()
    }
