"""Where the control plane's Redis is, and how to log in: rtml's own (user ``rtml``, its
password derived from the cluster token) or one the user runs (``rtml start --head
--redis-address URL``).

    redis://[[USER]:PASSWORD@]HOST:PORT           -> RedisAddress(host, port, user, password)
    rediss://...[?ssl_ca_certs=PEM&ssl_certfile=PEM&ssl_keyfile=PEM&ssl_cert_reqs=none]
                                                  -> ... tls=Tls(ca_certs, certfile, ...)

Processes learn it from the head's hello (``info``): host and port always, the user and
password only for a Redis of the user's (rtml's own: ``own_password(token)``), and the
TLS settings (paths that every node has: as Ray's TLS files, they are not sent).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import ssl
from dataclasses import asdict, dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from rtml.exceptions import RtmlSystemError

OWN_USER = "rtml"
"""rtml's user on rtml's own Redis (whose default user is off)."""


def own_password(token: str) -> str:
    """The password of ``OWN_USER`` on rtml's own Redis: an HMAC of the cluster token, so
    every process that holds the token logs in with nothing more handed around, and a
    login seen on the wire (Redis speaks plain TCP) does not give away the token, which
    opens every rtml port."""
    return hmac.new(token.encode(), b"rtml: the control plane's Redis login",
                    hashlib.sha256).hexdigest()


_TLS_OPTIONS = {"ssl_ca_certs": "ca_certs", "ssl_certfile": "certfile",
                "ssl_keyfile": "keyfile", "ssl_cert_reqs": "cert_reqs"}
"""The query options of a rediss:// URL (redis-py's names) and the Tls field of each."""


@dataclass(frozen=True)
class Tls:
    """How to reach a Redis over TLS: the server's certificate is checked against
    ``ca_certs`` (the system's CAs if empty) and the host name, unless ``cert_reqs`` is
    "none"; ``certfile`` and ``keyfile`` are a client certificate (Redis asks for one
    unless its ``tls-auth-clients`` is off)."""

    ca_certs: str = ""
    certfile: str = ""
    keyfile: str = ""
    cert_reqs: str = "required"

    def context(self, where: str) -> ssl.SSLContext:
        """The client context; RtmlSystemError names a file that cannot be used."""
        try:
            ctx = ssl.create_default_context(cafile=self.ca_certs or None)
            if self.certfile:
                ctx.load_cert_chain(self.certfile, self.keyfile or None)
        except (OSError, ssl.SSLError) as exc:
            raise RtmlSystemError(
                f"TLS to Redis at {where}: cannot use the files of the rediss:// URL "
                f"({exc}); every node needs them at the same paths") from None
        if self.cert_reqs == "none":
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx


@dataclass(frozen=True)
class RedisAddress:
    host: str
    port: int
    user: str = ""
    password: str = ""  # empty: rtml's own Redis (``login``)
    tls: Tls | None = None  # None: plain TCP

    def login(self, token: str) -> tuple[str, str]:
        """The user and password to log in with: the user's own, or on rtml's own Redis
        ``OWN_USER`` with the password derived from the cluster token."""
        if self.password:
            return self.user, self.password
        return OWN_USER, own_password(token)

    @classmethod
    def parse(cls, url: str) -> RedisAddress:
        """``redis://[[USER]:PASSWORD@]HOST:PORT`` or ``rediss://`` (TLS) with its
        options. Raises ValueError saying what is wrong."""
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise ValueError(f"{url!r} is not a Redis URL: use redis://[USER:PASSWORD@]"
                             f"HOST:PORT (rediss:// for TLS)")
        try:
            port = parts.port
        except ValueError:
            port = None
        if port is None:
            raise ValueError(f"{url!r} names no port: use {parts.scheme}://HOST:PORT")
        if parts.path not in ("", "/", "/0"):
            raise ValueError(f"{url!r}: only database 0 is supported (drop {parts.path!r})")
        tls = _tls(url, parts.query) if parts.scheme == "rediss" else None
        if tls is None and parts.query:
            raise ValueError(f"{url!r}: options ({parts.query!r}) are for rediss:// only")
        return cls(parts.hostname, port, unquote(parts.username or ""),
                   unquote(parts.password or ""), tls)

    def ssl_context(self) -> ssl.SSLContext | None:
        return None if self.tls is None else self.tls.context(str(self))

    def info(self) -> dict[str, str]:
        """What the head's hello tells other processes."""
        return {"redis_host": self.host, "redis_port": str(self.port),
                "redis_user": self.user, "redis_password": self.password,
                "redis_tls": tls_text(self.tls)}

    @classmethod
    def from_info(cls, info: dict[str, str]) -> RedisAddress:
        return cls(info["redis_host"], int(info["redis_port"]), info.get("redis_user", ""),
                   info.get("redis_password", ""), tls_from_text(info.get("redis_tls", "")))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def tls_text(tls: Tls | None) -> str:
    """``tls`` as one string for configs and hellos ("" for none)."""
    return "" if tls is None else json.dumps(asdict(tls))


def tls_from_text(text: str) -> Tls | None:
    return Tls(**json.loads(text)) if text else None


def _tls(url: str, query: str) -> Tls:
    try:
        options = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"{url!r}: cannot read its options {query!r}") from None
    unknown = sorted(set(options) - set(_TLS_OPTIONS))
    if unknown:
        raise ValueError(f"{url!r}: unknown option(s) {', '.join(unknown)}; rediss:// takes "
                         f"{', '.join(_TLS_OPTIONS)}")
    fields = {_TLS_OPTIONS[key]: values[-1] for key, values in options.items()}
    if fields.get("cert_reqs", "required") not in ("required", "none"):
        raise ValueError(f"{url!r}: ssl_cert_reqs must be 'required' or 'none'")
    return Tls(**fields)
