"""Serving benchmark: load an OpenAI-compatible server over HTTP and measure what clients see.

    python -m project04_llm_inference.bench.serving --launch --engine.load-format dummy \\
        --engine.dummy-shape llama-3.2-1b --request-rates 4 8 16 32 inf
    python -m project04_llm_inference.bench.serving --base-url http://127.0.0.1:8000 \\
        --dataset-path prompts.jsonl --concurrencies 1 8 64

Works against any server with `/v1/completions` (or `/v1/chat/completions`) and SSE streaming:
requests are random token-id prompts (the same seeded workload as `bench/offline.py`'s
throughput run, every request generating exactly its `max_tokens` with `ignore_eos`), or a JSONL
file of `{"prompt": ..., "max_tokens": ...}`. Each offered rate (Poisson arrivals; `inf`: all at
once) or client count (closed loop) is one run; the record holds every run's throughput, TTFT /
TPOT / ITL / E2E percentiles, failures and goodput under the SLO, the highest rate that met the
SLO, and, given the offline throughput record, serving over offline tok/s. A chart of p50/p99
TTFT and TPOT against achieved throughput is written beside the record.

Only servers on this machine are targets (`serving_client.check_loopback` says why). `--launch`
starts `python -m project04_llm_inference serve` with the engine arguments given here, waits for
`/health`, and stops it with SIGTERM at the end. Records go to
`<reports_dir>/project04_llm_inference/<name>.json`, by default under an untracked `runs/<UTC time>/`.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from project04_llm_inference import PROJECT
from project04_llm_inference.config import EngineArgs

from . import serving_metrics as sm
from .serving_client import check_loopback, raise_open_file_limit, run_load, send_request
from .serving_launch import ServerError, discover_model, launch_server, stop_server, wait_healthy

MAX_PROMPTS = 100_000  # requests per run
MAX_RUNS = 32  # runs per sweep


@dataclass
class ServingBenchConfig:
    """Serving benchmark: requests over HTTP at offered rates or client counts, one record."""

    base_url: str = "http://127.0.0.1:8000"
    """server to load; loopback hosts only (127.0.0.0/8, ::1, localhost)"""
    endpoint: Literal["/v1/completions", "/v1/chat/completions"] = "/v1/completions"
    """OpenAI route; the chat route needs text prompts (--dataset-path)"""
    model: str = ""
    """model name sent with each request; empty: the first of GET /v1/models, else 'default'"""
    dataset_path: str = ""
    """JSONL file of {"prompt": text or token ids, "max_tokens": n}; empty: random token-id prompts"""
    num_prompts: int = 500
    """requests per run (the first n lines of a dataset)"""
    prompt_len: tuple[int, int] = (128, 2048)
    """random prompts: length range, tokens, uniform, both ends included"""
    output_len: tuple[int, int] = (64, 1024)
    """random prompts: max_tokens range, uniform, both ends included"""
    vocab_size: int = 128_256
    """random prompts: ids are drawn from the model's vocabulary less reserved ids (as offline.py)"""
    seed: int = 0
    """seed of the random prompts and of the arrival gaps"""
    request_rates: tuple[float, ...] = (4.0, 8.0, 16.0, 32.0, math.inf)
    """offered rates of the sweep, requests/s, Poisson arrivals; inf sends all at once"""
    max_concurrency: int = 0
    """most requests in flight during a rate run; 0: no cap"""
    concurrencies: tuple[int, ...] = ()
    """when given, sweep these client counts instead (closed loop: a client sends again when its request ends)"""
    ignore_eos: bool = True
    """ask the server to generate exactly max_tokens (an extra field vLLM also accepts)"""
    temperature: float = 0.0
    """sampling temperature sent with each request"""
    return_token_ids: bool = False
    """ask for each chunk's token ids (an extra field vLLM and this project's server accept): token
    events are then counted exactly even where a chunk's text is empty (a model without tokenizer)"""
    slo_ttft_ms: float = 500.0
    """SLO: time to first token, ms"""
    slo_tpot_ms: float = 50.0
    """SLO: time per output token after the first, ms"""
    slo_e2e_ms: float = 0.0
    """SLO: end-to-end latency, ms; 0: no target"""
    slo_attainment: float = 0.9
    """a run meets the SLO when no request failed and at least this share met every target"""
    offline_record: str = ""
    """offline_throughput.json of bench/offline.py: its engine output tok/s is the ceiling"""
    launch: bool = False
    """start the server here (python -m project04_llm_inference serve) and stop it at the end"""
    engine: EngineArgs = field(default_factory=lambda: EngineArgs(load_format="dummy"))
    """engine of the launched server (passed through as --engine.* flags)"""
    server_args: str = ""
    """more flags for the launched server, one shell-quoted string"""
    launch_timeout_s: float = 900.0
    """how long the launched server may take to answer /health"""
    warmup_requests: int = 2
    """short requests sent one by one before the sweep (not measured); all failing stops the run"""
    request_timeout_s: float = 600.0
    """one request's limit, s"""
    time_limit_s: float = 3600.0
    """the whole sweep's limit, s: requests in flight then fail, later runs are skipped"""
    reports_dir: str = ""
    """folder of the record (under <reports_dir>/project04_llm_inference/); empty: runs/<UTC time>/"""
    name: str = "serving"
    """record name: <name>.json and <name>.png"""
    progress: bool = True
    """show a progress bar per run"""
    save_requests: bool = True
    """keep each request's TTFT, E2E, tokens and error in the record (not its ITL gaps)"""

    def __post_init__(self) -> None:
        self.base_url = check_loopback(self.base_url)
        if not 1 <= self.num_prompts <= MAX_PROMPTS:
            raise ValueError(f"num_prompts: expected 1..{MAX_PROMPTS}, got {self.num_prompts}")
        for name in ("prompt_len", "output_len"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(
                    f"{name}: expected (low, high) with 1 <= low <= high, got {(lo, hi)}"
                )
        if self.vocab_size < 4:
            raise ValueError(f"vocab_size: expected >= 4, got {self.vocab_size}")
        if not self.request_rates or any(not r > 0 for r in self.request_rates):
            raise ValueError(
                f"request_rates: expected rates > 0 (inf allowed), got {self.request_rates}"
            )
        if self.max_concurrency < 0 or any(c < 1 for c in self.concurrencies):
            raise ValueError("max_concurrency must be >= 0 and every concurrency >= 1")
        if len(self.concurrencies or self.request_rates) > MAX_RUNS:
            raise ValueError(f"request_rates/concurrencies: at most {MAX_RUNS} runs per sweep")
        for name in (
            "slo_ttft_ms",
            "slo_tpot_ms",
            "launch_timeout_s",
            "request_timeout_s",
            "time_limit_s",
        ):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name}: expected a finite number > 0, got {v}")
        if not (self.slo_e2e_ms >= 0 and math.isfinite(self.slo_e2e_ms)):
            raise ValueError(f"slo_e2e_ms: expected a finite number >= 0, got {self.slo_e2e_ms}")
        if not 0 < self.slo_attainment <= 1:
            raise ValueError(
                f"slo_attainment: expected a share in (0, 1], got {self.slo_attainment}"
            )
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature: expected a finite number >= 0, got {self.temperature}")
        if self.warmup_requests < 0:
            raise ValueError(f"warmup_requests: expected >= 0, got {self.warmup_requests}")
        for name in ("dataset_path", "offline_record"):
            if getattr(self, name) and not Path(getattr(self, name)).is_file():
                raise FileNotFoundError(f"{name}: no file at {getattr(self, name)}")
        if self.endpoint == "/v1/chat/completions" and not self.dataset_path:
            raise ValueError("endpoint: the chat route takes text prompts; give --dataset-path")
        if self.launch and urlsplit(self.base_url).port is None:
            raise ValueError(
                "base_url: --launch needs an explicit port, e.g. http://127.0.0.1:8000"
            )
        if not self.name or "/" in self.name:
            raise ValueError(f"name: expected a plain file stem, got {self.name!r}")

    @property
    def slo(self) -> sm.SLO:
        return sm.SLO(self.slo_ttft_ms, self.slo_tpot_ms, self.slo_e2e_ms)


# --- requests --------------------------------------------------------------------------------


def load_jsonl(path: str, n: int) -> list[tuple[str | list[int], int]]:
    """The first n (prompt, max_tokens) of a JSONL file; a bad line is named by its number."""
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if len(out) == n:
                break
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                prompt, max_tokens = rec["prompt"], rec["max_tokens"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(
                    f'dataset_path: line {lineno}: expected {{"prompt": ..., "max_tokens": n}}'
                ) from None
            ids = isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
            if not (isinstance(prompt, str) or ids) or not prompt:
                raise ValueError(f"dataset_path: line {lineno}: prompt must be text or token ids")
            if not isinstance(max_tokens, int) or max_tokens < 1:
                raise ValueError(f"dataset_path: line {lineno}: max_tokens must be an int >= 1")
            out.append((prompt, max_tokens))
    if not out:
        raise ValueError(f"dataset_path: no request in {path}")
    return out


def build_requests(cfg: ServingBenchConfig) -> list[tuple[str | list[int], int]]:
    """(prompt, max_tokens) of every request of a run: the dataset's, or the seeded random ones
    `bench/offline.py` builds for the same sizes (so the offline ceiling saw the same requests)."""
    if cfg.dataset_path:
        return load_jsonl(cfg.dataset_path, cfg.num_prompts)
    from .offline import random_workload

    wl = random_workload(cfg.num_prompts, cfg.prompt_len, cfg.output_len, cfg.vocab_size, cfg.seed)
    return list(zip(wl.prompts, wl.output_lens))


def request_body(cfg: ServingBenchConfig, model: str, prompt, max_tokens: int) -> dict:
    body = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": cfg.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if cfg.return_token_ids:
        body["return_token_ids"] = True
    if cfg.endpoint == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def describe_requests(reqs: list[tuple[str | list[int], int]]) -> dict:
    ids = [p for p, _ in reqs if isinstance(p, list)]
    outs = [m for _, m in reqs]
    return {
        "requests": len(reqs),
        "token_id_prompts": len(ids),
        "prompt_tokens": sum(map(len, ids)) if len(ids) == len(reqs) else None,
        "max_tokens_total": sum(outs),
        "max_tokens_min": min(outs),
        "max_tokens_max": max(outs),
    }


# --- a sweep ---------------------------------------------------------------------------------


def sweep_plan(cfg: ServingBenchConfig) -> list[tuple[float, int]]:
    """(offered rate, most in flight) per run, lowest load first."""
    if cfg.concurrencies:
        return [(math.inf, c) for c in sorted(cfg.concurrencies)]
    return [(r, cfg.max_concurrency) for r in sorted(cfg.request_rates)]


async def _warm_up(cfg, url: str, bodies: list[tuple[dict, int | None]]) -> None:
    import aiohttp

    if not cfg.warmup_requests:
        return
    timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        results = []
        for i in range(cfg.warmup_requests):
            body, n = bodies[i % len(bodies)]
            body = {**body, "max_tokens": min(body["max_tokens"], 16)}
            results.append(
                await send_request(
                    session, url, body, index=i, prompt_tokens=n, origin=time.perf_counter()
                )
            )
    if not any(r.ok for r in results):
        raise ServerError(f"every warm-up request to {url} failed; first: {results[0].error}")


def _request_row(r) -> dict:
    return {
        k: getattr(r, k)
        for k in (
            "index",
            "ok",
            "error",
            "start_s",
            "ttft_s",
            "e2e_s",
            "prompt_tokens",
            "output_tokens",
            "token_events",
        )
    }


async def _sweep(cfg: ServingBenchConfig, bodies: list) -> list[dict]:
    url = cfg.base_url + cfg.endpoint
    await _warm_up(cfg, url, bodies)
    deadline = time.monotonic() + cfg.time_limit_s
    runs = []
    progress = _progress(cfg.progress)
    with progress:
        for rate, conc in sweep_plan(cfg):
            label = f"rate {sm.rate_label(rate)}" + (f", {conc} in flight" if conc else "")
            left = deadline - time.monotonic()
            row = {
                "request_rate": sm.rate_label(rate),
                "max_concurrency": conc,
                "closed_loop": bool(cfg.concurrencies),
            }
            if left <= 0:
                runs.append({**row, "skipped": "the sweep's time limit was reached"})
                continue
            task = progress.add_task(label, total=len(bodies))
            failed = 0

            def done(r, task=task, label=label):
                nonlocal failed
                failed += not r.ok
                progress.update(task, advance=1, description=f"{label}, {failed} failed")

            load = await run_load(
                url,
                bodies,
                request_rate=rate,
                max_concurrency=conc,
                seed=cfg.seed,
                time_limit_s=left,
                request_timeout_s=cfg.request_timeout_s,
                on_done=done,
            )
            summary = sm.mark_run(
                sm.summarize(load.results, load.duration_s, cfg.slo), rate, cfg.slo_attainment
            )
            row.update(summary, time_limited=load.time_limited)
            if cfg.save_requests:
                row["per_request"] = [_request_row(r) for r in load.results if r is not None]
            runs.append(row)
    return runs


def _progress(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress(
        "{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not enabled,
    )


def compare_offline(cfg: ServingBenchConfig, runs: list[dict]) -> dict:
    """The offline engine's output tok/s as the ceiling of the sweep's best run: the all-at-once
    run without a cap when there is one (what the offline run does), else the fastest run."""
    done = [r for r in runs if "output_tok_s" in r]
    pick = next(
        (r for r in done if r["request_rate"] == "inf" and not r["max_concurrency"]),
        max(done, key=lambda r: r["output_tok_s"], default=None),
    )
    out = {
        "record": cfg.offline_record or None,
        "offline_output_tok_s": None,
        "serving_run": pick and pick["request_rate"],
        "serving_output_tok_s": pick and pick["output_tok_s"],
        "workload_differences": None,
    }
    if cfg.offline_record:
        from shared.results import load_result

        rec = load_result(cfg.offline_record)
        res = rec["results"]
        # the offline run of the same engine configuration as the launched server's, when the
        # record has it (it may hold the engine with and without multi-step decoding)
        key = "engine"
        if cfg.launch:
            want = cfg.engine.num_scheduler_steps
            key = next(
                (
                    k
                    for k in ("engine", "engine_single_step")
                    if (res.get(k) or {}).get("num_scheduler_steps", 1) == want
                ),
                "engine",
            )
        out["offline_system"] = key
        out["offline_output_tok_s"] = (res.get(key) or {}).get("output_tok_s")
        oc = rec.get("config", {})
        mine = {
            "dataset": cfg.dataset_path or "random",
            "num_requests": cfg.num_prompts,
            "prompt_len": list(cfg.prompt_len),
            "output_len": list(cfg.output_len),
            "seed": cfg.seed,
        }
        theirs = {
            "dataset": "random",
            "num_requests": oc.get("num_requests"),
            "prompt_len": list(oc.get("prompt_len") or []),
            "output_len": list(oc.get("output_len") or []),
            "seed": oc.get("seed"),
        }
        out["workload_differences"] = {
            k: {"serving": mine[k], "offline": theirs[k]} for k in mine if mine[k] != theirs[k]
        }
    return {**out, **sm.offline_ceiling(out["serving_output_tok_s"], out["offline_output_tok_s"])}


# --- the record ------------------------------------------------------------------------------


def _reports_dir(cfg: ServingBenchConfig) -> Path:
    from shared.results import output_root

    cfg.reports_dir = str(output_root(cfg.reports_dir))
    return Path(cfg.reports_dir)


def run(cfg: ServingBenchConfig) -> dict:
    """Run the sweep against the target (launched here when asked); write and return the record."""
    from shared.gpu_state import gpu_state
    from shared.results import environment_line, load_result, save_result

    from .serving_chart import print_table, serving_chart

    start = gpu_state()  # this machine's GPU (the server's, when it is launched here)
    reqs = build_requests(cfg)
    raise_open_file_limit(len(reqs))  # before a launch: the server inherits it
    folder = _reports_dir(cfg) / PROJECT
    proc, cmd = None, None
    if cfg.launch:
        log = folder / f"{cfg.name}_server.log"
        proc, cmd = launch_server(cfg.base_url, cfg.engine, cfg.server_args, log)
    try:
        if proc is not None:
            asyncio.run(wait_healthy(cfg.base_url, proc, cfg.launch_timeout_s))
        model = cfg.model or asyncio.run(discover_model(cfg.base_url))
        bodies = [
            (request_body(cfg, model, p, m), len(p) if isinstance(p, list) else None)
            for p, m in reqs
        ]
        runs = asyncio.run(_sweep(cfg, bodies))
    finally:
        code = stop_server(proc) if proc is not None else None
    res = {
        "target": {
            "base_url": cfg.base_url,
            "endpoint": cfg.endpoint,
            "model": model,
            "launched": cmd,
            "server_exit_code": code,
        },
        "workload": describe_requests(reqs),
        "slo": {**asdict(cfg.slo), "attainment": cfg.slo_attainment},
        "runs": runs,
        "max_rate_meeting_slo": sm.max_rate_meeting_slo([r for r in runs if "slo_met" in r]),
        "offline": compare_offline(cfg, runs),
    }
    config = {**asdict(cfg), "request_rates": [sm.rate_label(r) for r in cfg.request_rates]}
    path = save_result(
        PROJECT,
        cfg.name,
        res,
        config=config,
        reports_dir=cfg.reports_dir,
        baseline={"offline_output_tok_s": res["offline"]["offline_output_tok_s"]},
        gpu_state_start=start,
    )
    print(f"wrote {path}")
    chart = serving_chart(
        res, folder / f"{cfg.name}.png", footnote=environment_line(load_result(path)["environment"])
    )
    print(f"wrote {chart}")
    print_table(res)
    return res


def main(argv: list[str] | None = None) -> dict | None:
    import tyro

    try:
        cfg = tyro.cli(ServingBenchConfig, args=argv, prog=f"python -m {PROJECT}.bench.serving")
        return run(cfg)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
