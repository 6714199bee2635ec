"""Where the control plane's Redis is, and how to log in: rtml's own (the cluster token
is its password) or one the user runs (``rtml start --head --redis-address URL``).

    redis://[[USER]:PASSWORD@]HOST:PORT   -> RedisAddress(host, port, user, password)

Processes learn it from the head's hello (``info``): host and port always, the user and
password only for a Redis of the user's (rtml's own takes the cluster token).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit


@dataclass(frozen=True)
class RedisAddress:
    host: str
    port: int
    user: str = ""
    password: str = ""  # empty: rtml's own Redis, whose password is the cluster token

    @classmethod
    def parse(cls, url: str) -> RedisAddress:
        """``redis://[[USER]:PASSWORD@]HOST:PORT``. Raises ValueError saying what is wrong."""
        parts = urlsplit(url)
        if parts.scheme == "rediss":
            raise ValueError(f"{url!r}: TLS (rediss://) is not supported yet; reach Redis "
                             f"over redis:// on a trusted network, or through a TLS tunnel")
        if parts.scheme != "redis" or not parts.hostname:
            raise ValueError(f"{url!r} is not a Redis URL: use redis://[USER:PASSWORD@]"
                             f"HOST:PORT")
        try:
            port = parts.port
        except ValueError:
            port = None
        if port is None:
            raise ValueError(f"{url!r} names no port: use redis://HOST:PORT")
        if parts.path not in ("", "/", "/0"):
            raise ValueError(f"{url!r}: only database 0 is supported (drop {parts.path!r})")
        return cls(parts.hostname, port, unquote(parts.username or ""),
                   unquote(parts.password or ""))

    def info(self) -> dict[str, str]:
        """What the head's hello tells other processes."""
        return {"redis_host": self.host, "redis_port": str(self.port),
                "redis_user": self.user, "redis_password": self.password}

    @classmethod
    def from_info(cls, info: dict[str, str]) -> RedisAddress:
        return cls(info["redis_host"], int(info["redis_port"]), info.get("redis_user", ""),
                   info.get("redis_password", ""))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"
