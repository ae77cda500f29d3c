"""Attention sinks on an imported decoder: a Llama built by transformers from a config (random
weights, fixed seed), saved and imported. attnlab's sink metric reads the same attention
transformers computes; the sinks window keeps its definition on the imported model; full
attention within the block is transformers' loss token by token."""

from __future__ import annotations

import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers.logging.set_verbosity_error()

from test_family_import import save_family  # noqa: E402

from attnlab.inspect.sinks import first_token_share, full_nll, window_nll  # noqa: E402
from attnlab.interop.hf import import_hf  # noqa: E402
from attnlab.run import load_run  # noqa: E402
from sinks_helpers import sinks_reference  # noqa: E402


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    hf = save_family(d / "hf")
    for p in hf.parameters():  # attention far from uniform, as a trained model's
        p.data.mul_(3)
    hf.save_pretrained(d / "hf")
    run = load_run(import_hf(d / "hf", d / "run"))
    return hf.eval(), run.model.eval()


def test_the_sink_metric_reads_the_attention_transformers_computes(imported):
    hf, model = imported
    torch.manual_seed(0)
    x = torch.randint(3, hf.config.vocab_size, (4, 12))
    with torch.no_grad():
        attentions = hf(x, output_attentions=True).attentions  # L x (B, H, T, T)
    theirs = torch.stack([a[:, :, :, 0].double().mean(dim=(0, 2)) for a in attentions])  # (L, H)
    ours = first_token_share(model, x)
    assert ours.shape == theirs.shape == (hf.config.num_hidden_layers,
                                          hf.config.num_attention_heads)  # fmt: skip
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_full_attention_within_the_block_is_transformers_loss(imported):
    hf, model = imported
    torch.manual_seed(1)
    x = torch.randint(3, hf.config.vocab_size, (2, 10))
    with torch.no_grad():
        logp = torch.log_softmax(hf(x).logits.double(), -1)
    theirs = -logp[:, :-1].gather(-1, x[:, 1:, None])[..., 0]
    torch.testing.assert_close(full_nll(model, x).double(), theirs, atol=1e-4, rtol=0)
    torch.testing.assert_close(window_nll(model, x, "slide").double(), theirs, atol=1e-4, rtol=0)


def test_the_sinks_window_on_the_imported_decoder_is_its_definition(imported):
    _, model = imported
    block = model.config.block_size
    torch.manual_seed(2)
    x = torch.randint(3, model.config.vocab_size, (2, 3 * block))
    got = window_nll(model, x, "sinks:3")
    ref = sinks_reference(model, x, 3)  # (B, T, V) log-probs
    want = -ref[:, :-1].gather(-1, x[:, 1:, None])[..., 0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)  # large logits: float32 sums
