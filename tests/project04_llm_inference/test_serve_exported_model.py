"""Projects meet through files: a `shared.model` transformer (what project02/03 train), exported
with `shared.hf_export`, is served by the engine with the same greedy tokens as the model itself.

Float32 on the CPU; the two differ only in the order of operations, so a greedy token may differ
only at a near-tie of the top two logits (gap < 1e-4, 100x the ~1e-6 op-order noise)."""

from __future__ import annotations

import torch

from project04_llm_inference import LLM, SamplingParams
from shared.hf_export import export_hf
from shared.model import ModelArgs, build_model

TIE = 1e-4


def test_exported_shared_model_is_served_with_the_same_greedy_tokens(tmp_path):
    args = ModelArgs.from_preset("tiny", n_kv_heads=2)
    model = build_model(args, seed=3).eval()
    with torch.no_grad():  # sharper logits than the 0.02 init, so near-ties are rare
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(5.0)
    folder = export_hf(model, tmp_path / "exported")
    prompt = [5, 17, 99, 3, 250, 8, 41]
    n = 12
    out = LLM(str(folder), device="cpu", dtype="float32", max_model_len=64).generate(
        [prompt], SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    )[0]
    ids = list(prompt)
    with torch.no_grad():
        for j in range(n):
            logits = model(torch.tensor([ids]))[0, -1]
            want = int(logits.argmax())
            if out.token_ids[j] != want:
                top2 = logits.topk(2).values
                assert float(top2[0] - top2[1]) < TIE, f"token {j}: {out.token_ids[j]} != {want}"
                break
            ids.append(want)
    assert j == n - 1 or out.token_ids[j] != want  # compared to the end, or stopped at a tie
