"""The sinks window's definition written out by hand, and teacher-forced decoding: shared by
the unit test of the window (tests/unit/test_window_sinks.py) and the imported decoder's
(tests/integration/test_attention_sinks.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.decoding import decoder_for


def sharpened(model):
    for p in model.parameters():
        p.data.mul_(4)
    return model.eval()


@torch.no_grad()
def step_logps(model, ids, prompt_len, window):
    """Teacher-force ``ids`` (B, T) through the decoder: log-probs after each context from the
    prompt on, (B, T - prompt_len + 1, V)."""
    T, dec = ids.size(1), decoder_for(model)
    state = dec.start(ids[:, :prompt_len], T - prompt_len + 1, window=window)
    out = [dec.step(state, ids[:, prompt_len - 1])]
    out += [dec.step(state, ids[:, t]) for t in range(prompt_len, T)]
    return torch.stack(out, 1)


@torch.no_grad()
def sinks_reference(model, ids, k):
    """The sinks window's definition, by hand, over the whole sequence (B, T): in every layer,
    query t attends to keys j < k and t - w < j <= t (w = block - k), the score of key j taken
    at distance t - j in the window and min(t, block - 1) - j for a sink (rotary scores depend
    on the distance alone: rotate q by it, k not at all). Pre-norm blocks. (B, T, V) log-probs."""
    block = model.config.block_size
    w = block - k
    B, T = ids.shape
    x = model.tok_embed(ids)  # (B, T, C)
    for b in model.blocks:
        a = b.attn
        h = b.ln1(x)
        H, G, D = a.n_heads, a.n_kv_heads, a.d_k
        q = a.q_proj(h).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        kk = a.k_proj(h).view(B, T, G, D).transpose(1, 2).repeat_interleave(H // G, 1)
        vv = a.v_proj(h).view(B, T, G, D).transpose(1, 2).repeat_interleave(H // G, 1)
        qd = torch.stack([a.rotary(q.unsqueeze(-2), d).squeeze(-2) for d in range(block)])
        by_dist = qd @ kk.transpose(-2, -1) / D**0.5  # (block, B, H, T, T) q.k at each distance
        t, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        window, sink = (j <= t) & (j > t - w), (j < k) & (j <= t)  # (T, T) who may be read
        dist = torch.where(window, t - j, t.clamp(max=block - 1) - j).clamp(0, block - 1)
        scores = by_dist.permute(1, 2, 3, 4, 0).gather(-1, dist.expand(B, H, T, T)[..., None])
        scores = scores[..., 0].masked_fill(~(window | sink), float("-inf"))  # (B, H, T, T)
        z = scores.softmax(-1) @ vv  # (B, H, T, D)
        x = x + a.out_proj(z.transpose(1, 2).reshape(B, T, H * D))
        x = x + b.mlp(b.ln2(x))
    return F.log_softmax(model.lm_head(model.ln_f(x)), -1)
