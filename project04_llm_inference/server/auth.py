"""API keys: with a key set, every /v1/* route (unknown ones included) asks for
`Authorization: Bearer <key>` and answers 401 without it; /health and /metrics stay open, so a
load balancer's probe and a Prometheus scrape need no secret (what vLLM's `--api-key` does).

The key comes from `--api-key`, else from the environment (`P04_API_KEY`, then vLLM's own
`VLLM_API_KEY`, so a deployment written for vLLM keeps working). The comparison is
`hmac.compare_digest` on the UTF-8 bytes: its time does not depend on where the given key first
differs from the real one, so timing the answers does not reveal the key a byte at a time.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping

ENV_VARS = ("P04_API_KEY", "VLLM_API_KEY")
PROTECTED_PREFIX = "/v1"


def resolve_api_key(flag: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The key in force: the flag's, else the first environment variable of ENV_VARS that is set
    and not empty; None: no key asked. An empty or blank flag is refused (a server meant to
    be locked that is open by mistake)."""
    if flag is not None:
        if not flag.strip():
            raise ValueError("api_key: empty (leave --api-key out to serve without a key)")
        return flag
    for name in ENV_VARS:
        value = environ.get(name, "")
        if value.strip():
            return value
    return None


def is_protected(path: str) -> bool:
    return path == PROTECTED_PREFIX or path.startswith(PROTECTED_PREFIX + "/")


class ApiKeyCheck:
    """Checks a request's Authorization header against the key."""

    def __init__(self, key: str) -> None:
        self._key = key.encode("utf-8")

    def error(self, path: str, authorization: str | None) -> str | None:
        """None when the request may go on; else the 401's message (which never echoes what
        the client sent)."""
        if not is_protected(path):
            return None
        if not authorization:
            return "this server needs an API key: send the header 'Authorization: Bearer <key>'"
        scheme, _, given = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return "the Authorization header must be 'Bearer <key>'"
        if not hmac.compare_digest(given.strip().encode("utf-8"), self._key):
            return "incorrect API key"
        return None


def exposure_warning(host: str, keyed: bool, loopback: bool) -> str | None:
    """The warning for a server bound beyond loopback that asks for a key (None otherwise; a
    server without a key has guard.bind_warning's)."""
    if loopback or not keyed:
        return None
    return (
        f"listening on {host}: /v1/* asks for the API key, which travels in clear text over "
        "plain HTTP (put a TLS proxy in front of it); /health and /metrics are open"
    )
