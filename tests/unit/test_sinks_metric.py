"""attnlab.inspect.sinks: Gu et al.'s alpha_1 and Sink_1^eps against their definitions, and the
per-token losses through a window against a plain forward pass."""

from __future__ import annotations

import pytest
import torch

from attnlab.inspect.sinks import first_token_share, full_nll, sink_ratio, window_nll
from lm_helpers import tiny_gpt


@pytest.mark.parametrize("attention", ["softmax", "sigmoid"])
def test_alpha_1_is_the_mean_share_of_each_row_on_the_first_token(attention):
    torch.manual_seed(0)
    model = tiny_gpt(20, pos="rotary", attention=attention).eval()
    x = torch.randint(0, 20, (3, 9))
    _, cache = model(x, record=True)
    for layer in range(2):
        w = cache[f"blocks.{layer}.attn.weights"].double()  # (B, H, T, T)
        share = w[..., 0] / w.sum(-1)  # (B, H, T): each query's share, the first query too
        want = share.mean(dim=(0, 2))  # (H,)
        torch.testing.assert_close(first_token_share(model, x)[layer], want)
    assert float(first_token_share(model, x).max()) <= 1.0


def test_sink_ratio_counts_heads_above_the_threshold():
    shares = torch.tensor([[0.1, 0.31], [0.9, 0.3]], dtype=torch.float64)
    assert sink_ratio(shares) == 0.5 and sink_ratio(shares, eps=0.05) == 1.0


@pytest.mark.parametrize("window", ["slide", "shift", "ring", "sinks:2"])
def test_within_the_block_every_window_gives_the_forward_pass_losses(window):
    torch.manual_seed(1)
    model = tiny_gpt(20, pos="rotary", block_size=12).eval()
    x = torch.randint(0, 20, (2, 12))
    with torch.no_grad():
        logp = torch.log_softmax(model(x).float(), -1)
    want = -logp[:, :-1].gather(-1, x[:, 1:, None])[..., 0]  # (B, T - 1)
    torch.testing.assert_close(window_nll(model, x, window), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(full_nll(model, x), want, atol=1e-5, rtol=0)


def test_full_attention_past_the_block_stretches_rotary_and_refuses_learned_positions():
    torch.manual_seed(2)
    model = tiny_gpt(20, pos="rotary", block_size=8).eval()
    x = torch.randint(0, 20, (2, 20))
    nll = full_nll(model, x)
    assert nll.shape == (2, 19) and bool(torch.isfinite(nll).all())
    with torch.no_grad():  # the first block's tokens: the model itself
        logp = torch.log_softmax(model(x[:, :8]).float(), -1)
    torch.testing.assert_close(nll[:, :7], -logp[:, :-1].gather(-1, x[:, 1:8, None])[..., 0],
                               atol=1e-5, rtol=0)  # fmt: skip
    with pytest.raises(ValueError, match="learned positions end at the block"):
        full_nll(tiny_gpt(20, pos="learned", block_size=8), x)
