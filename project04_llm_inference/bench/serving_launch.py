"""The serving benchmark's server side: start the project's server, wait for it, stop it.

`launch_server` runs `python -m project04_llm_inference serve` with the engine arguments as
`--engine.*` flags on a port it first checks is free, logging to a file; `wait_healthy` polls
`/health`; `stop_server` sends SIGTERM and waits (then kills). `discover_model` asks
`/v1/models` for the name to put in requests.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path
from urllib.parse import urlsplit

from project04_llm_inference import PROJECT
from project04_llm_inference.config import EngineArgs


class ServerError(ValueError):
    """The target cannot be benchmarked (it never became healthy, or it failed every warm-up);
    a ValueError, so that the command line answers it in one line like any bad argument."""


def engine_flags(engine: EngineArgs) -> list[str]:
    """EngineArgs as the `--engine.*` flags of the server's command line: the fields that differ
    from EngineArgs' defaults (the server builds the same dataclass, so the rest match)."""
    flags = []
    for f in fields(engine):
        v, flag = getattr(engine, f.name), "--engine." + f.name.replace("_", "-")
        if v == f.default or v is None:
            continue
        if isinstance(v, bool):
            flags.append(flag if v else "--engine.no-" + f.name.replace("_", "-"))
        else:
            flags += [flag, str(v)]
    return flags


async def _get_json(url: str, timeout_s: float = 5.0):
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url) as resp:
        return resp.status, (await resp.json(content_type=None) if resp.status == 200 else None)


async def wait_healthy(base_url: str, proc: subprocess.Popen | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerError(f"the launched server exited with status {proc.returncode}")
        try:
            status, _ = await _get_json(base_url + "/health")
            if status == 200:
                return
        except Exception:  # not listening yet, or not answering yet: ask again
            pass
        await asyncio.sleep(0.5)
    raise ServerError(f"{base_url}/health did not answer 200 within {timeout_s:g} s")


def launch_server(
    base_url: str, engine: EngineArgs, server_args: str, log_path: Path
) -> tuple[subprocess.Popen, list[str]]:
    """Start the project's server on base_url's port (refused when the port is taken, so that an
    older server answering /health is never measured by mistake); the process and its command."""
    from shared.results import REPO_ROOT

    parts = urlsplit(base_url)
    host = parts.hostname if parts.hostname != "localhost" else "127.0.0.1"
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, parts.port))
        except OSError:
            raise ValueError(
                f"base_url: {host} port {parts.port} is taken; stop that server "
                "or pick another port"
            ) from None
    cmd = [
        sys.executable,
        "-m",
        PROJECT,
        "serve",
        *engine_flags(engine),
        "--host",
        host,
        "--port",
        str(parts.port),
        *shlex.split(server_args),
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # the load generator sends no API key: a key set in this shell's environment must not
    # lock the launched server (an --api-key in server_args still does, deliberately)
    env = {k: v for k, v in os.environ.items() if k not in ("P04_API_KEY", "VLLM_API_KEY")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    shown = ["python", *cmd[1:]]  # the record names no path of this machine
    print(f"launched: {shlex.join(shown)} (log: {log_path})")
    return proc, shown


def stop_server(proc: subprocess.Popen, grace_s: float = 30.0) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


async def discover_model(base_url: str) -> str:
    try:
        status, body = await _get_json(base_url + "/v1/models")
        return str(body["data"][0]["id"]) if status == 200 else "default"
    except Exception:  # no such route, or an unexpected body: fall back to a placeholder name
        return "default"
