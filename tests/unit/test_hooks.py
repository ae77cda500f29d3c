"""One recording mechanism: names, completeness, no effect on outputs, always removed."""

from __future__ import annotations

import pytest
import torch

from attnlab.hooks import hook_points, record
from attnlab.models.gpt import GPT, GPTConfig


def _model(**kw):
    return GPT(
        GPTConfig(vocab_size=30, block_size=16, n_layer=2, n_head=2, d_model=16, **kw)
    ).eval()


def test_record_names_every_step_of_every_block():
    model = _model()
    ids = torch.randint(0, 30, (2, 9))
    logits, cache = model(ids, record=True)
    per_block = ["resid_pre", "ln1", "attn.q", "attn.k", "attn.v", "attn.scores", "attn.weights",
                 "attn.z", "attn.out", "resid_mid", "ln2", "mlp.hidden", "mlp_out", "resid_post"]  # fmt: skip
    for i in range(2):
        for name in per_block:
            assert f"blocks.{i}.{name}" in cache, name
    assert {"embed", "pos", "ln_f", "logits"} <= set(cache)
    assert cache["blocks.1.attn.weights"].shape == (2, 2, 9, 9)
    assert cache["blocks.0.attn.q"].shape == (2, 2, 9, 8)
    torch.testing.assert_close(cache["logits"], logits.detach())


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rotary"])
def test_recording_does_not_change_outputs(pos):
    model = _model(pos=pos)
    ids = torch.randint(0, 30, (3, 11))
    plain = model(ids)
    recorded, _ = model(ids, record=True)
    torch.testing.assert_close(recorded, plain, atol=1e-5, rtol=0)


def test_recorded_weights_are_causal_and_normalised():
    model = _model()
    _, cache = model(torch.randint(0, 30, (1, 8)), record=True)
    w = cache["blocks.0.attn.weights"][0]  # (H, T, T)
    assert torch.equal(w.triu(1), torch.zeros_like(w))
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 8))


def test_hooks_are_removed_after_the_block_even_on_error():
    model = _model()
    with pytest.raises(RuntimeError), record(model):
        raise RuntimeError("boom")
    assert all(not h.active for h in hook_points(model).values())


def test_edit_can_ablate_a_head():
    model = _model()
    ids = torch.randint(0, 30, (1, 6))

    def zero_head0(z, name):
        z = z.clone()
        z[:, 0] = 0
        return z

    with record(model, names=["blocks.0.attn.z"], edit={"blocks.0.attn.z": zero_head0}) as cache:
        ablated = model(ids)
    assert torch.equal(
        cache["blocks.0.attn.z"][:, 0], torch.zeros_like(cache["blocks.0.attn.z"][:, 0])
    )
    assert not torch.allclose(ablated, model(ids))


def test_unknown_hook_name_is_a_clear_error():
    with (
        pytest.raises(KeyError, match="no hook named"),
        record(_model(), names=["blocks.9.attn.weights"]),
    ):
        pass


def test_torch_hooks_on_a_hook_module_still_fire_outside_recording():
    # an inactive Hook skips nn.Module.__call__, unless a torch hook is registered on it
    model = _model()
    ids = torch.randint(0, 30, (2, 5))
    seen = []
    point = hook_points(model)["blocks.1.resid_post"]
    handle = point.register_forward_hook(lambda mod, inp, out: seen.append(out.detach()))
    try:
        model(ids)
    finally:
        handle.remove()
    with record(model, names=["blocks.1.resid_post"]) as cache:
        model(ids)
    model(ids)
    assert len(seen) == 1 and torch.equal(seen[0], cache["blocks.1.resid_post"])
