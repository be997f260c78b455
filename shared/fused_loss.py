"""The output projection and the cross-entropy together, in chunks of tokens.

A language model's last two steps, logits = h W^T and the mean cross-entropy over them, are the
largest tensors of a training step: (tokens, vocab) logits in the compute dtype, their float32
copy for the softmax, and the gradient of both. `linear_cross_entropy` never holds more than one
chunk of them: for each chunk of `chunk` tokens it forms the chunk's logits (in h's dtype, then
float32, as the unfused `F.cross_entropy(F.linear(h, W).float(), t)` does), its log-sum-exp and
loss, and at once the chunk's gradient, softmax - onehot(target), divided by the token count and
rounded to h's dtype (the dtype autograd would hand the projection), from which it forms the
chunk's rows of dL/dh and adds the chunk's term of dL/dW (float32 accumulation across chunks).
Backward only scales the stored gradients by the incoming one. The idea is the one of Liger
Kernel's fused linear cross-entropy; this is a plain PyTorch version (cuBLAS GEMMs and PyTorch
element-wise kernels), no Triton needed.

Gradients are formed before any loss scaling is applied, so in float16 small ones would flush to
zero before a GradScaler could lift them: the callers use it for bfloat16, float8 and float32
training, not float16.
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK = 4096  # tokens per chunk: (4096, 32k vocab) float32 logits are 512 MiB


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, chunk):
        n = h.shape[0]
        acc = torch.promote_types(h.dtype, torch.float32)  # float32, or float64 for float64
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        total = torch.zeros((), dtype=acc, device=h.device)
        for s in range(0, n, chunk):
            hc, tc = h[s : s + chunk], targets[s : s + chunk, None]
            logits = (hc @ weight.T).to(acc)  # (c, V): h's dtype, then float32, as unfused
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)
            total += (lse - logits.gather(1, tc)).sum()
            g = logits.sub_(lse).exp_()  # softmax, in place of the logits
            g.scatter_add_(1, tc, torch.full_like(tc, -1.0, dtype=g.dtype))
            g = g.div_(n).to(h.dtype)  # d(mean loss)/d(logits), in the projection's dtype
            grad_h[s : s + chunk] = g @ weight
            grad_w += (g.T @ hc).to(acc)
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        return total / n

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_out.to(grad_h.dtype), grad_w * grad_out.to(grad_w.dtype), None, None


def linear_cross_entropy(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = DEFAULT_CHUNK
) -> torch.Tensor:
    """Mean cross-entropy of softmax(h W^T) against targets, float32 (float64 for float64 h),
    without materialising the (N, vocab) logits: h (N, D) or (B, S, D), weight (vocab, D),
    targets (N,) or (B, S) int64, `chunk` tokens at a time. Differentiable in h and weight."""
    if h.dim() not in (2, 3) or weight.dim() != 2 or h.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"h must be (N, D) or (B, S, D) and weight (vocab, D) with the same D, got "
            f"{tuple(h.shape)} and {tuple(weight.shape)}"
        )
    h2 = h.reshape(-1, h.shape[-1])
    t = targets.reshape(-1)
    if t.shape[0] != h2.shape[0] or t.dtype != torch.int64:
        raise ValueError(
            f"targets must be int64 with one entry per token ({h2.shape[0]}), got "
            f"{tuple(targets.shape)} {targets.dtype}"
        )
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be an int >= 1, got {chunk!r}")
    if h2.shape[0] == 0:
        raise ValueError("no tokens: the mean cross-entropy of nothing is undefined")
    if weight.dtype != h.dtype:
        raise ValueError(f"h and weight must share a dtype, got {h.dtype} and {weight.dtype}")
    return _LinearCrossEntropy.apply(h2, weight, t, chunk)
