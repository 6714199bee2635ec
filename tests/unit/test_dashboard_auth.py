"""The dashboard's rules on who may use it (rtml.dashboard.auth), without a server."""

from __future__ import annotations

import pytest

from rtml.dashboard import auth

TOKEN = "0123456789abcdef0123456789abcdef"


def test_the_cookie_is_derived_from_the_token_not_the_token() -> None:
    value = auth.session_value(TOKEN)
    assert TOKEN not in value and len(value) == 64
    assert value == auth.session_value(TOKEN) != auth.session_value(TOKEN + "x")


@pytest.mark.parametrize("headers,cookies,ok", [
    ({}, {}, False),
    ({"Authorization": f"Bearer {TOKEN}"}, {}, True),
    ({"Authorization": f"bearer {TOKEN}"}, {}, True),
    ({"Authorization": "Bearer nope"}, {}, False),
    ({"Authorization": f"Basic {TOKEN}"}, {}, False),
    ({}, {auth.COOKIE: auth.session_value(TOKEN)}, True),
    ({}, {auth.COOKIE: TOKEN}, False),  # the raw token is not a session
    ({}, {auth.COOKIE: ""}, False),
    ({"Authorization": "Bearer nope"}, {auth.COOKIE: auth.session_value(TOKEN)}, False),
])
def test_authorized(headers: dict[str, str], cookies: dict[str, str], ok: bool) -> None:
    assert auth.authorized(headers, cookies, TOKEN) is ok


@pytest.mark.parametrize("path,public", [
    ("/login", True), ("/static/app.js", True), ("/", False), ("/api/tasks", False),
    ("/login/../api/tasks", False), ("/loginx", False), ("/staticx/a", False)])
def test_only_the_login_form_and_assets_are_public(path: str, public: bool) -> None:
    assert auth.is_public(path) is public


@pytest.mark.parametrize("headers,refused", [
    ({}, ""),  # a script: no browser, no cookie to ride on
    ({"Host": "127.0.0.1:8265", "Origin": "http://127.0.0.1:8265"}, ""),
    ({"Host": "127.0.0.1:8265", "Sec-Fetch-Site": "same-origin"}, ""),
    ({"Host": "127.0.0.1:8265", "Sec-Fetch-Site": "none"}, ""),
    ({"Host": "127.0.0.1:8265", "Origin": "http://evil.example"}, "Origin"),
    ({"Host": "127.0.0.1:8265", "Origin": "null"}, "Origin"),
    ({"Host": "127.0.0.1:8265", "Sec-Fetch-Site": "cross-site"}, "Sec-Fetch-Site"),
    ({"Host": "127.0.0.1:8265", "Sec-Fetch-Site": "same-site"}, "Sec-Fetch-Site"),
])
def test_cross_origin(headers: dict[str, str], refused: str) -> None:
    why = auth.cross_origin(headers, "http")
    assert (refused in why and why != "") if refused else why == ""
