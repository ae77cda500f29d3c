"""Induction: a small attention-only GPT learns to continue a repeat, and forms induction heads.

data    ``repeat`` (the default): random token sequences that repeat with a period p drawn per
        sequence, x = r[0..p-1] r[0..p-1] r[0..] ... cut to block_size tokens, the p tokens of
        r all different (``distinct=0``: drawn independently); parameters override:
        ``repeat:vocab=64,min_period=8,max_period=40,distinct=1``. The tokens are the first
        ``vocab`` of 0-9 a-z A-Z and punctuation, so a run reads text ("abcabc").
        Or any text file (a language model on it, in char tokens by default).
model   the ``attn-only-2l`` preset: 2 layers of attention only (no MLP), 2 heads of width 32,
        rotary positions, untied embeddings (``attnlab.models.gpt``)
loss    next-token cross-entropy at every position (the first period is noise: ln V at best)
figures the in-context loss: on sequences r r that repeat once (r of block_size / 2 tokens),
        ``loss_first_half`` (predicting r, which nothing gives away) and ``loss_repeated_half``
        (predicting r again, which an induction head copies from the first half)

Why these defaults (measured with plain PyTorch, then through this task; see docs/interpretability.md):
with learned absolute positions the model takes a positional shortcut (a fixed period of 32:
the repeated half reaches 0 with no previous-token head); periods drawn per sequence and rotary
positions make the two-head circuit the way to win: a previous-token head in layer 0, and an
induction head in layer 1 that finds, by K-composition with it, the token after the earlier
occurrence of the current one. With 4 heads of width 16 per layer the previous-token job was
split over several layer-0 heads (none above 0.44); with 2 heads of width 32 one head does it.
What kept that head under 0.5 on some seeds is a split: both layer-0 heads attending to t-1
(0.40-0.46 each) mixed with t-2 or with the token itself, unchanged from step 400 to 1000. At
lr 2e-3, tokens drawn independently (``distinct=0``: tokens recur within a period, so matching
two tokens back pays) split on 3 of 5 seeds (on seed 3, one head per layer: 0.47, vocab 94:
0.43, no weight decay: 0.46, all kept it); all different (``distinct=1``) mixed t-1 with
self-attention on 4 of 5. At lr 5e-3 with independent tokens seed 3 formed the head (0.72)
but seed 2 split (0.44; 0.48 in 2000 steps). At lr 5e-3 with all-different tokens, the
defaults, seeds 1-6 all formed one previous-token head (0.68-0.75) and induction heads at
0.99-1.00 by step 250, and the repeated half ends at 0.13-0.14 nats
(``benchmarks/induction.py``).

``evaluate_in_context(model)`` is what ``attnlab eval`` reports; ``eval --ablate`` reports the
same figures (``evaluate``) intact and with heads ablated (``attnlab.interventions``).
"""

from __future__ import annotations

import dataclasses
import math
import string
from pathlib import Path

import numpy as np
import torch

from attnlab.config import ConfigError
from attnlab.data import DataError
from attnlab.data.batches import RandomBatches
from attnlab.metrics import Metric, half_losses
from attnlab.models.gpt import GPTConfig
from attnlab.modes import evaluating
from attnlab.tasks.base import Task, register
from attnlab.tasks.lm import LanguageModel, LMOptions
from attnlab.tokenizers import CharTokenizer
from attnlab.train_config import default_snapshot_interval

SYMBOLS = string.digits + string.ascii_lowercase + string.ascii_uppercase + string.punctuation
REPEAT = "repeat"
REPEAT_DEFAULTS = {"vocab": 64, "min_period": 8, "max_period": 40, "distinct": 1}
EVAL_SEQUENCES = 64  # once-repeated sequences the in-context loss is measured on
VAL_SEED, EVAL_SEED = 1_000_003, 2_000_003  # held-out draws, apart from the training seed


def is_generated(data: str) -> bool:
    return data.partition(":")[0] == REPEAT and not Path(data).exists()


def parse_repeat(spec: str) -> dict[str, int]:
    """``repeat:vocab=32,max_period=20`` -> every parameter, defaults filled in."""
    _, _, rest = spec.partition(":")
    params = dict(REPEAT_DEFAULTS)
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in params:
            raise DataError(f"{REPEAT}: unknown parameter {key!r}; known: {', '.join(params)}")
        try:
            params[key] = int(value)
        except ValueError:
            raise DataError(f"{REPEAT}: {key} must be an integer, got {value!r}") from None
    if not 2 <= params["vocab"] <= len(SYMBOLS):
        raise DataError(f"{REPEAT}: vocab must be in 2..{len(SYMBOLS)}, got {params['vocab']}")
    if not 1 <= params["min_period"] <= params["max_period"]:
        raise DataError(f"{REPEAT}: need 1 <= min_period <= max_period, got "
                        f"{params['min_period']}, {params['max_period']}")  # fmt: skip
    if params["distinct"] not in (0, 1):
        raise DataError(f"{REPEAT}: distinct must be 0 or 1, got {params['distinct']}")
    if params["distinct"] and params["max_period"] > params["vocab"]:
        raise DataError(f"{REPEAT}: distinct tokens in a period of {params['max_period']} need "
                        f"vocab >= max_period, got vocab {params['vocab']}")  # fmt: skip
    return params


def random_tokens(n: int, length: int, vocab: int, distinct: bool, g: torch.Generator):
    """(n, length) random token ids; ``distinct``: no token twice in a row of the first
    ``min(length, vocab)`` (each row a random arrangement of the vocabulary)."""
    if distinct:
        return torch.rand(n, vocab, generator=g).argsort(dim=1)[:, :length]  # (n, length)
    return torch.randint(0, vocab, (n, length), generator=g)


def repeating(n: int, length: int, vocab: int, min_period: int, max_period: int,
              g: torch.Generator, distinct: int = 0) -> torch.Tensor:  # fmt: skip
    """(n, length) token ids: row i is r_i (p_i random tokens, all different when
    ``distinct``) repeated, p_i drawn uniformly from [min_period, max_period]."""
    p = torch.randint(min_period, max_period + 1, (n,), generator=g)  # (n,) periods
    r = random_tokens(n, max_period, vocab, bool(distinct), g)  # (n, max_period)
    idx = torch.arange(length)[None, :] % p[:, None]  # (n, length) position within the period
    return torch.gather(r, 1, idx)


def repeated_once(n: int, half: int, vocab: int, g: torch.Generator,
                  distinct: int = 0) -> torch.Tensor:  # fmt: skip
    """(n, 2 * half) sequences r r: the evaluation of in-context learning."""
    r = random_tokens(n, half, vocab, bool(distinct) and half <= vocab, g)
    return torch.cat([r, r], dim=1)


@dataclasses.dataclass
class InductionOptions(LMOptions):
    data: str = REPEAT
    preset: str = "attn-only-2l"

    def validate(self) -> None:
        super().validate()
        if is_generated(self.data):
            p = parse_repeat(self.data)
            block = self.model_config(1).block_size
            if p["max_period"] >= block:
                raise ConfigError(
                    f"{REPEAT}: max_period ({p['max_period']}) must be below block_size "
                    f"({block}), so that every sequence repeats"
                )


@register
class Induction(LanguageModel):
    name = "induction"
    order = 60
    label = "--task induction"
    Options = InductionOptions
    metrics = (Metric("loss_first_half", "first-half loss", "nats/token"),
               Metric("loss_repeated_half", "repeated-half loss", "nats/token"))  # fmt: skip
    best = "loss_repeated_half"
    train_defaults = {"max_iters": 1000, "batch_size": 32, "lr": 5e-3, "eval_iters": 8}

    def __init__(self, options: InductionOptions, seed: int = 1337):
        super().__init__(options, seed)
        self.repeat = parse_repeat(options.data) if is_generated(options.data) else None

    @classmethod
    def defaults_for(cls, given: dict) -> dict:
        d = dict(cls.train_defaults)
        steps = given.get("max_iters") if isinstance(given, dict) else None
        d["snapshot_every"] = default_snapshot_interval(steps or d["max_iters"])
        return d

    @classmethod
    def default_out(cls, options) -> Path:
        if is_generated(options.data):
            return Path("runs") / "induction"
        return super().default_out(options)

    @property
    def data_files(self) -> tuple[str, ...]:
        return () if self.repeat else LanguageModel.data_files

    # -- data ----------------------------------------------------------------------------------

    def prepare(self, run_dir):
        if self.repeat is None:
            return super().prepare(run_dir)
        self.tokenizer = CharTokenizer(SYMBOLS[: self.repeat["vocab"]])

    def reload(self, run_dir, tokenizer, cfg):
        if self.repeat is None:
            return super().reload(run_dir, tokenizer, cfg)
        self.tokenizer = tokenizer

    def restore(self, cfg):
        if self.repeat is not None:
            return
        super().restore(cfg)

    @classmethod
    def fine_tunes(cls, model_class: type) -> bool:
        """None: the task sizes its own model (and its generated symbols' vocabulary)."""
        return False

    def model_config(self) -> GPTConfig:
        vocab = self.repeat["vocab"] if self.repeat else self.tokenizer.vocab_size
        return self.options.model_config(vocab)

    # -- batches -------------------------------------------------------------------------------

    def _make(self, n: int, g: torch.Generator):
        r = self.repeat
        seq = repeating(n, self.block_size + 1, r["vocab"], r["min_period"], r["max_period"], g,
                        r["distinct"])  # fmt: skip
        return seq[:, :-1], seq[:, 1:]  # x, y (n, T)

    def train_batches(self, batch_size, seed, rank=0, world_size=1):
        if self.repeat is None:
            return super().train_batches(batch_size, seed, rank, world_size)
        return RandomBatches(self._make, batch_size, seed, rank, world_size)

    def val_batches(self, batch_size, eval_iters):
        if self.repeat is None:
            return super().val_batches(batch_size, eval_iters)
        g = torch.Generator().manual_seed(VAL_SEED + self.seed)
        return [self._make(batch_size, g) for _ in range(eval_iters)]

    def train_eval_batches(self, batch_size, eval_iters):
        return [] if self.repeat else super().train_eval_batches(batch_size, eval_iters)

    def eval_sequences(self, n: int = EVAL_SEQUENCES) -> torch.Tensor:
        """The fixed once-repeated sequences r r (n, 2 * half), half = block_size // 2: random
        tokens, or (a text run) stretches of the held-out text, each repeated."""
        half = self.block_size // 2
        g = torch.Generator().manual_seed(EVAL_SEED + self.seed)
        if self.repeat:
            return repeated_once(n, half, self.repeat["vocab"], g, self.repeat["distinct"])
        tokens = self.val_tokens
        starts = torch.randint(0, len(tokens) - half, (n,), generator=g).tolist()
        # np.asarray: the held-out tokens may be shards on disk (a slice of them is a view)
        r = torch.stack([torch.as_tensor(np.asarray(tokens[s : s + half]), dtype=torch.int64)
                         for s in starts])  # fmt: skip
        return torch.cat([r, r], dim=1)

    def sample_inputs(self, n, max_len):
        if self.repeat is None:
            return super().sample_inputs(n, max_len)
        g = torch.Generator().manual_seed(VAL_SEED + self.seed)
        return self._make(n, g)[0][:, :max_len], True

    # -- figures -------------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate_in_context(self, model, n: int = EVAL_SEQUENCES) -> dict:
        """The next-token loss on each half of ``n`` once-repeated sequences, and ln V (the
        loss of a uniform guess). With heads ablated: run it inside
        ``attnlab.interventions.ablate(model, heads="1.0,1.1")`` (what ``eval --ablate``
        does, through ``evaluate``)."""
        device = next(model.parameters()).device
        x = self.eval_sequences(n).to(device)
        with evaluating(model):
            first, repeated = half_losses(model(x), x)
        return {"loss_first_half": first, "loss_repeated_half": repeated,
                "ln_vocab": math.log(model.config.vocab_size), "sequences": n,
                "half": x.size(1) // 2}  # fmt: skip

    def eval_fields(self, options):
        """A language model's with ``--data``; without it, only what its own sequences read."""
        return super().eval_fields(options) if options.data is not None else Task.eval_reads

    def score(self, model, options=None):
        """``attnlab eval``: the in-context loss (``evaluate_in_context``; ``options.limit``:
        of that many sequences, at most the usual ``EVAL_SEQUENCES``); with ``options.data``,
        a language model's figures on that text."""
        from attnlab.evaluation import Evaluation, Figure

        if options is not None and options.data is not None:
            return super().score(model, options)
        limit = options.limit if options is not None else 0
        r = self.evaluate_in_context(model, min(limit, EVAL_SEQUENCES) if limit else EVAL_SEQUENCES)
        figures = [
            Figure("loss_first_half", "first-half loss", r["loss_first_half"], "nats/token"),
            Figure(
                "loss_repeated_half", "repeated-half loss", r["loss_repeated_half"], "nats/token"
            ),  # fmt: skip
            Figure("ln_vocab", "ln V (a uniform guess)", r["ln_vocab"]),
            Figure("sequences", "sequences", r["sequences"], "count"),
            Figure("half", "tokens per half", r["half"], "count"),
        ]
        where = f"in-context loss on {r['sequences']} sequences r r (r of {r['half']} tokens)"
        return Evaluation(self.name, where, figures)

    def evaluate(self, model, val_loss):
        r = self.evaluate_in_context(model)
        self._measured = r  # the evaluation's example line says these same numbers
        return {k: r[k] for k in ("loss_first_half", "loss_repeated_half")}

    def example(self, model):
        """The evaluation's in-context losses beside ln V: the same sequences and numbers as
        its eval line (one value for one loss), measured again only if none was taken."""
        if self.repeat is None:
            return super().example(model)
        r, self._measured = (
            getattr(self, "_measured", None) or self.evaluate_in_context(model),
            None,
        )
        return (f"in context: first half {r['loss_first_half']:.4f}, repeated half "
                f"{r['loss_repeated_half']:.4f} nats (ln V = {r['ln_vocab']:.3f}, a uniform "
                "guess)")  # fmt: skip

    # -- the run directory ---------------------------------------------------------------------

    @property
    def title(self) -> str:
        return f"induction: {self.options.data}"

    def run_config(self) -> dict:
        if self.repeat is None:
            return super().run_config()
        return {"task": self.name, "task_options": self.options.to_dict(),
                "data": self.options.data, "repeat": self.repeat}  # fmt: skip

    def describe(self, model) -> str:
        n = sum(p.numel() for p in model.parameters())
        if self.repeat is None:
            return f"{super().describe(model)}; in-context loss on repeated text"
        r = self.repeat
        return (f"random tokens repeating with a period of {r['min_period']}-{r['max_period']} "
                f"(vocabulary {r['vocab']}), {self.block_size} per sequence; {n:,} parameters")  # fmt: skip

    def summary(self, result, final) -> str:
        ev = result.last_eval
        if "loss_repeated_half" not in ev:
            return f"trained {result.step} steps"
        lnv = math.log(self.model_config().vocab_size)
        return (f"trained {result.step} steps: in-context loss {ev['loss_repeated_half']:.3f} "
                f"nats on the repeated half, {ev['loss_first_half']:.3f} on the first "
                f"(ln V = {lnv:.3f})")  # fmt: skip
