"""`python -m project04_llm_inference <command> --help`: generate, benchmark, report.

python -m project04_llm_inference generate --engine.load-format dummy --engine.dummy-shape tiny --prompt-ids 1 2 3
python -m project04_llm_inference serve path/to/model   # OpenAI API on 127.0.0.1:8000
python -m project04_llm_inference serve MODEL --max-model-len 4096 --api-key KEY   # vLLM's flags
python -m project04_llm_inference train-code-model    # a code model served with its tokenizer
python -m project04_llm_inference code-demo --model-dir models/code-model   # serve it, complete
python -m project04_llm_inference throughput        # offline throughput vs baselines (GPU)
python -m project04_llm_inference latency           # decode ms/step vs the bandwidth floor (GPU)
python -m project04_llm_inference spec-train --models-dir runs/spec-models   # target + draft
python -m project04_llm_inference spec --models-dir runs/spec-models         # speculative speedup
python -m project04_llm_inference report --reports-dir runs/<time>
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields

from shared.cli import fail, main_guard, run_subcommand, writable_dir

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
    """Serve the OpenAI HTTP API (completions, chat completions, streaming) until SIGINT/SIGTERM.
    vLLM's spelling works too: `serve MODEL` and any engine flag without its prefix
    (--max-model-len, --gpu-memory-utilization, --max-num-seqs, --dtype, --seed, --load-format)."""

    engine: EngineArgs = field(default_factory=_engine_defaults)
    host: str = "127.0.0.1"
    """Address to bind; 127.0.0.1 keeps the server local."""
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
    api_key: str | None = None
    """Every /v1/* request must send 'Authorization: Bearer <key>' (401 otherwise); /health and
    /metrics stay open. Default: $P04_API_KEY, else $VLLM_API_KEY; unset: no key asked."""

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
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("ServeConfig.api_key: empty (leave --api-key out to ask for none)")
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
    from .server.auth import resolve_api_key
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
        api_key=resolve_api_key(cfg.api_key),
    )
    return asyncio.run(serve(cfg.engine, options))


def _report(cfg: ReportConfig) -> None:
    from .report.render import render

    for path in render(cfg.reports_dir):
        print(path)


def commands() -> dict[str, tuple[type, Callable]]:
    """Command name -> (its config class, the function that runs it)."""
    from . import code_demo, code_model
    from .bench import engine_variants, fp8_accuracy, gemv, kernels, offline, prefill, serving, spec
    from .spec import train_corpus

    return {
        "generate": (GenerateConfig, _generate),
        "serve": (ServeConfig, _serve),
        **{name: (cls, offline.RUNNERS[cls]) for name, cls in offline.COMMANDS.items()},
        "prefill-kernel": (prefill.PrefillBenchConfig, prefill.run),
        "serving": (serving.ServingBenchConfig, serving.run),
        "spec": (spec.SpecBenchConfig, spec.run),
        "spec-train": (train_corpus.TrainCorpusConfig, train_corpus.run),
        "train-code-model": (code_model.CodeModelConfig, code_model.run),
        "code-demo": (code_demo.CodeDemoConfig, code_demo.run),
        "report": (ReportConfig, _report),
        "decode-kernel": (kernels.KernelBenchConfig, kernels.run),
        "gemv-kernel": (gemv.GemvBenchConfig, gemv.run),
        "fp8-accuracy": (fp8_accuracy.Fp8AccuracyConfig, fp8_accuracy.run),
        "engine-variants": (engine_variants.EngineVariantsConfig, engine_variants.run),
    }


# Benchmarks of the CUDA kernels: nothing to measure without a GPU
GPU_COMMANDS = ("decode-kernel", "gemv-kernel", "prefill-kernel")


def _run_command(name: str, fn: Callable, cfg) -> object:
    """Checks before a command starts, each answered in one line: a kernel benchmark without
    a GPU is skipped (exit code 0, like the other benchmarks without one: `make project04`
    goes on), an output folder that cannot be one is an error (exit code 2)."""
    if name in GPU_COMMANDS:
        import torch

        if not torch.cuda.is_available():
            print(
                f"{name}: needs a CUDA GPU and torch sees none; skipped (nothing measured, no record)"
            )
            return 0
    if name == "spec-train":
        writable_dir("models_dir", cfg.models_dir)
    if name == "train-code-model":
        writable_dir("out_dir", os.path.dirname(os.path.abspath(cfg.out_dir)))
    return fn(cfg)


# Commands that take vLLM's spelling: a positional model folder and the engine's flags unprefixed
VLLM_STYLE = ("serve", "generate")


def vllm_style_argv(argv: list[str], own_fields: set[str]) -> list[str]:
    """`serve MODEL --max-model-len 4096` -> `serve --engine.model MODEL --engine.max-model-len
    4096`: the model folder as the first argument, and every EngineArgs flag given without its
    `--engine.` prefix (unless the command has a field of that name), in either spelling
    (dashes or underscores, `--flag value` or `--flag=value`)."""
    engine_fields = {f.name.replace("_", "-") for f in fields(EngineArgs)}
    out = [argv[0]]
    rest = argv[1:]
    if rest and not rest[0].startswith("-"):
        out += ["--engine.model", rest[0]]
        rest = rest[1:]
    for tok in rest:
        if tok.startswith("--") and not tok.startswith("--engine."):
            name, eq, value = tok[2:].partition("=")
            flag = name.replace("_", "-")
            if flag in engine_fields and flag not in own_fields:
                tok = f"--engine.{flag}{eq}{value}"
        out.append(tok)
    return out


def _missing_model(argv: list[str]) -> bool:
    """A serve/generate line that names neither a model folder nor dummy weights."""
    if any(a in ("-h", "--help") for a in argv):
        return False
    joined = " ".join(argv[1:])
    return "--engine.model" not in joined and "--engine.load-format" not in joined


def preprocess(argv: list[str], table: dict[str, tuple[type, Callable]]) -> list[str]:
    """The command line as tyro reads it; an unknown command, or a serve without a model, is
    one error line naming what is valid."""
    if not argv or argv[0].startswith("-"):
        return argv
    if argv[0] not in table:
        fail(f"unknown command {argv[0]!r}; the commands are: {', '.join(table)}")
    if argv[0] not in VLLM_STYLE:
        return argv
    own = {f.name.replace("_", "-") for f in fields(table[argv[0]][0])}
    out = vllm_style_argv(argv, own)
    if _missing_model(out):
        fail(
            f"{argv[0]}: give a model folder ({argv[0]} MODEL, e.g. {argv[0]} "
            "models/Llama-3.2-1B-Instruct) or dummy weights (--load-format dummy --dummy-shape "
            "tiny)"
        )
    return out


@main_guard
def main(argv: list[str] | None = None) -> int:
    table = commands()
    argv = preprocess(list(sys.argv[1:] if argv is None else argv), table)
    return run_subcommand(table, prog=PROG, description=DESCRIPTION, argv=argv, runner=_run_command)


if __name__ == "__main__":
    sys.exit(main())
