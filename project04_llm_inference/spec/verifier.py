"""The engine's side of verification: from the target's logits rows of a step to the tokens each
speculating sequence emits.

A sequence scheduled with its last sampled token and k drafts has k + 1 consecutive logits rows
(the target's distributions after the last token and after each draft). The rows of every such
sequence are gathered into a padded (B, K + 1, V) batch, turned into the requests'
distributions p (`request_probs`: the same temperature and filters as plain sampling) and given
to the acceptance rule with the drafts and, for a draft model, its distributions q.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.sampler import argmax_rows, exponential_noise, request_probs
from ..engine.sequence import Sequence
from .rejection import Verified, draw_uniforms, verify


@dataclass
class SpecGroup:
    seq: Sequence
    first_row: int  # its k + 1 rows in the step's logits start here
    q_row: int | None  # its row in the proposer's q, None for point-mass drafts


def verify_groups(
    logits: torch.Tensor,
    groups: list[SpecGroup],
    q: torch.Tensor | None,
    generator: torch.Generator | None,
    k_max: int,
) -> tuple[Verified, list[list[float]] | None]:
    """Emitted tokens of each group (accepted drafts + one more) and, when any request asks for
    them, their logprobs under the raw logits. `k_max` (the engine's k) fixes how many uniforms a
    seeded request consumes per step, whatever its k this step."""
    params = [g.seq.params for g in groups]
    if all(p.greedy and not p.logprobs for p in params):
        return _verify_greedy(logits, groups), None
    dev = logits.device
    b = len(groups)
    ks = [len(g.seq.spec_token_ids) for g in groups]
    width = max(ks)
    # (B, K + 1) row indices; a shorter group repeats its last row (masked by num_drafts)
    index = torch.tensor(
        [[g.first_row + min(j, k) for j in range(width + 1)] for g, k in zip(groups, ks)],
        device=dev,
    )
    target_logits = logits[index]  # (B, K + 1, V)
    vocab = target_logits.shape[-1]
    greedy_l = [p.greedy for p in params]
    drafts = torch.tensor([g.seq.spec_token_ids + [0] * (width - k) for g, k in zip(groups, ks)])
    num_drafts = torch.tensor(ks, device=dev)
    greedy = torch.tensor(greedy_l, device=dev)
    if all(greedy_l):  # the argmax rule needs neither distributions nor randomness
        probs, draft_probs = target_logits, None
        uniforms = torch.zeros(b, width, device=dev)
        noise = torch.ones(b, vocab, device=dev)
    else:
        rep = [p for p in params for _ in range(width + 1)]
        probs = request_probs(target_logits.reshape(-1, vocab), rep).view(b, width + 1, vocab)
        draft_probs = None
        if q is not None:
            rows = [g.q_row if g.q_row is not None else 0 for g in groups]
            draft_probs = q[rows, :width]
        gens = [None if p.greedy else g.seq.generator for g, p in zip(groups, params)]
        uniforms = draw_uniforms(b, max(k_max, width), gens, generator, dev)
        noise = exponential_noise((b, vocab), gens, generator, dev)
    result = verify(
        target_logits, probs, drafts.to(dev), num_drafts, draft_probs, greedy, uniforms, noise
    )
    logprobs = None
    if any(p.logprobs for p in params):
        lsm = target_logits.log_softmax(-1)
        logprobs = [
            [float(lsm[i, j, t]) for j, t in enumerate(toks)]
            for i, toks in enumerate(result.tokens)
        ]
    return result, logprobs


def _verify_greedy(logits: torch.Tensor, groups: list[SpecGroup]) -> Verified:
    """The argmax rule for all-greedy groups: one argmax over the step's rows and one read-back,
    then on the host: the leading drafts equal to the target's argmax are accepted and the
    argmax after them is emitted (what `verify` computes for greedy rows, without its (B, V)
    work for sampled ones)."""
    am = argmax_rows(logits).tolist()
    tokens, accepted = [], []
    for g in groups:
        drafts = g.seq.spec_token_ids
        row = am[g.first_row : g.first_row + len(drafts) + 1]
        n = 0
        while n < len(drafts) and drafts[n] == row[n]:
            n += 1
        tokens.append(drafts[:n] + [row[n]])
        accepted.append(n)
    return Verified(tokens=tokens, num_accepted=accepted)
