"""The acceptance rule of speculative sampling (Leviathan et al. 2023, Chen et al. 2023).

A proposer suggests draft tokens x_1..x_k, drawn from its distributions q_1..q_k; one target
forward gives the target's distributions p_1..p_{k+1} at the same positions. Scanning left to
right, x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection one
token is drawn from the residual norm(max(0, p_i - q_i)) and the scan ends; when every draft is
accepted, a bonus token is drawn from p_{k+1}. Each emitted token is then distributed exactly as
if drawn from the target alone, whatever q is: speculation changes the speed, not the output.

- q = None means point-mass proposals (n-gram lookup): q_i is one-hot at x_i, so x_i is accepted
  with probability p_i(x_i) and the residual is p_i with x_i removed, renormalised.
- Greedy rows (temperature 0): x_i is accepted while it equals the target's argmax, and the
  token emitted after the accepted run is the target's argmax there.
- p and q must both be the request's distributions after temperature / top-k / top-p / min-p
  (`engine.sampler.request_probs`), or the output is that of another distribution.

Randomness: per row, k uniforms (acceptance) then V exponentials (the one final draw, by the
exponential race), always the same amount whatever is accepted; a seeded request draws both from
its own generator, so its tokens do not depend on the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.sampler import race


@dataclass
class Verified:
    tokens: list[list[int]]  # per row: the accepted drafts, then one residual or bonus token
    num_accepted: list[int]  # per row: how many drafts were accepted


def draw_uniforms(
    n: int,
    width: int,
    generators: list[torch.Generator | None],
    generator: torch.Generator | None,
    device: torch.device,
) -> torch.Tensor:
    """(n, width) U[0, 1): row i from generators[i] when given (a seeded request), the other
    rows from `generator`."""
    u = torch.rand((n, width), generator=generator, device=device)
    for i, g in enumerate(generators):
        if g is not None:
            u[i] = torch.rand(width, generator=g, device=device)
    return u


def verify(
    target_logits: torch.Tensor,  # (B, K + 1, V) float32 raw logits (greedy rows' argmax)
    target_probs: torch.Tensor,  # (B, K + 1, V) the request's target distributions p
    draft_tokens: torch.Tensor,  # (B, K) int64, row b valid in its first num_drafts[b] columns
    num_drafts: torch.Tensor,  # (B,) int64 in [0, K]
    draft_probs: torch.Tensor | None,  # (B, K, V) the draft's distributions q; None: one-hot
    greedy: torch.Tensor,  # (B,) bool
    uniforms: torch.Tensor,  # (B, >= K) U[0, 1), for the acceptance tests
    noise: torch.Tensor,  # (B, V) Exp(1), for the one final draw
) -> Verified:
    """Apply the acceptance rule to every row at once (no host sync until the result)."""
    b, k1, _ = target_probs.shape
    k = k1 - 1
    dev = target_probs.device
    rows = torch.arange(b, device=dev)
    valid = torch.arange(k, device=dev)[None, :] < num_drafts[:, None]  # (B, K)

    # acceptance of each draft, as if every earlier one had been accepted
    p_x = target_probs[:, :k].gather(-1, draft_tokens[..., None])[..., 0]  # (B, K)
    if draft_probs is None:
        q_x = torch.ones_like(p_x)
    else:
        q_x = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
    # P(u * q < p) = min(1, p / q) for u ~ U[0, 1), without dividing by a zero q
    sampled_ok = uniforms[:, :k] * q_x < p_x
    argmax = target_logits.argmax(-1)  # (B, K + 1)
    greedy_ok = draft_tokens == argmax[:, :k]
    ok = torch.where(greedy[:, None], greedy_ok, sampled_ok) & valid
    num_acc = ok.long().cumprod(-1).sum(-1)  # (B,): the leading run of acceptances

    # the final token: a residual draw at the first rejection, or a bonus draw after the last
    p_j = target_probs[rows, num_acc]  # (B, V)
    rejected = num_acc < num_drafts
    j = num_acc.clamp(max=max(k - 1, 0))
    if k == 0:
        final_dist = p_j
    else:
        if draft_probs is None:
            q_j = torch.zeros_like(p_j)
            q_j[rows, draft_tokens[rows, j]] = 1.0
        else:
            q_j = draft_probs[rows, j]
        residual = (p_j - q_j).clamp(min=0)
        # a zero residual means p == q on that row: no rejection can happen there in exact
        # arithmetic; rounding may still reject, and then p itself is the right distribution
        empty = residual.sum(-1, keepdim=True) <= 0
        residual = torch.where(empty, p_j, residual)
        final_dist = torch.where(rejected[:, None], residual, p_j)
    drawn = race(final_dist, noise)
    final = torch.where(greedy, argmax[rows, num_acc], drawn)

    num_acc_l, final_l, drafts_l = num_acc.tolist(), final.tolist(), draft_tokens.tolist()
    tokens = [drafts_l[i][: num_acc_l[i]] + [final_l[i]] for i in range(b)]
    return Verified(tokens=tokens, num_accepted=num_acc_l)
