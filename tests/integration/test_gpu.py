"""The GPU path: bf16 autocast, torch.compile, fused (flash) attention and a training step that
never waits for the device. Skipped where torch sees no CUDA GPU (CI has none)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.models.gpt import GPT, GPTConfig
from attnlab.tasks.lm import LanguageModel
from attnlab.training import TrainConfig, Trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

VOCAB = 32


def _task() -> LanguageModel:
    tokens = np.random.default_rng(0).integers(0, VOCAB, 50_000).astype(np.uint16)
    return LanguageModel.from_tokens(tokens[:45_000], tokens[45_000:], n_layer=2, n_head=4,
                                     d_model=64, block_size=64, dropout=0.0)  # fmt: skip


def _losses(dtype: str, compile: bool, steps: int = 4) -> list[float]:
    task = _task()
    torch.manual_seed(0)
    model = GPT(task.options.model_config(VOCAB))
    cfg = TrainConfig(max_iters=steps, batch_size=8, lr=1e-3, warmup_iters=0, eval_interval=100,
                      eval_iters=2, log_interval=1, device="cuda", dtype=dtype,
                      compile=compile)  # fmt: skip
    result = Trainer(model, task, cfg, quiet=True).fit()
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast casts, not them
    return [r["train_loss"] for r in result.history if "val_loss" not in r]


@pytest.fixture(autouse=True)
def _exact_matmuls():
    was = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = was


def test_auto_dtype_on_a_gpu_is_bf16_and_trains_like_fp32():
    from attnlab.runtime import resolve_dtype

    if torch.cuda.is_bf16_supported():
        assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    fp32, bf16 = _losses("float32", False), _losses("bfloat16", False)
    assert all(np.isfinite(bf16))
    np.testing.assert_allclose(bf16, fp32, atol=0.05)  # bf16 keeps 8 bits of mantissa


@pytest.mark.slow
def test_compiled_training_on_a_gpu_has_the_eager_losses():
    eager, compiled = _losses("float32", False), _losses("float32", True)
    np.testing.assert_allclose(compiled, eager, atol=1e-4)


def test_causal_self_attention_runs_the_flash_kernel_and_matches_the_reference():
    """Training attention (causal, no padding mask) must reach the fused flash kernel: with only
    that kernel allowed, a kernel-less path would raise."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=64, n_layer=2, n_head=4, d_model=64))
    model = model.cuda().to(torch.bfloat16)
    ids = torch.randint(0, VOCAB, (4, 64), device="cuda")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        fused = model(ids)
        fused.float().sum().backward()  # the flash backward too
    for block in model.blocks:
        block.attn.use_fused = False
    with torch.no_grad():
        reference = model(ids)
    torch.testing.assert_close(fused.detach().float(), reference.float(), atol=3e-2, rtol=3e-2)


def test_a_training_step_never_synchronizes_with_the_gpu():
    """The loss and gradient norm stay on the device; nothing is read back until a log line."""
    task = _task()
    torch.manual_seed(0)
    model = GPT(task.options.model_config(VOCAB))
    cfg = TrainConfig(max_iters=10, batch_size=8, device="cuda", dtype="bfloat16",
                      compile=False, log_interval=10)  # fmt: skip
    trainer = Trainer(model, task, cfg, quiet=True)
    assert trainer.defers_readback
    trainer.train_step()  # the first step makes the optimizer state
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            trainer.train_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    losses = trainer.read_back()
    assert len(losses) == 4 and all(np.isfinite(losses))
