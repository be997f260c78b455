"""Engine and sampling configuration: typed dataclasses, turned into a command line by tyro.

`EngineArgs` says which model to load and how to size the engine; `SamplingParams` says how one
request is decoded. Both validate on construction and name the offending field.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from typing import Literal

# Rounds per fused speculative program when EngineArgs.spec_fused_rounds is left unset
DEFAULT_FUSED_ROUNDS = 4

# Named shapes for dummy weights (`load_format="dummy"`): the HF config fields of real models.
DUMMY_SHAPES: dict[str, dict] = {
    # Llama-3.2-1B: 1.236 B parameters, GQA 32/8, tied embeddings, Llama-3 RoPE scaling.
    "llama-3.2-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128_256,
        max_position_embeddings=131_072,
        rms_norm_eps=1e-5,
        rope_theta=500_000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
        tie_word_embeddings=True,
        bos_token_id=128_000,
        eos_token_id=128_001,
    ),
    # A few hundred thousand parameters: the CPU tier's model (GQA 4/2, like the real ones).
    "tiny": dict(
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=256,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10_000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    ),
}


# Bounds of SamplingParams: every field reaches the device as a float32 or int32/int64 tensor
# or drives per-token work on the engine's thread, so each has a ceiling
MAX_INT32 = 2**31 - 1
# Temperatures below this are greedy: logits / T stays finite in float32 for |logits| < 1e33
MIN_TEMPERATURE = 1e-5
# Far past any useful value (OpenAI's API stops at 2); keeps logits / T a normal float32
MAX_TEMPERATURE = 1e4
# Each generated token is checked against every stop string: both are bounded per request
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 256


def _check_int(owner: str, name: str, x, lo: int, hi: int) -> int:
    """x must be an int (a bool is not one) in [lo, hi]."""
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{owner}.{name} must be an integer, got {type(x).__name__} {x!r}")
    if not lo <= x <= hi:
        raise ValueError(f"{owner}.{name} must be in [{lo}, {hi}], got {x}")
    return x


def _check_float(owner: str, name: str, x) -> float:
    """x must be a finite int or float (a bool is not a number); returned as a float."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{owner}.{name} must be a number, got {type(x).__name__} {x!r}")
    try:
        x = float(x)
    except OverflowError:
        raise ValueError(f"{owner}.{name} must be a finite number, got a huge integer") from None
    if not math.isfinite(x):
        raise ValueError(f"{owner}.{name} must be a finite number, got {x}")
    return x


def _check_stop(stop) -> list[str]:
    """A stop string or a list of them -> a list of non-empty, bounded strings."""
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
        raise TypeError("SamplingParams.stop must be a string or a list of strings")
    if len(stops) > MAX_STOP_STRINGS:
        raise ValueError(
            f"SamplingParams.stop: at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}"
        )
    for s in stops:
        if not s:
            raise ValueError("SamplingParams.stop: empty stop strings are not allowed")
        if len(s) > MAX_STOP_STRING_CHARS:
            raise ValueError(
                f"SamplingParams.stop: a stop string may have at most {MAX_STOP_STRING_CHARS} "
                f"characters, got {len(s)}"
            )
    return list(stops)


_ENGINE_CHOICES = {
    "load_format": ("auto", "dummy"),
    "dtype": ("auto", "bfloat16", "float16", "float32"),
    "device": ("auto", "cuda", "cpu"),
    "speculative_method": ("none", "ngram", "draft"),
    "quantization": ("none", "fp8"),
    "kv_cache_dtype": ("auto", "fp8", "fp8_e4m3"),
}


# int fields whose checks below refuse a bool or a float by naming their range
_OWN_RANGE_CHECKS = frozenset(
    {"num_scheduler_steps", "num_speculative_tokens", "spec_fused_rounds", "tensor_parallel_size"}
)
# a bound far past any one-node GPU count; the model's head counts bound it further at load
MAX_TENSOR_PARALLEL = 64


def _physical_memory_bytes() -> int | None:
    """This machine's RAM, bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


@dataclass
class EngineArgs:
    """How to load the model and size the engine."""

    model: str | None = None
    """Hugging Face-format model folder (config.json + *.safetensors). None with --load-format dummy."""
    load_format: Literal["auto", "dummy"] = "auto"
    """'auto' reads the folder's safetensors; 'dummy' makes random weights of `dummy_shape`."""
    dummy_shape: str = "llama-3.2-1b"
    """Named shape for dummy weights (used when no model folder is given)."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """'auto': bfloat16 on a GPU, float32 on the CPU."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """'auto': cuda when a GPU is visible."""
    seed: int = 0
    """Seed of the dummy weights and of requests that give none."""
    block_size: int = 16
    """Tokens per KV-cache block (a power of two, >= 16 on the GPU kernels)."""
    gpu_memory_utilization: float = 0.90
    """Share of the GPU's memory the engine may use: weights, activations and the KV pool."""
    num_gpu_blocks: int | None = None
    """Fix the KV pool's size in blocks instead of sizing it from free memory (tests, studies)."""
    cpu_kv_cache_gib: float = 0.25
    """KV pool on the CPU path, GiB."""
    max_model_len: int = 4096
    """Longest sequence (prompt + output) a request may reach."""
    max_num_seqs: int = 256
    """Most sequences in one step (running batch)."""
    max_num_batched_tokens: int = 8192
    """Token budget of one step: decodes count 1, prefill chunks their length."""
    enable_prefix_caching: bool = True
    """Share full KV blocks between requests with the same token prefix."""
    enable_chunked_prefill: bool = True
    """Split long prompts across steps, mixed with decodes."""
    enforce_eager: bool = False
    """Never capture CUDA graphs."""
    cuda_graph_max_batch: int = 256
    """Decode batches up to this size replay CUDA graphs; larger ones run eagerly."""
    num_scheduler_steps: int = 1
    """Decode steps run back to back on the device per host round trip when every running
    sequence decodes greedily and no waiting request could join: tokens then arrive k at a time
    and the GPU does not wait for the host between steps. 1: one step at a time."""
    async_scheduling: bool = True
    """Queue each step on the device before reading the last one's tokens (its inputs taken
    from the last step's output on the device), so the host's scheduling and bookkeeping
    overlap the device's work; tokens still stream one step at a time. A sequence found to have
    stopped discards the extra token computed for it. Steps with speculative decoding run
    synchronously whatever this says (their drafts need the tokens)."""
    async_multi_step: bool = True
    """With num_scheduler_steps > 1: queue the next multi-step run before reading the last
    one's tokens when it does not depend on them (same batch, nobody waiting to join), so the
    host's bookkeeping overlaps the device's work. A sequence that stopped (a stop token) in
    the earlier run discards what the next one computed for it."""
    speculative_method: Literal["none", "ngram", "draft"] = "none"
    """Speculative decoding: 'ngram' proposes from the sequence's own earlier tokens (prompt
    lookup), 'draft' from a small model (`speculative_model`); the output is unchanged (lossless)."""
    num_speculative_tokens: int = 4
    """Draft tokens proposed per sequence and step (with a speculative method)."""
    speculative_model: str | None = None
    """Draft model folder (Hugging Face format, the target's vocabulary) for 'draft'."""
    ngram_prompt_lookup_min: int = 1
    """Shortest suffix n-gram looked up by 'ngram'."""
    ngram_prompt_lookup_max: int = 4
    """Longest suffix n-gram looked up by 'ngram' (tried first)."""
    spec_fused_greedy: bool | None = None
    """With 'draft': run a step whose sequences all decode greedily as one device program (the
    draft's catch-up and k - 1 steps, verification, acceptance; one CUDA graph per batch width
    on a GPU) with one read-back, instead of three read-backs and host work between them (the
    unfused step, which steps with a sampled sequence always take). None: on with 'draft'
    (one read-back a step is what makes speculation pay at batch 1); False: always the unfused
    step; True: on, and an error without 'draft'."""
    spec_fused_rounds: int | None = None
    """With the fused step: rounds of draft, verification and acceptance per device program
    (one read-back for all of them, each round's inputs formed on the device from the last
    one's result), so the host's share of a step is paid once per this many verifications.
    Taken when every sequence of the step verifies all its drafts and holds the blocks for
    rounds x (num_speculative_tokens + 1) more tokens; tokens past a stop are computed and
    dropped. 1: one round a program. None: DEFAULT_FUSED_ROUNDS with the fused step (it was
    ahead of one round a program at batch 1 and 8 on both workloads of the speculative
    benchmark: spec_decode.json), else 1."""

    tensor_parallel_size: int = 1
    """Split the model over this many ranks (one process each, started by the engine; one GPU
    each on CUDA, NCCL; gloo on the CPU): attention heads, the KV cache's heads, the FFN and the
    vocabulary are divided among them. Must divide the model's KV heads, heads, FFN width and
    vocabulary. Tensor-parallel steps run eagerly (no CUDA graphs)."""
    quantization: Literal["none", "fp8"] = "none"
    """'fp8': quantize the decoder layers' projection weights to FP8 e4m3 with one scale per
    output channel at load (embedding, LM head and norms keep the model dtype). A CUDA GPU
    needs compute capability >= 8.9 (there the projections run W8A8 through
    `torch._scaled_mm`, activations scaled per token); the CPU runs a dequantizing reference.
    A folder stored in FP8 (config.json quant_method 'compressed-tensors' or 'fbgemm_fp8') is
    read as FP8 as stored, with or without this flag; any other quant_method is refused."""
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3"] = "auto"
    """'auto': the KV cache holds the model dtype. 'fp8' (or 'fp8_e4m3'): K and V are stored as
    float8_e4m3fn, one byte an element (twice the tokens in the same memory), with one float32
    scale per layer and KV head: the checkpoint's k_scale / v_scale when it has them, else 1
    (vLLM's default). Written as x / scale rounded to e4m3 (saturating at +-448 x scale), read
    back as e4m3 x scale with attention in float32 on the CPU and the 16-bit dtype on a GPU."""

    @property
    def fused_greedy(self) -> bool:
        """Whether the engine runs all-greedy speculative steps fused (`spec_fused_greedy`)."""
        return self.speculative_method == "draft" and self.spec_fused_greedy is not False

    @property
    def fused_rounds(self) -> int:
        """Rounds per fused program (`spec_fused_rounds`, its default resolved)."""
        if self.spec_fused_rounds is not None:
            return self.spec_fused_rounds
        return DEFAULT_FUSED_ROUNDS if self.fused_greedy else 1

    def __post_init__(self) -> None:
        for name, allowed in _ENGINE_CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"EngineArgs.{name}: expected one of {list(allowed)}, got {getattr(self, name)!r}"
                )
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _OWN_RANGE_CHECKS:
                continue
            if f.type in ("int", "int | None") and v is not None:
                _check_int("EngineArgs", f.name, v, lo=-(2**63), hi=2**63 - 1)
            elif f.type == "bool" and not isinstance(v, bool):
                raise TypeError(f"EngineArgs.{f.name} must be a bool, got {type(v).__name__}")
            elif f.type == "float":
                _check_float("EngineArgs", f.name, v)
        if self.model is None and self.load_format != "dummy":
            raise ValueError("EngineArgs.model: give a model folder, or --load-format dummy")
        if (
            self.load_format == "dummy"
            and self.model is None
            and self.dummy_shape not in DUMMY_SHAPES
        ):
            raise ValueError(
                f"EngineArgs.dummy_shape: unknown {self.dummy_shape!r}; "
                f"expected one of {sorted(DUMMY_SHAPES)}"
            )
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"EngineArgs.block_size must be a power of two, got {self.block_size}")
        if not (0.0 < self.gpu_memory_utilization <= 1.0):
            raise ValueError(
                f"EngineArgs.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ValueError(f"EngineArgs.num_gpu_blocks must be >= 1, got {self.num_gpu_blocks}")
        if not (self.cpu_kv_cache_gib > 0 and math.isfinite(self.cpu_kv_cache_gib)):
            raise ValueError(
                f"EngineArgs.cpu_kv_cache_gib must be > 0, got {self.cpu_kv_cache_gib}"
            )
        ram = _physical_memory_bytes()
        if ram is not None and self.cpu_kv_cache_gib * 2**30 > ram:
            raise ValueError(
                f"EngineArgs.cpu_kv_cache_gib: {self.cpu_kv_cache_gib:g} GiB exceeds this "
                f"machine's memory ({ram / 2**30:.1f} GiB)"
            )
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineArgs.{name} must be >= 1, got {getattr(self, name)}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                "EngineArgs.max_num_batched_tokens must be >= max_model_len without chunked "
                f"prefill (a whole prompt must fit one step), got {self.max_num_batched_tokens} "
                f"< {self.max_model_len}"
            )
        if self.cuda_graph_max_batch < 0:
            raise ValueError(
                f"EngineArgs.cuda_graph_max_batch must be >= 0, got {self.cuda_graph_max_batch}"
            )
        n = self.num_scheduler_steps
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64:
            raise ValueError(f"EngineArgs.num_scheduler_steps must be in [1, 64], got {n!r}")
        if n > 1 and self.speculative_method != "none":
            raise ValueError(
                "EngineArgs.num_scheduler_steps > 1 does not combine with speculative decoding "
                "(a speculative step already emits several tokens); use one or the other"
            )
        self._check_speculative()
        tp = self.tensor_parallel_size
        if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= MAX_TENSOR_PARALLEL:
            raise ValueError(
                f"EngineArgs.tensor_parallel_size must be in [1, {MAX_TENSOR_PARALLEL}], got {tp!r}"
            )
        if tp > 1 and self.speculative_method != "none":
            raise ValueError(
                "EngineArgs.tensor_parallel_size > 1 does not combine with speculative decoding "
                "yet (the draft model and the fused program run in one process)"
            )

    def _check_speculative(self) -> None:
        method = self.speculative_method
        if method not in ("none", "ngram", "draft"):
            raise ValueError(
                f"EngineArgs.speculative_method: expected 'none', 'ngram' or 'draft', got {method!r}"
            )
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 64:
            raise ValueError(f"EngineArgs.num_speculative_tokens must be in [1, 64], got {k!r}")
        if method == "draft" and not self.speculative_model:
            raise ValueError("EngineArgs.speculative_model: 'draft' needs a draft model folder")
        if method != "draft" and self.speculative_model is not None:
            raise ValueError(
                "EngineArgs.speculative_model is only used with speculative_method 'draft', "
                f"got it with {method!r}"
            )
        r = self.spec_fused_rounds
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 64):
            raise ValueError(f"EngineArgs.spec_fused_rounds must be in [1, 64], got {r!r}")
        if r is not None and r > 1 and not self.fused_greedy:
            raise ValueError(
                "EngineArgs.spec_fused_rounds > 1 needs the fused step (speculative_method "
                f"'draft', spec_fused_greedy not False), got {method!r}, {self.spec_fused_greedy}"
            )
        if self.spec_fused_greedy is True and method != "draft":
            raise ValueError(
                f"EngineArgs.spec_fused_greedy needs speculative_method 'draft', got {method!r}"
            )
        lo, hi = self.ngram_prompt_lookup_min, self.ngram_prompt_lookup_max
        if lo < 1:
            raise ValueError(f"EngineArgs.ngram_prompt_lookup_min must be >= 1, got {lo}")
        if hi < lo:
            raise ValueError(
                f"EngineArgs.ngram_prompt_lookup_max must be >= ngram_prompt_lookup_min ({lo}), "
                f"got {hi}"
            )


@dataclass
class StructuredOutputsParams:
    """A constraint on what a request may generate (vLLM's `structured_outputs` names): exactly
    one of a JSON schema, any JSON object, a regular expression, an EBNF grammar or a list of
    choices. The engine compiles it with xgrammar (the `structured` extra)."""

    json: dict | str | None = None
    """A JSON schema (an object, or its JSON text)."""
    json_object: bool = False
    """Any JSON object."""
    regex: str | None = None
    """A regular expression the whole output matches."""
    grammar: str | None = None
    """An EBNF grammar (xgrammar's GBNF dialect, rule `root` first)."""
    choice: list[str] | None = None
    """One of these strings, exactly."""
    # the compiled grammar, when the server compiled it already (checked there, answered 400)
    compiled: object | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = [
            k for k in ("json", "regex", "grammar", "choice") if getattr(self, k) is not None
        ] + (["json_object"] if self.json_object else [])
        if len(set_) != 1:
            raise ValueError(
                "structured_outputs: give exactly one of json, json_object, regex, grammar, "
                f"choice (got {set_ or 'none'})"
            )


@dataclass
class SamplingParams:
    """How one request is decoded (the OpenAI API's fields, vLLM's names)."""

    max_tokens: int = 16
    """Most tokens to generate."""
    temperature: float = 1.0
    """0 means greedy; so does anything below 1e-5 (the limit of the distribution)."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 keeps all (so does any k past the vocabulary)."""
    top_p: float = 1.0
    """Keep the smallest set of tokens whose probability reaches top_p."""
    min_p: float = 0.0
    """Drop tokens less likely than min_p times the most likely one."""
    seed: int | None = None
    """Per-request seed: the same seed gives the same tokens."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Stop when one of these is generated (it is kept in the output)."""
    stop: list[str] = field(default_factory=list)
    """Stop strings (need a tokenizer); the output is cut before the match. One string is taken
    as a list of one (never split into characters)."""
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token (benchmarks)."""
    logprobs: bool = False
    """Return the log-probability of each chosen token."""
    structured_outputs: StructuredOutputsParams | None = None
    """Constrain the output (JSON schema, JSON object, regex, EBNF grammar, choice); the token
    mask is applied in the sampler, see `engine.structured`."""

    def __post_init__(self) -> None:
        name = "SamplingParams"
        _check_int(name, "max_tokens", self.max_tokens, lo=1, hi=MAX_INT32)
        self.temperature = _check_float(name, "temperature", self.temperature)
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise ValueError(
                f"SamplingParams.temperature must be in [0, {MAX_TEMPERATURE:g}], "
                f"got {self.temperature}"
            )
        if self.temperature < MIN_TEMPERATURE:
            # logits / T overflows float32 for tiny T (inf - inf = NaN in the softmax); the
            # distribution's limit as T -> 0 is the argmax, which is what greedy decoding takes
            self.temperature = 0.0
        _check_int(name, "top_k", self.top_k, lo=0, hi=MAX_INT32)
        self.top_p = _check_float(name, "top_p", self.top_p)
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        self.min_p = _check_float(name, "min_p", self.min_p)
        if not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"SamplingParams.min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None:
            _check_int(name, "seed", self.seed, lo=0, hi=2**63 - 1)
        ids = self.stop_token_ids
        if not isinstance(ids, (list, tuple)):
            raise TypeError(
                f"SamplingParams.stop_token_ids must be a list of ints, got {type(ids).__name__}"
            )
        if len(ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(
                f"SamplingParams.stop_token_ids: at most {MAX_STOP_TOKEN_IDS}, got {len(ids)}"
            )
        for t in ids:
            _check_int(name, "stop_token_ids", t, lo=0, hi=MAX_INT32)
        self.stop_token_ids = list(ids)
        self.stop = _check_stop(self.stop)
        so = self.structured_outputs
        if isinstance(so, dict):
            self.structured_outputs = so = StructuredOutputsParams(**so)
        if so is not None and not isinstance(so, StructuredOutputsParams):
            raise TypeError(
                "SamplingParams.structured_outputs must be a StructuredOutputsParams or a dict, "
                f"got {type(so).__name__}"
            )
        for flag in ("ignore_eos", "logprobs"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(
                    f"SamplingParams.{flag} must be a bool, got {type(getattr(self, flag)).__name__}"
                )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
