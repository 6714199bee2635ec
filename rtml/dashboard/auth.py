"""Who may use the dashboard: the holders of the cluster token. Pure functions over a
request's headers and cookies (no I/O), so each rule is tested without a server.

::

    browser   POST /login (form: token) --same origin?--> token right? --> Set-Cookie
              rtml_session=HMAC(token, "rtml-dashboard-session"); HttpOnly; SameSite=Strict
    script    Authorization: Bearer <token>
    every route but /login and /static/: the cookie or the bearer, compared in constant
              time, else 401 (/api/) or a redirect to /login (pages)
    POST (login, logout): refused when Origin or Sec-Fetch-Site says another site sent it

The cookie holds an HMAC of the token, never the token: a cookie that leaks (a proxy's
log, a shared browser profile) opens the dashboard but no other port of the cluster,
whose handshakes need the token itself.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

COOKIE = "rtml_session"
PUBLIC_PREFIXES = ("/login", "/static/")
"""Paths served without the token: the login form and its assets."""
_COOKIE_LABEL = b"rtml-dashboard-session"
_SAME_SITE_FETCHES = ("same-origin", "none")  # "none": typed in, or a bookmark


def session_value(token: str) -> str:
    """The value of the dashboard's session cookie for ``token``."""
    return hmac.new(token.encode(), _COOKIE_LABEL, hashlib.sha256).hexdigest()


def token_matches(given: str, token: str) -> bool:
    """Whether ``given`` is the cluster token (constant time)."""
    return hmac.compare_digest(given.encode(), token.encode())


def authorized(headers: Mapping[str, str], cookies: Mapping[str, str], token: str) -> bool:
    """Whether a request carries the session cookie or ``Authorization: Bearer <token>``."""
    scheme, _, given = headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and given:
        return token_matches(given.strip(), token)
    cookie = cookies.get(COOKIE, "")
    return bool(cookie) and hmac.compare_digest(cookie.encode(), session_value(token).encode())


def is_public(path: str) -> bool:
    return path == "/login" or path.startswith(PUBLIC_PREFIXES[1])


def cross_origin(headers: Mapping[str, str], scheme: str) -> str:
    """Why a state-changing request looks sent by another site (``""``: it does not).

    A browser names the sending site in ``Sec-Fetch-Site`` and ``Origin``; a script
    sends neither, and has no cookie a forged request could ride on."""
    fetch_site = headers.get("Sec-Fetch-Site")
    if fetch_site is not None and fetch_site not in _SAME_SITE_FETCHES:
        return f"Sec-Fetch-Site is {fetch_site!r}"
    origin = headers.get("Origin")
    if origin is not None and origin != f"{scheme}://{headers.get('Host', '')}":
        return f"Origin {origin!r} is not this dashboard"
    return ""
