"""Do constrained outputs hold? Generate under JSON schemas, a regex and a choice with a model's
real weights (or random ones) and check that every output parses and validates.

    python -m project04_llm_inference.bench.structured_validity --model models/code-model
    python -m project04_llm_inference.bench.structured_validity            # random weights

The grammar's mask must hold whatever the weights prefer: a trained model pulls toward its own
text (Python source, for the repo's code model), random weights toward nothing in particular.
The schemas are finite (bounded strings, numbers and arrays), so under any weights the output
ends: an output that stops at `max_tokens` instead is counted as a failure, not excused. Each
constraint runs greedy and sampled (several seeds), in one batch that also holds free requests,
so the masks are applied per request in mixed batches. One record: `structured_validity.json`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

from shared.cli import main_guard

# Finite schemas: under any weights the output ends. A bounded string is a `pattern`, not
# `maxLength`: xgrammar's `maxLength` rule admits raw control characters, which strict JSON
# parsers reject.
SCHEMAS: list[dict] = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z0-9 _-]{0,6}$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "ok": {"type": "boolean"},
        },
        "required": ["name", "age", "ok"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "where": {
                "type": "object",
                "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9}},
                "required": ["x"],
                "additionalProperties": False,
            },
        },
        "required": ["unit", "tags", "where"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4},
]
REGEX = r"[a-z]{3}-\d{2,4}"
CHOICES = ["yes", "no", "maybe"]


@dataclass
class ValidityConfig:
    """Share of constrained outputs that parse and validate, on real or random weights."""

    model: str | None = None
    """A model folder (config.json, weights, tokenizer.json), e.g. `train-code-model`'s output;
    none: random weights of the tiny shape over a synthetic byte-level vocabulary of 1,024."""
    seeds: int = 8
    """Sampled requests per constraint (temperature 1, seeds 0..n-1), besides one greedy."""
    max_tokens: int = 200
    """Token budget per request: an output still open at it counts as a failure."""
    device: str = "auto"
    """'cuda', 'cpu' or 'auto'."""
    reports_dir: str = ""
    """folder of the JSON record (under <reports_dir>/project04_llm_inference/); empty:
    runs/<UTC time>/"""


def requests(seeds: int, max_tokens: int) -> tuple[list, list[tuple[str, object]]]:
    """SamplingParams for each constraint (greedy and `seeds` sampled), with a free request after
    each constrained one, and what each constrained output must satisfy."""
    from .. import SamplingParams
    from .. import StructuredOutputsParams as SO

    constraints = [("json", s, SO(json=s)) for s in SCHEMAS]
    constraints += [("regex", REGEX, SO(regex=REGEX)), ("choice", CHOICES, SO(choice=CHOICES))]
    params, checks = [], []
    for kind, arg, so in constraints:
        for seed in [None, *range(seeds)]:
            temp = 0.0 if seed is None else 1.0
            params.append(
                SamplingParams(
                    max_tokens=max_tokens, temperature=temp, seed=seed, structured_outputs=so
                )
            )
            checks.append((kind, arg))
            params.append(SamplingParams(max_tokens=16, temperature=1.0, seed=seed))
            checks.append(("free", None))
    return params, checks


def check(kind: str, arg, text: str, finish_reason: str) -> str | None:
    """Why an output fails its constraint, or None when it holds."""
    import jsonschema

    if finish_reason != "stop":
        return f"ended by {finish_reason}, not by the grammar"
    if kind == "json":
        try:
            jsonschema.validate(json.loads(text), arg)
        except (ValueError, jsonschema.ValidationError) as e:
            return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    elif kind == "regex" and not re.fullmatch(arg, text):
        return "does not match the regex"
    elif kind == "choice" and text not in arg:
        return "not one of the choices"
    return None


def run(cfg: ValidityConfig) -> dict:
    from .. import LLM
    from .structured import synthetic_model_dir

    real = cfg.model is not None
    model = cfg.model if real else str(synthetic_model_dir("tiny", vocab_size=1024))
    llm = LLM(
        model=model,
        load_format="auto" if real else "dummy",
        device=cfg.device,
        max_model_len=cfg.max_tokens + 64,
    )
    prompts = ["def parse(", '{"', "Answer:", "import os\n"]
    params, checks = requests(cfg.seeds, cfg.max_tokens)
    outs = llm.generate([prompts[i % len(prompts)] for i in range(len(params))], params)
    by_kind: dict[str, dict] = {}
    failures = []
    for out, (kind, arg) in zip(outs, checks):
        if kind == "free":
            continue
        row = by_kind.setdefault(kind, {"outputs": 0, "valid": 0})
        row["outputs"] += 1
        why = check(kind, arg, out.text, out.finish_reason)
        if why is None:
            row["valid"] += 1
        else:
            failures.append({"kind": kind, "text": out.text[:200], "why": why})
    total = sum(r["outputs"] for r in by_kind.values())
    valid = sum(r["valid"] for r in by_kind.values())
    for kind, r in by_kind.items():
        print(f"{kind:>6}: {r['valid']}/{r['outputs']} valid")
    print(f"all: {valid}/{total} constrained outputs parse and validate")
    samples = [o.text for o, (k, _) in zip(outs, checks) if k == "json"][:3]
    from shared.results import output_root, save_result

    cfg.reports_dir = str(output_root(cfg.reports_dir))
    res = {
        "weights": "trained" if real else "random",
        "device": str(llm.engine.device),
        "vocab_size": llm.engine.vocab_size,
        "by_kind": by_kind,
        "outputs": total,
        "valid": valid,
        "valid_share": valid / total,
        "failures": failures,
        "json_samples": samples,
        "target_valid_share": 1.0,
    }
    out = save_result(
        "project04_llm_inference",
        "structured_validity",
        res,
        config=asdict(cfg),
        reports_dir=cfg.reports_dir,
    )
    print(f"wrote {out}")
    return res


@main_guard
def main(argv: list[str] | None = None) -> None:
    import tyro

    prog = "python -m project04_llm_inference.bench.structured_validity"
    doc = __doc__.split("\n\n")[0]
    run(tyro.cli(ValidityConfig, args=argv, prog=prog, description=doc))


if __name__ == "__main__":
    main()
