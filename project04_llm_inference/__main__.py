"""`python -m project04_llm_inference <command> --help`: generate, benchmark, report.

python -m project04_llm_inference generate --engine.load-format dummy --engine.dummy-shape tiny --prompt-ids 1 2 3
python -m project04_llm_inference throughput        # offline throughput vs baselines (GPU)
python -m project04_llm_inference latency           # decode ms/step vs the bandwidth floor (GPU)
python -m project04_llm_inference report --reports-dir runs/<time>
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from .config import EngineArgs, SamplingParams


@dataclass
class GenerateConfig:
    """Generate for one prompt and print the tokens (and text, with a tokenizer)."""

    engine: EngineArgs = field(default_factory=lambda: EngineArgs(load_format="dummy"))
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    prompt: str = ""
    """Text prompt (needs the model folder's tokenizer.json)."""
    prompt_ids: list[int] = field(default_factory=list)
    """Token-id prompt (when there is no tokenizer)."""


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


def _report(cfg: ReportConfig) -> None:
    from .report.render import render

    for path in render(cfg.reports_dir):
        print(path)


def main(argv: list[str] | None = None) -> None:
    import tyro

    from .bench import offline, prefill

    commands = {
        "generate": GenerateConfig,
        "throughput": offline.ThroughputConfig,
        "latency": offline.LatencyConfig,
        "memory": offline.MemoryConfig,
        "prefix": offline.PrefixConfig,
        "prefill-kernel": prefill.PrefillBenchConfig,
        "report": ReportConfig,
    }
    runners = {
        GenerateConfig: _generate,
        ReportConfig: _report,
        prefill.PrefillBenchConfig: prefill.run,
        **offline.RUNNERS,
    }
    try:
        from .bench import kernels

        commands["decode-kernel"] = kernels.KernelBenchConfig
        runners[kernels.KernelBenchConfig] = kernels.run
    except (ImportError, AttributeError):  # the decode-kernel benchmark is optional here
        pass
    cfg = tyro.extras.subcommand_cli_from_dict(
        commands, args=argv, prog="python -m project04_llm_inference"
    )
    try:
        runners[type(cfg)](cfg)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
