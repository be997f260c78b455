"""Who may talk to the server: the Host and Origin checks, and the JSON-only request bodies.

The server has no authentication, so what keeps it private is where it listens and three
checks against cross-site use by a browser:

- Host: a page on another site can make its own name resolve to 127.0.0.1 (DNS rebinding) and
  then read the local server's answers as same-origin. A request whose Host header is not a
  name this server answers to is refused (403). Bound to a loopback address, the names are the
  loopback ones (`localhost`, `127.0.0.1`, `::1`); bound to another address, that address;
  bound to every interface (0.0.0.0, ::), any name. `allowed_hosts` adds names ("*": any).
- Origin: a browser names the page that sends a request in the Origin header; a request from a
  page of another origin is refused (403), unless `allowed_origins` lists it. Clients that are
  not browsers (the OpenAI SDK, curl) send none and are not affected.
- Content-Type: a POST must say `application/json`. A browser sends a cross-site POST without
  asking first (a CORS preflight) only for form and text/plain bodies; JSON needs the
  preflight, which this server never grants.

Binding to every interface is logged as a warning at start (`bind_warning`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_warning(host: str) -> str | None:
    """The warning to print for a server bound to `host`, or None when it stays local."""
    if is_loopback(host):
        return None
    where = "every network interface" if host in WILDCARDS else f"{host}"
    return (
        f"listening on {where}: anyone who can reach this machine can use the model; this "
        "server has no authentication (bind 127.0.0.1 and put a proxy with authentication in "
        "front of it to serve others)"
    )


def _hostname(host_header: str) -> str:
    """The name part of a Host header ('[::1]:8000' -> '::1', 'a.b:80' -> 'a.b'), lower case."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    if h.count(":") == 1:
        return h.split(":", 1)[0]
    return h


@dataclass
class HostGuard:
    """The Host and Origin checks for a server bound to `bind_host`."""

    bind_host: str
    allowed_hosts: list[str] = field(default_factory=list)
    allowed_origins: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.any_host = "*" in self.allowed_hosts or self.bind_host in WILDCARDS
        names = {h.lower().strip("[]") for h in self.allowed_hosts}
        names.add(self.bind_host.lower().strip("[]"))
        if is_loopback(self.bind_host):
            names |= LOOPBACK_NAMES
        self.names = frozenset(names)
        self.origins = frozenset(o.rstrip("/").lower() for o in self.allowed_origins)

    def host_error(self, host_header: str | None) -> str | None:
        """Why a request with this Host header is refused, or None."""
        if self.any_host:
            return None
        if not host_header:
            return "a Host header is required"
        if _hostname(host_header) not in self.names:
            return (
                f"Host {host_header!r} is not a name this server answers to (allowed: "
                f"{sorted(self.names)}; add more with --allowed-hosts)"
            )
        return None

    def origin_error(self, origin: str | None, scheme: str, host_header: str | None) -> str | None:
        """Why a request from this Origin is refused, or None (no Origin: not a browser)."""
        if origin is None:
            return None
        o = origin.strip().rstrip("/").lower()
        if o in self.origins or "*" in self.origins:
            return None
        if host_header:  # same origin: the page was served by this very address
            parts = urlsplit(o)
            if parts.scheme == scheme and parts.netloc == host_header.strip().lower():
                return None
        return (
            f"cross-origin requests are refused: Origin {origin!r} is not this server "
            "(add it with --allowed-origins)"
        )


def content_type_error(method: str, content_type: str) -> str | None:
    """Why a request's body type is refused, or None (only POST bodies are read)."""
    if method != "POST":
        return None
    if content_type.lower() != "application/json":
        got = content_type or "none"
        return f"Content-Type must be application/json, got {got}"
    return None
