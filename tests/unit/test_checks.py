"""The future-leak checker catches the classic causal-mask mistake and passes correct models."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.attention import MultiHeadAttention
from attnlab.checks import find_future_leak, find_future_leak_grad
from attnlab.models.gpt import GPT, GPTConfig


class SelfAttention(nn.Module):
    """Single-head causal self-attention, correct or with the classic mistake."""

    def __init__(self, d: int, mistake: bool):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.mistake = mistake

    def forward(self, x):  # (B, T, C)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, T, T)
        T = x.size(1)
        if self.mistake:
            # masks the LOWER triangle and normalises over the query axis: the row for query t
            # then mixes values from later positions.
            blocked = torch.ones(T, T, dtype=torch.bool).tril(-1)
            weights = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-2)
        else:
            blocked = torch.ones(T, T, dtype=torch.bool).triu(1)
            weights = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1)
        return weights @ v


@pytest.mark.parametrize("probe", ["perturb", "grad"])
def test_checker_reports_the_lower_triangle_dim_minus_2_mistake(probe):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16)
    find = find_future_leak if probe == "perturb" else find_future_leak_grad
    broken = find(SelfAttention(16, mistake=True), x)
    correct = find(SelfAttention(16, mistake=False), x)
    assert broken.leaks and broken.position[0] < broken.position[1]
    assert "future leak" in str(broken)
    assert not correct.leaks, str(correct)


@pytest.mark.parametrize("probe", ["perturb", "grad"])
def test_multihead_attention_with_causal_flag_has_no_leak(probe):
    mha = MultiHeadAttention(24, 3).eval()
    find = find_future_leak if probe == "perturb" else find_future_leak_grad
    assert not find(lambda x: mha(x, causal=True), torch.randn(2, 7, 24)).leaks
    assert find(lambda x: mha(x, causal=False), torch.randn(2, 7, 24)).leaks


def test_checker_works_on_token_ids_of_a_whole_model():
    model = GPT(GPTConfig(vocab_size=20, block_size=16, n_layer=2, n_head=2, d_model=16)).eval()
    ids = torch.randint(0, 20, (2, 12))
    report = find_future_leak(model, ids)
    assert not report.leaks, str(report)
    assert report.max_diff <= 1e-6


def test_checker_reports_the_worst_position():
    def leaky(x):  # output 2 reads input 5; nothing else leaks
        y = x.clone()
        y[:, 2] = y[:, 2] + x[:, 5]
        return y

    report = find_future_leak(leaky, torch.randn(1, 8, 4))
    assert report.leaks and report.position == (2, 5)
