"""Training and evaluating encoder-decoders (Transformer or LSTM) on sequence pairs.

A compact loop: AdamW (weight decay on matrices only), gradient clipping, a learning-rate
schedule (linear warmup then cosine, or the paper's ``noam``), periodic evaluation on the
validation split (loss and greedy exact match), progress on stderr, one JSON line per
evaluation in ``metrics.jsonl``, and the run directory written through ``attnlab.checkpoint``
(the checkpoint kept is the one with the best validation exact match).
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from attnlab.checkpoint import save_model
from attnlab.data.tasks import EOS, PAD, Seq2SeqData, collate, encode_pairs
from attnlab.decoding import beam_search, greedy, pad_ids
from attnlab.models.rnn import RNNConfig, RNNSeq2Seq
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer, noam_lr
from attnlab.tokenizers import PairTokenizer

ARCHS = ("transformer", "lstm-attention", "lstm")


@dataclass
class TrainSettings:
    max_iters: int = 2000
    batch_size: int = 64
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_iters: int = 100
    lr_decay_iters: int | None = None
    schedule: str = "cosine"  # cosine | noam
    weight_decay: float = 0.01
    beta2: float = 0.99
    grad_clip: float = 1.0
    eval_interval: int = 250
    eval_examples: int = 200  # validation pairs decoded greedily at each evaluation
    log_interval: int = 50
    seed: int = 1337
    device: str = "cpu"
    quiet: bool = False


def build_model(arch: str, tokenizer: PairTokenizer, max_len: int, *, n_layer=None, n_head=None,
                d_model=None, dropout=None, norm=None, score="dot",
                label_smoothing=0.0) -> nn.Module:  # fmt: skip
    """A Transformer or an LSTM encoder-decoder sized for ``tokenizer``'s vocabularies.

    Defaults: transformer 2+2 layers, 4 heads, d_model 128, post-norm, dropout 0.1;
    LSTM 1 layer of 256 units (``d_model`` sets it), embeddings of half that, no dropout.
    """
    V_src, V_tgt = tokenizer.src_vocab_size, tokenizer.tgt_vocab_size
    if arch == "transformer":
        cfg = Seq2SeqConfig(
            src_vocab_size=V_src, tgt_vocab_size=V_tgt, max_len=max_len,
            n_encoder_layers=n_layer or 2, n_decoder_layers=n_layer or 2, n_head=n_head or 4,
            d_model=d_model or 128, dropout=0.1 if dropout is None else dropout,
            norm_first=norm == "pre", label_smoothing=label_smoothing,
        )  # fmt: skip
        return Seq2SeqTransformer(cfg)
    if arch not in ("lstm", "lstm-attention"):
        raise ValueError(f"unknown arch {arch!r}; choose {', '.join(ARCHS)}")
    hidden = d_model or 256
    cfg = RNNConfig(
        src_vocab_size=V_src, tgt_vocab_size=V_tgt, d_embed=max(hidden // 2, 8), d_hidden=hidden,
        n_layer=n_layer or 1, attention=score if arch == "lstm-attention" else "none",
        dropout=dropout or 0.0, label_smoothing=label_smoothing,
    )  # fmt: skip
    return RNNSeq2Seq(cfg)


def _lr(step: int, s: TrainSettings, d_model: int) -> float:
    if s.schedule == "noam":
        return noam_lr(step + 1, d_model, max(s.warmup_iters, 1))
    if step < s.warmup_iters:
        return s.lr * (step + 1) / (s.warmup_iters + 1)
    decay = s.lr_decay_iters or s.max_iters
    if step > decay:
        return s.min_lr
    ratio = (step - s.warmup_iters) / max(1, decay - s.warmup_iters)
    return s.min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (s.lr - s.min_lr)


def _optimizer(model: nn.Module, s: TrainSettings) -> torch.optim.Optimizer:
    params = {id(p): p for p in model.parameters() if p.requires_grad}.values()  # tied once
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": s.weight_decay},
        {"params": rest, "weight_decay": 0},
    ]
    betas, eps = ((0.9, 0.98), 1e-9) if s.schedule == "noam" else ((0.9, s.beta2), 1e-8)
    return torch.optim.AdamW(groups, lr=s.lr, betas=betas, eps=eps)


def _d_model(model: nn.Module) -> int:
    return getattr(model.config, "d_model", None) or model.config.d_hidden


def log(msg: str, quiet: bool = False) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def train(model: nn.Module, tokenizer: PairTokenizer, data: Seq2SeqData, out: str | Path,
          s: TrainSettings, extra: dict | None = None) -> dict:  # fmt: skip
    """Train ``model`` on ``data.train``; evaluate on ``data.val``; write the run to ``out``.

    Returns the best evaluation record (step, val_loss, val_exact, ...).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(s.seed)
    device = torch.device(s.device)
    model.to(device)
    train_set = encode_pairs(tokenizer, data.train)
    val_pairs = data.val[: s.eval_examples]
    opt = _optimizer(model, s)
    gen = torch.Generator().manual_seed(s.seed)
    order, cursor = torch.randperm(len(train_set), generator=gen), 0
    metrics_path = out / "metrics.jsonl"
    metrics_path.write_text("")
    extra = {**(extra or {}), "training": asdict(s)}
    best, t0, seen_loss = None, time.time(), []
    log(f"training {type(model).__name__} ({model.num_params():,} parameters) on "
        f"{len(train_set):,} pairs for {s.max_iters} steps", s.quiet)  # fmt: skip
    for step in range(s.max_iters):
        model.train()
        if cursor + s.batch_size > len(order):
            order, cursor = torch.randperm(len(train_set), generator=gen), 0
        batch = [train_set[i] for i in order[cursor : cursor + s.batch_size].tolist()]
        cursor += s.batch_size
        src, tgt_in, tgt_out = (t.to(device) for t in collate(batch))
        lr = _lr(step, s, _d_model(model))
        for g in opt.param_groups:
            g["lr"] = lr
        loss = model.loss(src, tgt_in, tgt_out)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if s.grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        seen_loss.append(loss.item())
        done = step + 1
        if done % s.log_interval == 0 and not s.quiet:
            rate = done / (time.time() - t0)
            eta = (s.max_iters - done) / rate
            recent = seen_loss[-s.log_interval :]
            log(f"step {done}/{s.max_iters}  loss {sum(recent) / len(recent):.4f}"
                f"  lr {lr:.2e}  {rate:.1f} it/s  ETA {eta:.0f}s")  # fmt: skip
        if done % s.eval_interval == 0 or done == s.max_iters:
            rec = {"step": done, "train_loss": sum(seen_loss) / len(seen_loss), "lr": lr,
                   "elapsed_s": round(time.time() - t0, 2)}  # fmt: skip
            seen_loss = []
            rec.update({f"val_{k}": v for k, v in evaluate(model, tokenizer, val_pairs).items()})
            with open(metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
            log(f"eval step {done}: val loss {rec['val_loss']:.4f}  exact {rec['val_exact']:.1%}  "
                f"token acc {rec['val_token_acc']:.1%}", s.quiet)  # fmt: skip
            if best is None or rec["val_exact"] >= best["val_exact"]:
                best = rec
                save_model(out, model, tokenizer, {**extra, "best": rec})
    best["train_time_s"] = round(time.time() - t0, 2)
    return best


@torch.no_grad()
def evaluate(model: nn.Module, tokenizer: PairTokenizer, pairs: list[tuple[str, str]],
             beam: int = 1, alpha: float = 0.6, batch_size: int = 250) -> dict:  # fmt: skip
    """Exact match of the decoded outputs (greedy, or beam search if beam > 1) and teacher-forced
    token accuracy (argmax of every target position given the true prefix, <eos> included),
    plus the mean cross-entropy ``loss``; over ``pairs``."""
    model.eval()
    device = next(model.parameters()).device
    encoded = encode_pairs(tokenizer, pairs)
    exact = correct = total = 0
    loss_sum = 0.0
    for i in range(0, len(encoded), batch_size):
        chunk = encoded[i : i + batch_size]
        src, tgt_in, tgt_out = (t.to(device) for t in collate(chunk))
        logits = model(src, tgt_in)  # (B, T, V)
        keep = tgt_out != PAD
        correct += int(((logits.argmax(-1) == tgt_out) & keep).sum())
        total += int(keep.sum())
        loss_sum += float(
            nn.functional.cross_entropy(logits[keep].float(), tgt_out[keep], reduction="sum")
        )
        if beam == 1:
            outs = greedy(model, src)
        else:
            outs = [beam_search(model, pad_ids([s], device=device), beam, alpha)[0].tokens
                    for s, _ in chunk]  # fmt: skip
        exact += sum(o == t[: t.index(EOS)] for o, (_, t) in zip(outs, chunk))
    n = max(len(encoded), 1)
    tokens = max(total, 1)
    return {"exact": exact / n, "token_acc": correct / tokens, "loss": loss_sum / tokens,
            "n": len(encoded)}  # fmt: skip
