"""What the engine is measured against, each run on the same `Workload`.

- `run_transformers`: Hugging Face `generate` on a randomly initialised `LlamaForCausalLM`, static
  batches, greedy, `min_new_tokens = max_new_tokens` so that EOS never ends a request early.
- `StaticCudaGraphDecoder` / `decode_step_ms` / `generate_static`: a plain PyTorch Llama with a
  static KV cache of (B, Hkv, max_len, D), SDPA attention and the whole decode step captured in
  one CUDA graph (the gpt-fast recipe). Batches are static: every request is left-padded to the
  batch's longest prompt and decoded to the batch's longest output. That waste is what paged KV
  and continuous batching remove, so it is kept, and counted.
- `run_vllm`: vLLM's offline `LLM.generate` where `import vllm` works; elsewhere a record that
  says "not measured here" with the import error. No figure is ever filled in.

Every rate is useful tokens (what the requests asked for) over wall time; padded and overrun
tokens are reported apart.
"""

from __future__ import annotations

import gc
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# --- the workload every runner consumes -------------------------------------------------------


@dataclass
class Workload:
    """Requests as token ids, each with the exact number of tokens it must generate."""

    prompts: list[list[int]]
    output_lens: list[int]

    def __post_init__(self) -> None:
        if len(self.prompts) != len(self.output_lens):
            raise ValueError(
                f"{len(self.prompts)} prompts for {len(self.output_lens)} output lengths"
            )

    def __len__(self) -> int:
        return len(self.prompts)

    def head(self, n: int) -> Workload:
        """The first n requests (a subsample keeps arrival order, so its batches are the same)."""
        return Workload(self.prompts[:n], self.output_lens[:n])

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)

    def batches(self, batch_size: int):
        for i in range(0, len(self), batch_size):
            yield self.prompts[i : i + batch_size], self.output_lens[i : i + batch_size]


def not_measured(reason: str, **extra) -> dict:
    return {"measured": False, "reason": reason, **extra}


def _rates(wl: Workload, wall_s: float, **extra) -> dict:
    return {
        "measured": True,
        "requests": len(wl),
        "prompt_tokens": wl.prompt_tokens,
        "output_tokens": wl.output_tokens,
        "wall_s": wall_s,
        "output_tok_s": wl.output_tokens / wall_s,  # tokens/s
        "total_tok_s": (wl.prompt_tokens + wl.output_tokens) / wall_s,  # tokens/s
        **extra,
    }


def free_cuda() -> None:
    """Give memory back before the next system loads: each sizes itself from free memory."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())


# --- static-batch CUDA-graph baseline (plain PyTorch) ------------------------------------------


def rope_inv_freq(c: dict) -> torch.Tensor:
    """(D/2,) float32 inverse frequencies, with Llama-3's long-context rescaling when configured."""
    d = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    inv = 1.0 / c.get("rope_theta", 10_000.0) ** (torch.arange(0, d, 2).float() / d)
    rs = c.get("rope_scaling") or {}
    if rs.get("rope_type", rs.get("type")) != "llama3":
        return inv
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old_len, wavelen = rs["original_max_position_embeddings"], 2 * math.pi / inv
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    smooth = (old_len / wavelen - lo) / (hi - lo)
    mid = (1 - smooth) * inv / factor + smooth * inv
    out = torch.where(wavelen > old_len / lo, inv / factor, inv)
    return torch.where((wavelen <= old_len / lo) & (wavelen >= old_len / hi), mid, out)


def _rope(x, cos, sin):  # rotate-half RoPE (HF's layout) on x (B, H, S, D); cos, sin (S, D/2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class _Block(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        h, inter, eps = c["hidden_size"], c["intermediate_size"], c["rms_norm_eps"]
        self.d = c.get("head_dim") or h // c["num_attention_heads"]
        self.nq, self.nkv = c["num_attention_heads"], c["num_key_value_heads"]
        self.wqkv = nn.Linear(h, (self.nq + 2 * self.nkv) * self.d, bias=False)  # q, k, v: 1 GEMM
        self.wo = nn.Linear(self.nq * self.d, h, bias=False)
        self.w13 = nn.Linear(h, 2 * inter, bias=False)  # gate and up in one GEMM
        self.w2 = nn.Linear(inter, h, bias=False)
        self.attn_norm, self.mlp_norm = nn.RMSNorm(h, eps=eps), nn.RMSNorm(h, eps=eps)

    def forward(self, x, cos, sin, kc, vc, pos, mask):  # x (B, S, H); kc, vc (B, Hkv, L, D)
        b, s, _ = x.shape
        qkv = self.wqkv(self.attn_norm(x)).view(b, s, -1, self.d).transpose(1, 2)
        q, k, v = qkv.split([self.nq, self.nkv, self.nkv], dim=1)  # (B, H*, S, D)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        if pos is None:  # prefill from position 0: attend to the new tokens only
            kc[:, :, :s], vc[:, :, :s] = k, v
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:  # one token per row at position `pos` (1,): graph-safe cache write, masked read
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            # GQA with one query token: the G heads sharing a KV head become its G query rows, so
            # any SDPA backend reads the cache once, unexpanded.
            qg = q.reshape(b, self.nkv, self.nq // self.nkv, self.d)
            o = F.scaled_dot_product_attention(qg, kc, vc, attn_mask=mask).view(b, -1, 1, self.d)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        gate, up = self.w13(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class StaticLlama(nn.Module):
    """The Llama of an HF config dict (GQA, RoPE, SwiGLU, RMSNorm, tied embeddings or not) with
    a static KV cache from `setup_cache`. Its weights mirror HF's with q/k/v and gate/up fused."""

    def __init__(self, c: dict):
        super().__init__()
        self.c, h, v = c, c["hidden_size"], c["vocab_size"]
        self.embed = nn.Embedding(v, h)
        self.layers = nn.ModuleList(_Block(c) for _ in range(c["num_hidden_layers"]))
        self.norm = nn.RMSNorm(h, eps=c["rms_norm_eps"])
        self.lm_head = None if c.get("tie_word_embeddings") else nn.Linear(h, v, bias=False)
        self.cache_len = 0  # cache positions the decode step reads (<= max_len)

    def setup_cache(self, max_batch: int, max_len: int) -> None:
        w, blk = self.embed.weight, self.layers[0]
        shape = (max_batch, blk.nkv, max_len, blk.d)  # (B, Hkv, max_len, D) per layer
        self.k_cache = [w.new_zeros(shape) for _ in self.layers]
        self.v_cache = [w.new_zeros(shape) for _ in self.layers]
        freqs = torch.outer(torch.arange(max_len).float(), rope_inv_freq(self.c)).to(w.device)
        self.cos, self.sin = freqs.cos(), freqs.sin()  # (max_len, D/2) float32
        self.positions, self.cache_len = torch.arange(max_len, device=w.device), max_len

    def forward(self, tokens, pos=None, rows=slice(None)):
        """tokens (B, S) -> logits of the last position (B, V). pos None: prefill cache rows
        `rows` from position 0; pos (1,) int64: decode one token in every row."""
        x, n = self.embed(tokens), self.cache_len
        if pos is None:
            idx, mask = torch.arange(tokens.shape[1], device=x.device), None
        else:
            idx, mask = pos, (self.positions[:n] <= pos).view(1, 1, 1, n)
        cos, sin = self.cos[idx].to(x.dtype), self.sin[idx].to(x.dtype)
        for layer, kc, vc in zip(self.layers, self.k_cache, self.v_cache):
            x = layer(x, cos, sin, kc[rows, :, :n], vc[rows, :, :n], pos, mask)
        x = self.norm(x[:, -1])  # the last position only: (B, V) logits, never (B, S, V)
        return F.linear(x, self.embed.weight if self.lm_head is None else self.lm_head.weight)


class StaticCudaGraphDecoder:
    """A StaticLlama with random weights (std 0.02), a static cache of `max_batch` rows and
    greedy decoding; on CUDA the decode step (forward, argmax, token write-back) is one graph."""

    def __init__(
        self,
        c: dict,
        max_batch: int,
        max_len: int,
        *,
        dtype=torch.bfloat16,
        device: str = "cuda",
        seed: int = 0,
    ):
        torch.manual_seed(seed)
        with torch.device(device):
            self.model = StaticLlama(c).to(dtype).eval()
        for p in (p for n, p in self.model.named_parameters() if "norm" not in n):
            nn.init.normal_(p, std=0.02)
        self.model.setup_cache(max_batch, max_len)
        self.tok = torch.zeros(max_batch, 1, dtype=torch.long, device=device)  # (B, 1) next input
        self.pos = torch.zeros(1, dtype=torch.long, device=device)  # position being written
        self.graph: torch.cuda.CUDAGraph | None = None
        self.pool = torch.cuda.graph_pool_handle() if device == "cuda" else None

    @torch.no_grad()
    def _decode(self) -> None:
        self.tok.copy_(self.model(self.tok, self.pos).argmax(-1, keepdim=True))

    @torch.no_grad()
    def capture(self, cache_len: int) -> None:
        """(Re)capture the decode step reading `cache_len` positions (eager on the CPU)."""
        self.model.cache_len, self.graph = cache_len, None
        if self.tok.device.type != "cuda":
            return
        saved = self.tok.clone()  # the warm-up below overwrites the next input
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the capture: cuBLAS handles, SDPA choice
            for _ in range(2):
                self._decode()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=self.pool):
            self._decode()
        self.tok.copy_(saved)

    def step(self) -> None:
        """One decode step: writes K/V at `pos`, puts the argmax token into `tok`."""
        self._decode() if self.graph is None else self.graph.replay()

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, chunk_tokens: int = 65_536) -> None:
        """tokens (B, S): fill the cache from position 0, first generated token into `tok`.
        Rows go in chunks of <= chunk_tokens tokens: activations of (B*S, 2 x intermediate) would
        otherwise need tens of GB at batch 256 x 2,048."""
        b, s = tokens.shape
        self.model.cache_len = s
        per = max(1, chunk_tokens // s)
        for r in range(0, b, per):
            rows = slice(r, min(b, r + per))
            self.tok[rows] = self.model(tokens[rows], rows=rows).argmax(-1, keepdim=True)
        self.pos.fill_(s)


def decode_step_ms(c: dict, batch: int, context: int, *, dtype=torch.bfloat16) -> float:
    """Median ms of one graph-replayed decode step at `batch` rows that each hold `context`
    tokens of cache (cache contents are zeros: the bytes read, not their values, set the time)."""
    return decode_step_times(c, batch, context, 1, dtype=dtype)[0]


def decode_step_times(
    c: dict, batch: int, context: int, repeats: int, *, dtype=torch.bfloat16
) -> list[float]:
    """`repeats` repetitions of `decode_step_ms` on one decoder and one captured graph (built
    once: capture is not what is timed), each the median ms of its own timed replays."""
    from shared.timing import benchmark

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    dec = StaticCudaGraphDecoder(c, batch, context + 1, dtype=dtype)
    dec.pos.fill_(context)  # every replay writes the same slot, so the context stays fixed
    dec.capture(context + 1)
    times = [benchmark(dec.step, warmup_ms=100, rep_ms=500).median_ms for _ in range(repeats)]
    del dec
    free_cuda()
    return times


def decode_step_times_compiled(
    c: dict, batch: int, context: int, repeats: int, *, dtype=torch.bfloat16
) -> list[float]:
    """The gpt-fast recipe at one shape: the same static-cache decode step (forward, argmax,
    token write-back) under `torch.compile(mode="reduce-overhead", fullgraph=True)`, so Inductor
    fuses the step's element-wise work and CUDA graphs replay it. `repeats` repetitions, each
    the median ms of its own timed steps, after the compile (which is not timed)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    times = _compiled_step_times(c, batch, context, repeats, dtype)
    torch._dynamo.reset()  # the compiled step and its graphs go with this shape
    free_cuda()
    return times


def _compiled_step_times(c: dict, batch: int, context: int, repeats: int, dtype) -> list[float]:
    from shared.timing import benchmark

    dec = StaticCudaGraphDecoder(c, batch, context + 1, dtype=dtype)
    dec.pos.fill_(context)  # every step writes the same slot, so the context stays fixed
    dec.model.cache_len = context + 1
    model = dec.model

    def step(tok, pos):
        return model(tok, pos).argmax(-1, keepdim=True)

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)

    @torch.no_grad()
    def one() -> None:
        # compiled CUDA graphs own their outputs: copy the token out before the next replay
        dec.tok.copy_(compiled(dec.tok, dec.pos))

    for _ in range(3):  # compile, record the graph, then replay
        one()
    return [benchmark(one, warmup_ms=100, rep_ms=500).median_ms for _ in range(repeats)]


def generate_static(
    c: dict,
    wl: Workload,
    *,
    batch_size: int = 256,
    dtype=torch.bfloat16,
    pad_id: int = 0,
    device: str = "cuda",
) -> dict:
    """Static batching through StaticCudaGraphDecoder, in arrival order. Prompts are left-padded
    and the pads are attended to (no padding mask): the work and bytes are those of a masked run,
    which is what the rate measures; the tokens are not compared with anything."""
    plan = [(max(map(len, p)), max(o)) for p, o in wl.batches(batch_size)]
    max_len = max(s + m for s, m in plan)
    dec = StaticCudaGraphDecoder(c, batch_size, max_len, dtype=dtype, device=device)
    dec.prefill(torch.full((batch_size, min(16, max_len)), pad_id, device=device))  # warm-up
    padded_prompt = computed_out = 0
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    with _progress() as bar:
        task = bar.add_task("static CUDA-graph batches", total=len(plan))
        for (prompts, _), (s, m) in zip(wl.batches(batch_size), plan):
            # Rows past the last request stay pads: a static batch has a fixed shape.
            tokens = torch.full((batch_size, s), pad_id, dtype=torch.long)
            for i, p in enumerate(prompts):
                tokens[i, s - len(p) :] = torch.tensor(p)
            dec.prefill(tokens.to(device))
            dec.capture(s + m)
            for _ in range(m - 1):  # prefill gave the first token; tokens stay on the GPU
                dec.step()
                dec.pos.add_(1)
            sync()
            padded_prompt += batch_size * s
            computed_out += batch_size * m
            bar.advance(task)
    wall = time.perf_counter() - t0
    del dec
    free_cuda()
    return _rates(
        wl,
        wall,
        batch_size=batch_size,
        batches=len(plan),
        padded_prompt_tokens=padded_prompt,
        computed_output_tokens=computed_out,
        output_waste_fraction=1 - wl.output_tokens / computed_out,
    )


# --- transformers generate ---------------------------------------------------------------------


def run_transformers(
    c: dict,
    wl: Workload,
    *,
    batch_size: int = 64,
    dtype=torch.bfloat16,
    device: str = "cuda",
    seed: int = 0,
) -> dict:
    """HF generate, static batches in arrival order, greedy, exactly each batch's longest output."""
    try:
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        return not_measured(f"not measured here: {e}")
    torch.manual_seed(seed)
    with torch.device(device):  # initializer_range 0.02: HF's own init
        model = LlamaForCausalLM(LlamaConfig(**{**c, "initializer_range": 0.02})).to(dtype).eval()
    pad = c.get("eos_token_id") or 0
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model.generate(
        torch.full((1, 8), 5, device=device),
        max_new_tokens=4,
        min_new_tokens=4,
        do_sample=False,
        pad_token_id=pad,
    )  # warm-up, untimed
    sync()
    t0 = time.perf_counter()
    n_batches = math.ceil(len(wl) / batch_size)
    with _progress() as bar:
        task = bar.add_task("transformers generate batches", total=n_batches)
        for prompts, outs in wl.batches(batch_size):
            s, m = max(map(len, prompts)), max(outs)
            ids = torch.full((len(prompts), s), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, p in enumerate(prompts):  # left padding, masked: HF's batched-generate recipe
                ids[i, s - len(p) :], mask[i, s - len(p) :] = torch.tensor(p), 1
            with torch.no_grad():
                model.generate(
                    ids.to(device),
                    attention_mask=mask.to(device),
                    max_new_tokens=m,
                    min_new_tokens=m,
                    do_sample=False,
                    pad_token_id=pad,
                )
            sync()
            bar.advance(task)
    wall = time.perf_counter() - t0
    del model
    free_cuda()
    return _rates(wl, wall, batch_size=batch_size, transformers=transformers.__version__)


# --- vLLM -------------------------------------------------------------------------------------


def hf_config_json(c: dict, dtype: str = "bfloat16") -> dict:
    """config.json of a Llama folder with this shape: what vLLM reads to build dummy weights."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "torch_dtype": dtype,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        **c,
    }


def vllm_inputs(vllm, wl: Workload) -> tuple[list[dict], list]:
    """The workload as vLLM prompts (token ids, no tokenizer) and one SamplingParams each:
    greedy, exactly output_len tokens (ignore_eos and min_tokens both, so nothing stops early)."""
    prompts = [{"prompt_token_ids": list(p)} for p in wl.prompts]
    params = [
        vllm.SamplingParams(
            temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True, detokenize=False
        )
        for n in wl.output_lens
    ]
    return prompts, params


def run_vllm(
    wl: Workload,
    c: dict | None = None,
    *,
    max_model_len: int = 4096,
    gpu_memory_utilization: float = 0.85,
    seed: int = 0,
) -> dict:
    """vLLM offline generate on dummy weights of shape `c` (default Llama-3.2-1B)."""
    try:
        import vllm
    except ImportError as e:
        return not_measured(f"not measured here: import vllm failed: {e}")
    if c is None:
        from ..config import DUMMY_SHAPES

        c = DUMMY_SHAPES["llama-3.2-1b"]
    prompts, params = vllm_inputs(vllm, wl)
    with tempfile.TemporaryDirectory() as model_dir:
        (Path(model_dir) / "config.json").write_text(json.dumps(hf_config_json(c)))
        try:
            llm = vllm.LLM(
                model=model_dir,
                load_format="dummy",
                skip_tokenizer_init=True,
                dtype="bfloat16",
                max_model_len=max_model_len,
                seed=seed,
                gpu_memory_utilization=gpu_memory_utilization,
            )
            # Warm-up on a few short requests: compilation and graph capture stay out of the time.
            llm.generate(prompts[:8], params[:8], use_tqdm=False)
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=True)
            wall = time.perf_counter() - t0
        except Exception as e:  # a vLLM that imports but cannot run here: say so, no figure
            return not_measured(f"not measured here: vLLM failed: {type(e).__name__}: {e}")
    produced = sum(len(o.outputs[0].token_ids) for o in outs)
    del llm
    free_cuda()
    return _rates(wl, wall, vllm=getattr(vllm, "__version__", None), produced_tokens=produced)
