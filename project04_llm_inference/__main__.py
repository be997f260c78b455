"""`python -m project04_llm_inference <command> --help`: generate, benchmark, report.

python -m project04_llm_inference generate --engine.load-format dummy --engine.dummy-shape tiny --prompt-ids 1 2 3
python -m project04_llm_inference serve --engine.model path/to/model   # OpenAI API on 127.0.0.1:8000
python -m project04_llm_inference throughput        # offline throughput vs baselines (GPU)
python -m project04_llm_inference latency           # decode ms/step vs the bandwidth floor (GPU)
python -m project04_llm_inference spec-train --models-dir runs/spec-models   # target + draft
python -m project04_llm_inference spec --models-dir runs/spec-models         # speculative speedup
python -m project04_llm_inference report --reports-dir runs/<time>
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields

from shared.cli import main_guard, run_subcommand, writable_dir

from .config import EngineArgs, SamplingParams

PROG = "python -m project04_llm_inference"
DESCRIPTION = (
    "A small LLM inference engine (paged KV cache, continuous batching, CUDA "
    "graphs, its own attention kernels) and its OpenAI-compatible server: generation, "
    "benchmarks against the baselines and the report."
)


def _engine_defaults() -> EngineArgs:
    """EngineArgs' own defaults, not checked: tyro only reads the defaults from it and builds the
    checked EngineArgs from the command line. So `serve --engine.model DIR` loads DIR's weights
    (never dummy ones by surprise), and `serve` alone asks for a model or --engine.load-format
    dummy, in one line."""
    args = object.__new__(EngineArgs)
    for f in fields(EngineArgs):
        setattr(args, f.name, f.default if f.default is not MISSING else f.default_factory())
    return args


@dataclass
class GenerateConfig:
    """Generate for one prompt and print the tokens (and text, with a tokenizer)."""

    engine: EngineArgs = field(default_factory=lambda: _engine_defaults())
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    prompt: str = ""
    """Text prompt (needs the model folder's tokenizer.json)."""
    prompt_ids: list[int] = field(default_factory=list)
    """Token-id prompt (when there is no tokenizer)."""


@dataclass
class ServeConfig:
    """Serve the OpenAI HTTP API (completions, chat completions, streaming) until SIGINT/SIGTERM."""

    engine: EngineArgs = field(default_factory=_engine_defaults)
    host: str = "127.0.0.1"
    """Address to bind; 127.0.0.1 keeps the server local (there is no authentication)."""
    port: int = 8000
    """TCP port; 0 picks a free one (the line printed at start says which)."""
    served_model_name: str | None = None
    """The `model` clients name; default: --engine.model as given, or dummy-<shape>."""
    max_queued_requests: int = 256
    """Most requests (choices: n counts n times) waiting for a place in the running batch; a
    request that does not fit whole gets 503."""
    shutdown_grace_s: float = 10.0
    """On SIGINT/SIGTERM, how long running requests may finish before they are aborted."""
    max_choices: int = 16
    """Most choices of one request: n times the number of prompts (and never more than
    max_queued_requests)."""
    max_prompt_chars: int | None = None
    """Most characters of prompt text per prompt (a chat's messages together), checked before
    tokenizing; default 32 per token of the model's context."""
    max_body_mib: float = 8.0
    """Largest request body, MiB (413 past it)."""
    read_timeout_s: float = 30.0
    """A request's headers, then its body, must each arrive within this long (the connection
    is closed, or 408); an idle keep-alive connection is closed after it too."""
    write_timeout_s: float = 30.0
    """A stream whose client takes no data for this long is closed (and its request aborted)."""
    allowed_hosts: list[str] = field(default_factory=list)
    """Host names clients may use besides the bound address (and the loopback names when bound
    to loopback); '*' allows any. Other Host headers get 403 (DNS rebinding)."""
    allowed_origins: list[str] = field(default_factory=list)
    """Browser origins (scheme://host:port) allowed to call the API; requests from other pages
    get 403. Clients that are not browsers send no Origin and are not affected."""

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("ServeConfig.host: empty")
        for name in ("max_choices", "max_prompt_chars"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"ServeConfig.{name} must be >= 1, got {v}")
        for name in ("max_body_mib", "read_timeout_s", "write_timeout_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"ServeConfig.{name} must be finite and > 0, got {v}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"ServeConfig.port must be in [0, 65535], got {self.port}")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("ServeConfig.served_model_name: empty")
        if self.max_queued_requests < 1:
            raise ValueError(
                f"ServeConfig.max_queued_requests must be >= 1, got {self.max_queued_requests}"
            )
        if not (math.isfinite(self.shutdown_grace_s) and self.shutdown_grace_s >= 0):
            raise ValueError(
                f"ServeConfig.shutdown_grace_s must be finite and >= 0, got {self.shutdown_grace_s}"
            )


@dataclass
class ReportConfig:
    """Render results.md and the charts from a folder of benchmark JSON records."""

    reports_dir: str = "reports"
    """Folder holding project04_llm_inference/*.json (a run's folder, or the published reports)."""


def _generate(cfg: GenerateConfig) -> None:
    from .engine.llm import LLM

    if bool(cfg.prompt) == bool(cfg.prompt_ids):
        raise ValueError("give exactly one of --prompt and --prompt-ids")
    llm = LLM(cfg.engine)
    out = llm.generate(cfg.prompt or cfg.prompt_ids, cfg.sampling)[0]
    print(f"tokens ({out.finish_reason}): {out.token_ids}")
    if out.text:
        print(out.text)


def _serve(cfg: ServeConfig) -> int:
    """0 after SIGINT/SIGTERM; 1 when the engine loop died (a supervisor restarts it)."""
    import asyncio
    import logging

    from .server.api import ServerOptions, serve
    from .server.protocol import Limits

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    options = ServerOptions(
        host=cfg.host,
        port=cfg.port,
        served_model_name=cfg.served_model_name,
        max_queued_requests=cfg.max_queued_requests,
        shutdown_grace_s=cfg.shutdown_grace_s,
        limits=Limits(max_choices=cfg.max_choices, max_prompt_chars=cfg.max_prompt_chars),
        max_body_mib=cfg.max_body_mib,
        read_timeout_s=cfg.read_timeout_s,
        write_timeout_s=cfg.write_timeout_s,
        allowed_hosts=list(cfg.allowed_hosts),
        allowed_origins=list(cfg.allowed_origins),
    )
    return asyncio.run(serve(cfg.engine, options))


def _report(cfg: ReportConfig) -> None:
    from .report.render import render

    for path in render(cfg.reports_dir):
        print(path)


def commands() -> dict[str, tuple[type, Callable]]:
    """Command name -> (its config class, the function that runs it)."""
    from .bench import gemv, kernels, offline, prefill, serving, spec
    from .spec import train_corpus

    return {
        "generate": (GenerateConfig, _generate),
        "serve": (ServeConfig, _serve),
        **{name: (cls, offline.RUNNERS[cls]) for name, cls in offline.COMMANDS.items()},
        "prefill-kernel": (prefill.PrefillBenchConfig, prefill.run),
        "serving": (serving.ServingBenchConfig, serving.run),
        "spec": (spec.SpecBenchConfig, spec.run),
        "spec-train": (train_corpus.TrainCorpusConfig, train_corpus.run),
        "report": (ReportConfig, _report),
        "decode-kernel": (kernels.KernelBenchConfig, kernels.run),
        "gemv-kernel": (gemv.GemvBenchConfig, gemv.run),
    }


# Benchmarks of the CUDA kernels: nothing to measure without a GPU
GPU_COMMANDS = ("decode-kernel", "gemv-kernel", "prefill-kernel")


def _run_command(name: str, fn: Callable, cfg) -> object:
    """Checks before a command starts, each answered in one line: a kernel benchmark without
    a GPU (exit code 1), an output folder that cannot be one (exit code 2)."""
    if name in GPU_COMMANDS:
        import torch

        if not torch.cuda.is_available():
            print(
                f"error: {name}: needs a CUDA GPU and torch sees none (nothing measured, no record)",
                file=sys.stderr,
            )
            return 1
    if name == "spec-train":
        writable_dir("models_dir", cfg.models_dir)
    return fn(cfg)


@main_guard
def main(argv: list[str] | None = None) -> int:
    return run_subcommand(
        commands(), prog=PROG, description=DESCRIPTION, argv=argv, runner=_run_command
    )


if __name__ == "__main__":
    sys.exit(main())
