"""The optimizer split (Muon for the blocks' matrices, AdamW for the rest), the wsd schedule and
the speedrun's model pieces: each against its definition or torch's own implementation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.config import ConfigError
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.train_config import TrainConfig
from attnlab.training.optim import (
    Muon,
    SplitOptimizer,
    load_optimizer,
    lr_at,
    make_optimizer,
    newton_schulz,
    optimizer_tensors,
    param_roles,
    set_lr,
)

SPEEDRUN_PIECES = dict(pos="rotary", norm="rms", qk_norm=True, activation="relu2", bias=False,
                       tie_weights=False, zero_init=True, final_softcap=15.0)  # fmt: skip
MUON = dict(optimizer="muon", lr=0.01, muon_lr=0.02, embed_lr=0.05, head_lr=0.005, beta1=0.8,
            beta2=0.95, weight_decay=0.0, device="cpu")  # fmt: skip


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=11, n_layer=2, n_head=2, d_model=16, block_size=8, **kw))


def step(model: GPT, opt, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 11, (3, 8), generator=g)
    logits = model(ids)
    F.cross_entropy(logits.reshape(-1, 11), ids.roll(-1, 1).reshape(-1)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("shape", [(12, 40), (40, 12), (16, 16)])
def test_newton_schulz_is_torchs_iteration_computed_in_float32(shape):
    from torch.optim._muon import _zeropower_via_newtonschulz

    G = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    coefficients = (3.4445, -4.775, 2.0315)
    ours = newton_schulz(G, 5, coefficients)
    theirs = _zeropower_via_newtonschulz(G, coefficients, 5, 1e-7).float()  # in bfloat16
    assert ours.dtype == torch.float32 and ours.shape == G.shape
    torch.testing.assert_close(ours, theirs, atol=0.03, rtol=0.05)
    # near-orthogonal: every singular value pushed into about [0.5, 1.5], as torch documents
    s = torch.linalg.svdvals(ours)
    assert s.min() > 0.4 and s.max() < 1.6


def test_cpu_muon_takes_torchs_step_and_keeps_torchs_state():
    weights = torch.randn(24, 10, generator=torch.Generator().manual_seed(2))
    grads = [torch.randn(24, 10, generator=torch.Generator().manual_seed(s)) for s in (3, 4)]
    ours, theirs = nn.Parameter(weights.clone()), nn.Parameter(weights.clone())
    kw = dict(lr=0.02, momentum=0.95, weight_decay=0.1)
    opts = Muon([ours], **kw), torch.optim.Muon([theirs], **kw)
    for g in grads:
        for p, opt in zip((ours, theirs), opts):
            p.grad = g.clone()
            opt.step()
    # the update differs only by torch's bfloat16 rounding of the orthogonalised step
    torch.testing.assert_close(ours.detach(), theirs.detach(), atol=2e-3, rtol=0)
    assert not torch.equal(ours.detach(), weights)
    mine, torchs = opts[0].state_dict(), opts[1].state_dict()
    assert mine["state"][0].keys() == torchs["state"][0].keys() == {"momentum_buffer"}
    torch.testing.assert_close(mine["state"][0]["momentum_buffer"],
                               torchs["state"][0]["momentum_buffer"])  # fmt: skip


def test_every_parameter_has_one_role_and_the_blocks_matrices_are_muons():
    model = tiny(**SPEEDRUN_PIECES)
    roles = param_roles(model)
    assert sorted(roles) == sorted(n for n, _ in model.named_parameters())
    hidden = {n for n, r in roles.items() if r == "hidden"}
    assert hidden == {n for n, p in model.named_parameters()
                      if n.startswith("blocks.") and p.dim() == 2}  # fmt: skip
    assert roles["tok_embed.weight"] == "embed" and roles["lm_head.weight"] == "head"
    assert all(roles[n] == "scalar" for n, p in model.named_parameters() if p.dim() < 2)
    tied = param_roles(tiny())  # GPT-2's head is the embedding: named once, as the embedding
    assert "lm_head.weight" not in tied and tied["tok_embed.weight"] == "embed"
    assert tied["pos_embed.weight"] == "embed"


def test_muon_split_gives_each_role_its_own_peak_rate_on_the_schedule():
    model = tiny(**SPEEDRUN_PIECES)
    c = TrainConfig(max_iters=100, schedule="wsd", warmup_iters=0, cooldown_iters=50, min_lr=0.0,
                    **MUON)  # fmt: skip
    opt = make_optimizer(model, c)
    assert isinstance(opt, SplitOptimizer)
    assert [type(p) for p in opt.parts] == [Muon, torch.optim.AdamW]
    peaks = {"hidden": 0.02, "embed": 0.05, "head": 0.005, "scalar": 0.01}
    for at, share in ((0, 1.0), (49, 1.0), (75, 0.5), (100, 0.0)):
        set_lr(opt, at, c)
        for g in opt.param_groups:
            assert g["lr"] == pytest.approx(peaks[g["role"]] * share)
    n_params = sum(len(g["params"]) for g in opt.param_groups)
    assert n_params == len(list(model.parameters()))


def test_the_split_optimizer_saves_and_restores_so_training_continues_bit_for_bit():
    c = TrainConfig(**MUON)
    a = tiny(**SPEEDRUN_PIECES)
    opt_a = make_optimizer(a, c)
    for s in range(3):
        step(a, opt_a, s)
    tensors, meta = optimizer_tensors(opt_a)
    assert any(k.endswith("momentum_buffer") for k in tensors)  # Muon's state is saved
    assert any(k.endswith("exp_avg_sq") for k in tensors)  # and AdamW's
    b = tiny(**SPEEDRUN_PIECES)
    b.load_state_dict(a.state_dict())
    opt_b = make_optimizer(b, c)
    import json

    stored = {k: v.clone() for k, v in tensors.items()}  # as read back from the file
    load_optimizer(opt_b, stored, json.loads(json.dumps(meta)))  # JSON, as checkpoints store it
    for s in range(3, 6):
        step(a, opt_a, s)
        step(b, opt_b, s)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name


def test_muon_refuses_a_model_without_transformer_blocks():
    lstm = nn.Sequential(nn.Embedding(5, 4), nn.LSTM(4, 4))
    with pytest.raises(
        ConfigError, match="optimizer muon .* has none: train it with optimizer adamw"
    ):
        make_optimizer(lstm, TrainConfig(optimizer="muon"))


def test_wsd_warms_up_holds_then_cools_down_in_a_straight_line():
    c = TrainConfig(max_iters=100, schedule="wsd", lr=1.0, min_lr=0.1, warmup_iters=10,
                    cooldown_iters=40)  # fmt: skip
    lrs = [lr_at(t, c) for t in range(101)]
    assert lrs[0] < lrs[9] < lrs[10] == 1.0
    assert set(lrs[10:60]) == {1.0}
    down = lrs[60:100]
    assert all(a > b for a, b in zip(down, down[1:]))
    steps = [a - b for a, b in zip(down, down[1:])]
    assert max(steps) == pytest.approx(min(steps))  # linear
    assert lrs[80] == pytest.approx(0.55) and lrs[100] == 0.1


def test_relu2_is_relu_squared_and_zero_init_starts_every_block_as_the_identity():
    from attnlab.blocks import ACTIVATIONS

    x = torch.linspace(-2, 2, 9)
    assert torch.equal(ACTIVATIONS["relu2"](x), torch.clamp(x, min=0) ** 2)
    model = tiny(**SPEEDRUN_PIECES).eval()
    ids = torch.randint(0, 11, (2, 8))
    _, cache = model(ids, record=True)
    for i in range(2):  # each block adds nothing to the stream it reads
        torch.testing.assert_close(cache[f"blocks.{i}.resid_post"], cache[f"blocks.{i}.resid_pre"])
    assert torch.count_nonzero(model(ids)) == 0  # an untied head at zero: uniform predictions
    with pytest.raises(ConfigError):
        TrainConfig(optimizer="muon", muon_lr=20.0, weight_decay=0.1)
