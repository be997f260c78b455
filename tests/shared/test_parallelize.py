import pytest
import torch
import torch.nn.functional as F

from shared.data import SyntheticTokens
from shared.model import build_model
from shared.parallelize import (
    ParallelConfig,
    apply_activation_checkpointing,
    apply_compile,
    parallelize,
    parse_dtype,
)


def _grads(model, x, y):
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_activation_checkpointing_keeps_names_and_gradients():
    x, y = SyntheticTokens(256, 32, 4, seed=0).next_batch()
    ref = build_model("tiny", seed=0)
    ac = build_model("tiny", seed=0)
    apply_activation_checkpointing(ac)
    assert type(ac.layers[0]).__name__ == "CheckpointWrapper"
    # checkpoint keys do not change, so checkpoints move between AC and non-AC runs
    assert ref.state_dict().keys() == ac.state_dict().keys()
    l1, g1 = _grads(ref, x, y)
    l2, g2 = _grads(ac, x, y)
    # Checkpointing recomputes the same forward with the same kernels on the same tensors (no
    # dropout): loss and gradients are identical, the default tolerances are only slack.
    torch.testing.assert_close(l1, l2)
    g2 = {n.replace("._checkpoint_wrapped_module", ""): g for n, g in g2.items()}
    assert g1.keys() == g2.keys()
    for n, g in g1.items():
        torch.testing.assert_close(g, g2[n])


def test_compile_mode_reaches_every_block(monkeypatch):
    """Each block is compiled whole (fullgraph) in the mode asked for; "default" is torch's
    own default (mode None); an unknown mode is refused before anything compiles."""
    seen = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: seen.append(kw))
    model = build_model("tiny", seed=0)
    apply_compile(model)
    apply_compile(model, "max-autotune-no-cudagraphs")
    n = len(model.layers)
    assert (
        seen
        == [{"fullgraph": True, "mode": None}] * n
        + [{"fullgraph": True, "mode": "max-autotune-no-cudagraphs"}] * n
    )
    with pytest.raises(ValueError, match="compile mode must be one of"):
        apply_compile(model, "reduce-overhead")  # CUDA graphs: FSDP's hooks run between blocks
    assert len(seen) == 2 * n


def test_bad_dtype_and_model_are_clear():
    assert parse_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be one of"):
        parse_dtype("float8")
    with pytest.raises(TypeError, match="layers"):
        parallelize(torch.nn.Linear(2, 2), ParallelConfig())


@pytest.mark.gpu
def test_fsdp_bf16_compiled_training_on_one_gpu():
    from shared.distributed import cleanup, init_distributed

    info = init_distributed()
    try:
        model = build_model("tiny", seed=0).to(info.device)
        parallelize(
            model,
            ParallelConfig(param_dtype="bfloat16", compile=True, activation_checkpointing=True),
        )
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
        data = SyntheticTokens(256, 64, 16, seed=0)
        losses = []
        for _ in range(60):
            x, y = (t.to(info.device) for t in data.next_batch())
            logits = model(x)
            assert logits.dtype == torch.bfloat16  # mixed precision is on, even at world 1
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        assert losses[-1] < losses[0] - 2.0
    finally:
        cleanup()
