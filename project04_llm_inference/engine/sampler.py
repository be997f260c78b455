"""Sampling on the device, for a batch of requests with their own parameters.

Greedy rows take the argmax. Other rows: temperature, then top-k, top-p and min-p filters
(`request_probs`: the request's distribution, which speculative decoding's verifier uses too),
then a draw by the exponential race (`race`: argmax of p / E with E ~ Exp(1), which picks token
i with probability p_i). A request with a seed draws its E from its own generator, so the same
seed gives the same tokens whatever else is in the batch. Logprobs are those of the model's
distribution (raw logits, before temperature and filters), as vLLM returns them.

Rows of requests with structured output first get their grammar's token mask
(`structured.apply_grammar_masks`, on the logits' device): forbidden tokens become -inf before
any of the above, so greedy, filtered and random draws all stay inside the grammar.
"""

from __future__ import annotations

import torch

from ..config import MIN_TEMPERATURE, SamplingParams
from .inputs import device_tensor
from .sequence import Sequence


def _filter(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor):
    """Mask to -inf what each row's top-k (0 = off), top-p and min-p drop. logits (N, V) fp32."""
    v = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    ranks = torch.arange(v, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, v)[:, None]
    drop = ranks >= k
    # top-p: keep a token while the mass before it is < p
    mass_before = probs.cumsum(-1) - probs
    drop |= mass_before >= top_p[:, None]
    drop |= probs < min_p[:, None] * probs[:, :1]
    # the top token is always kept, whatever the filters say (a top_p that rounds to 0 in
    # float32 would drop every token, and a softmax over all -inf is NaN)
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def request_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """(N, V) float32 logits, one row per params -> (N, V) probabilities after each row's
    temperature, top-k, top-p and min-p. A greedy row (temperature 0) gets its temperature-1
    distribution: callers take the argmax of the logits for those rows instead."""
    dev = logits.device
    # SamplingParams makes temperatures below MIN_TEMPERATURE greedy; the floor here keeps a
    # hand-built params object from dividing by a float32 zero
    temps = [max(p.temperature, MIN_TEMPERATURE) if p.temperature > 0 else 1.0 for p in params]
    scaled = logits / device_tensor(temps, dev)[:, None]
    if any(p.top_k or p.top_p < 1 or p.min_p > 0 for p in params):
        v = logits.shape[-1]
        scaled = _filter(
            scaled,
            # any k past the vocabulary keeps everything (and stays within int64)
            device_tensor([min(p.top_k, v) for p in params], dev),
            device_tensor([p.top_p for p in params], dev),
            device_tensor([p.min_p for p in params], dev),
        )
    return scaled.softmax(-1)


def exponential_noise(
    shape: tuple[int, int],
    generators: list[torch.Generator | None],
    generator: torch.Generator | None,
    device: torch.device,
) -> torch.Tensor:
    """(N, V) Exp(1) noise: row i from generators[i] when it is not None (a seeded request: its
    own stream, independent of the batch), the other rows from `generator`."""
    noise = torch.empty(shape, device=device)
    noise.exponential_(generator=generator)
    for i, g in enumerate(generators):
        if g is not None:
            noise[i].exponential_(generator=g)
    return noise


def race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """One draw per row of probs (N, V) (rows need not be normalised): argmax of p / E."""
    return (probs / noise).argmax(-1)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits (N, V) -> (N,) int64, exactly `logits.argmax(-1)` (the first maximum wins).

    For a few rows of a large vocabulary, torch's argmax reduces each row in one CTA, a
    noticeable share of a batch-1 decode step. Cut into chunks instead:
    the maximum of every chunk in parallel, then the first chunk holding the largest of them,
    then the position inside it (`max` along a dim returns the first maximal index too).
    """
    n, v = logits.shape
    if n <= 8 and v >= 16384:
        for chunks in (256, 128, 512, 64):
            if v % chunks == 0:
                vals, idx = logits.reshape(n, chunks, v // chunks).max(-1)  # (N, chunks)
                best = vals.argmax(-1)  # (N,)
                return best * (v // chunks) + idx.gather(-1, best[:, None])[:, 0]
    return logits.argmax(-1)


def sample(logits: torch.Tensor, seqs: list[Sequence], generator: torch.Generator | None = None):
    """logits (N, V) float32, one row per sequence -> (token ids (N,), logprobs (N,) or None)."""
    n = logits.shape[0]
    dev = logits.device
    params = [s.params for s in seqs]
    raw = logits
    if any(s.grammar is not None for s in seqs):
        from .structured import apply_grammar_masks

        if any(p.logprobs for p in params):
            logits = logits.clone()  # logprobs stay those of the model's distribution
        apply_grammar_masks(logits, [s.grammar for s in seqs])
    tokens = argmax_rows(logits)
    if not all(p.greedy for p in params):
        greedy = device_tensor([p.greedy for p in params], dev)
        probs = request_probs(logits, params)
        gens = [None if p.greedy else s.generator for s, p in zip(seqs, params)]
        drawn = race(probs, exponential_noise(probs.shape, gens, generator, dev))
        tokens = torch.where(greedy, tokens, drawn)
    logprobs = None
    if any(p.logprobs for p in params):
        logprobs = raw.log_softmax(-1).gather(-1, tokens[:, None])[:, 0]
    assert tokens.shape == (n,)
    return tokens, logprobs
