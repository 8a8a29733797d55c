"""The live dashboard the coordinator serves at `/`: a static page (static/, no CDN: it works
offline) that polls `/dashboard/state.json` (`view.run_view`) every 2 s and draws it as SVG.

Read-only, behind the operator credential. A browser cannot put a bearer token on a page load,
so the page without a credential is a login form: the operator pastes the operator token, it is
POSTed (never in a URL, so never in the browser's history, a proxy's log or a Referer) to
`/dashboard/login`, compared in constant time, and exchanged for an HttpOnly, SameSite=Strict
session cookie (Secure under TLS). The cookie holds an HMAC of the operator token, not the
token: it opens the dashboard's read-only routes and nothing else, and changing the operator
token voids it. A script (curl, a proxy) may send the operator token as a bearer header
instead. Responses forbid framing, inline scripts and any other origin (Content-Security-Policy)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from echo2.coordinator.http.history import RunHistory
from echo2.coordinator.http.view import run_view

if TYPE_CHECKING:
    from echo2.coordinator.state import CoordinatorState

STATIC_DIR = Path(__file__).parent / "static"
SESSION_COOKIE = "echo2_dashboard"
MAX_LOGIN_BYTES = 4096  # a form with one token field
ASSETS = {"/dashboard/app.js": ("dashboard.js", "text/javascript"),
          "/dashboard/app.css": ("dashboard.css", "text/css")}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
STATE_KEY: web.AppKey[CoordinatorState] = web.AppKey("dashboard_state")
HISTORY_KEY = web.AppKey("dashboard_history", RunHistory)


def session_value(operator_token: str) -> str:
    """The cookie's value: derived from the operator token, so it is not the token itself."""
    return hmac.new(operator_token.encode(), b"echo2 dashboard session v1", hashlib.sha256).hexdigest()


def _allowed(request: web.Request, operator_token: str) -> bool:
    bearer = request.headers.get("Authorization", "")
    cookie = request.cookies.get(SESSION_COOKIE, "")
    return (hmac.compare_digest(bearer.encode(), f"Bearer {operator_token}".encode())
            or hmac.compare_digest(cookie.encode(), session_value(operator_token).encode()))


async def viewer_gate(request: web.Request, operator_token: str,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """The auth middleware's check for the dashboard's routes (credentials.VIEWER)."""
    if _allowed(request, operator_token):
        return await handler(request)
    if request.path == "/":
        return _login_page(status=401)
    raise web.HTTPUnauthorized(text="missing or wrong operator credential: log in at / or send the operator token "
                                    "($ECHO2_OPERATOR_TOKEN or <run_dir>/keys/operator.token) as a bearer token")


async def handle_login(request: web.Request, operator_token: str) -> web.StreamResponse:
    """POST /dashboard/login (open: it checks the token it is given)."""
    if request.content_length is not None and request.content_length > MAX_LOGIN_BYTES:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_LOGIN_BYTES, actual_size=request.content_length)
    form = await request.post()
    token = form.get("token", "")
    if not isinstance(token, str) or not hmac.compare_digest(token.strip().encode(), operator_token.encode()):
        # wrong guesses draw from the address's registration bucket (429 once it is empty): the
        # token is far too long to guess, and a guessing loop must not cost the coordinator either
        request.app[STATE_KEY].registry.take_join_token(request.remote or "")
        return _login_page(status=401, wrong=True)
    response = web.Response(status=303, headers={**SECURITY_HEADERS, "Location": "/"})
    response.set_cookie(SESSION_COOKIE, session_value(operator_token), path="/", httponly=True, samesite="Strict",
                        secure=request.secure)
    return response


def _login_page(status: int, wrong: bool = False) -> web.Response:
    page = (STATIC_DIR / "login.html").read_text()
    notice = "That is not this run's operator token." if wrong else ""
    return web.Response(text=page.replace("{{notice}}", notice), status=status, content_type="text/html",
                        headers=SECURITY_HEADERS)


async def handle_page(request: web.Request) -> web.Response:
    return web.Response(text=(STATIC_DIR / "dashboard.html").read_text(), content_type="text/html",
                        headers=SECURITY_HEADERS)


async def handle_asset(request: web.Request) -> web.Response:
    name, content_type = ASSETS[request.path]
    return web.Response(text=(STATIC_DIR / name).read_text(), content_type=content_type, headers=SECURITY_HEADERS)


async def handle_state(request: web.Request) -> web.Response:
    return web.json_response(run_view(request.app[STATE_KEY], request.app[HISTORY_KEY]), headers=SECURITY_HEADERS)


def add_dashboard_routes(app: web.Application, state: CoordinatorState, history: RunHistory,
                         operator_token: str) -> None:
    app[STATE_KEY], app[HISTORY_KEY] = state, history

    async def login(request: web.Request) -> web.StreamResponse:
        return await handle_login(request, operator_token)

    app.router.add_get("/", handle_page)
    app.router.add_post("/dashboard/login", login)
    app.router.add_get("/dashboard/state.json", handle_state)
    for path in ASSETS:
        app.router.add_get(path, handle_asset)
