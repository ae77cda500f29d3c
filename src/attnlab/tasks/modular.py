"""Modular addition: a one-layer transformer learns (a + b) mod p from some of the pairs, and, long
after it has memorised them, generalises to the rest ("grokking", Power et al. 2022; the setup
of Nanda et al. 2023, "Progress measures for grokking via mechanistic interpretability").

data    ``add`` (the default): every pair (a, b) of 0 .. p-1, read as the three tokens "a b =";
        the answer is (a + b) mod p. A fraction ``frac`` of the p^2 pairs, drawn with the run's
        seed, is the training split, the rest the test split (``eval``'s held-out one):
        ``add:p=113,frac=0.3`` (the defaults), p in 2..1000, frac in (0, 1) leaving at least
        one pair on each side. The vocabulary is <unk>, the numbers "0" .. "p-1" (ids 1 .. p)
        and "=" (id p + 1): a word tokenizer, so ``attnlab predict RUN "12 5 ="`` reads.
batch   full batch: every training pair at every step (``--batch-size`` smaller: minibatches
        that visit every pair once per epoch)
model   the ``grokking`` shape: 1 layer, width 128, 4 heads of 32, a ReLU MLP of 512, no
        LayerNorm anywhere, learned positions, an unembedding of its own (``--n-layer``,
        ``--n-head``, ``--d-model`` change it; the MLP stays 4x the width), initialised as the
        paper's (``build_model``)
loss    cross-entropy of the answer at the last position ("="), over the p number tokens only
        (the paper's unembedding has p outputs; <unk> and "=" are never answers)
figures test loss (val_loss), test accuracy, train accuracy; train loss on the whole training
        split at each evaluation

The Fourier reading of a trained run (its embedding's power per frequency, key frequencies,
restricted and excluded loss) is ``attnlab.inspect.fourier``; ``attnlab experiment grokking``
trains the paper's setup and reports it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.config import BaseConfig, ConfigError
from attnlab.data import DataError
from attnlab.data.batches import EpochBatches
from attnlab.metrics import Metric
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.modes import evaluating
from attnlab.tasks.base import EvalOptions, Task, predict_options, register
from attnlab.tokenizers import WordTokenizer

ADD = "add"
ADD_DEFAULTS = {"p": 113, "frac": 0.3}
P_MAX = 1000  # p^2 = 10^6 pairs: a full batch of them is already ~1 GiB of activations
EQUALS = "="
SPLIT_SEED = 7_000_003  # the split's generator is seeded apart from the weights' seed


def is_generated(data: str) -> bool:
    return data.partition(":")[0] == ADD and not Path(data).exists()


def parse_add(spec: str) -> dict:
    """``add:p=97,frac=0.5`` -> {"p": 97, "frac": 0.5}, defaults filled in, bounds checked."""
    name, _, rest = spec.partition(":")
    if name != ADD or Path(spec).exists():
        raise DataError(f"--task modular reads the generated data {ADD!r} "
                        f"({ADD}:p=113,frac=0.3), got {spec!r}")  # fmt: skip
    params: dict = dict(ADD_DEFAULTS)
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in params:
            raise DataError(f"{ADD}: unknown parameter {key!r}; known: {', '.join(params)}")
        try:
            params[key] = int(value) if key == "p" else float(value)
        except ValueError:
            what = "an integer" if key == "p" else "a number"
            raise DataError(f"{ADD}: {key} must be {what}, got {value!r}") from None
    p, frac = params["p"], params["frac"]
    if not 2 <= p <= P_MAX:
        raise DataError(f"{ADD}: p must be in 2..{P_MAX}, got {p}")
    n_train = round(frac * p * p)
    if not (0 < frac < 1 and 1 <= n_train < p * p):
        raise DataError(f"{ADD}: frac must be in (0, 1) and leave at least one of the {p * p} "
                        f"pairs on each side, got {frac:g}")  # fmt: skip
    return params


def split_sizes(p: int, frac: float) -> tuple[int, int]:
    """(training pairs, test pairs) of p^2."""
    n_train = round(frac * p * p)
    return n_train, p * p - n_train


@dataclasses.dataclass
class ModularOptions(BaseConfig):
    data: str = ADD
    n_layer: int | None = None  # None: 1
    n_head: int | None = None  # None: 4
    d_model: int | None = None  # None: 128 (the MLP is 4x it)

    def validate(self) -> None:
        if self.data and is_generated(self.data):  # bounds said when the options are made;
            parse_add(self.data)  # any other data is refused when the task reads it
        self._positive_or_none("n_layer", "n_head", "d_model")
        self.model_config(3)

    def model_config(self, vocab_size: int) -> GPTConfig:
        """Nanda et al.'s model: 1 layer, width 128, 4 heads, ReLU MLP 512, no LayerNorm,
        learned positions for the 3 tokens, untied unembedding."""
        d = self.d_model or 128
        return GPTConfig(vocab_size=vocab_size, block_size=3, n_layer=self.n_layer or 1,
                         n_head=self.n_head or 4, d_model=d, d_ff=4 * d, dropout=0.0,
                         activation="relu", norm="none", tie_weights=False)  # fmt: skip


@register
class ModularAddition(Task):
    name = "modular"
    order = 70  # after induction in --task's choices
    label = "--task modular"
    Options = ModularOptions
    unit = "pairs"
    loss_unit = "nats / pair"
    metrics = (Metric("val_accuracy", "test accuracy", "%", higher_is_better=True),
               Metric("train_accuracy", "train accuracy", "%", higher_is_better=True))  # fmt: skip
    best = "val_accuracy"
    splits = ("test", "train")
    # Nanda et al.'s AdamW (lr 1e-3, weight decay 1, betas 0.9/0.98, 10 warmup steps, then a
    # constant rate, no clipping), over more steps than the CLI's default run
    train_defaults = {"max_iters": 10000, "lr": 1e-3, "weight_decay": 1.0, "beta2": 0.98,
                      "schedule": "constant", "warmup_iters": 10, "grad_clip": 0.0,
                      "eval_iters": 1}  # fmt: skip

    def __init__(self, options: ModularOptions, seed: int = 1337):
        super().__init__(options, seed)
        self.params = parse_add(options.data)
        self.p = self.params["p"]
        self.train_idx = self.test_idx = None

    @classmethod
    def defaults_for(cls, given: dict) -> dict:
        """The paper's recipe, and a full batch: every training pair at every step."""
        d = dict(cls.train_defaults)
        data = given.get("data") if isinstance(given, dict) else None
        try:
            p = parse_add(data or ADD)
        except DataError:
            p = ADD_DEFAULTS  # refused later by the options' own check, naming the data
        d["batch_size"] = split_sizes(p["p"], p["frac"])[0]
        steps = given.get("max_iters") if isinstance(given, dict) else None
        d["eval_interval"] = max(1, min(100, (steps or d["max_iters"]) // 50))
        return d

    @classmethod
    def default_out(cls, options) -> Path:
        return Path("runs") / "modular"

    @property
    def title(self) -> str:
        return f"modular addition mod {self.p}, {self.params['frac']:g} of the pairs trained"

    # -- data ----------------------------------------------------------------------------------

    def prepare(self, run_dir) -> None:
        self.tokenizer = WordTokenizer([str(i) for i in range(self.p)] + [EQUALS])
        self._split()

    def reload(self, run_dir, tokenizer, cfg) -> None:
        self.tokenizer = tokenizer
        self._split()

    def restore(self, cfg) -> None:
        self._split()

    def _split(self) -> None:
        """The training pairs: a random ``frac`` of the p^2, drawn from the run's seed."""
        n_train, _ = split_sizes(self.p, self.params["frac"])
        g = torch.Generator().manual_seed(SPLIT_SEED + self.seed)
        perm = torch.randperm(self.p * self.p, generator=g)  # pair a * p + b
        self.train_idx, self.test_idx = perm[:n_train], perm[n_train:]

    def pairs(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pairs number ``index`` (a * p + b) as token ids x (n, 3), "a b =", and the answer's
        index among the numbers y (n,) = (a + b) mod p."""
        a, b = index // self.p, index % self.p
        eq = torch.full_like(a, self.p + 1)
        x = torch.stack([a + 1, b + 1, eq], dim=1)  # (n, 3) token ids: number n is id n + 1
        return x, (a + b) % self.p

    def all_pairs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every pair, in the order a * p + b: x (p^2, 3), y (p^2,)."""
        return self.pairs(torch.arange(self.p * self.p))

    def model_config(self) -> GPTConfig:
        return self.options.model_config(self.p + 2)

    def build_model(self) -> GPT:
        """The GPT, initialised as Nanda et al.'s: every weight matrix and embedding drawn from
        N(0, 1/d_model), the unembedding from N(0, 1/vocab), biases 0 (a larger start than
        GPT-2's N(0, 0.02), which the memorising phase grows from and weight decay shrinks)."""
        import math

        model = GPT(self.model_config())
        d, v = model.config.d_model, model.config.vocab_size
        with torch.no_grad():
            for name, w in model.named_parameters():
                if w.dim() < 2:
                    w.zero_()
                else:
                    w.normal_(0.0, 1 / math.sqrt(v if name == "lm_head.weight" else d))
        return model

    @classmethod
    def fine_tunes(cls, model_class: type) -> bool:
        return False  # the task sizes its own model from p

    def sample_inputs(self, n, max_len):
        x, _ = self.pairs(self.test_idx[:n])
        return x[:, :max_len], True

    # -- training ------------------------------------------------------------------------------

    def number_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits of the p number tokens at the last position: (B, T, V) -> (B, p)."""
        return logits[:, -1, 1 : self.p + 1]

    def train_batches(self, batch_size, seed, rank=0, world_size=1):
        idx = self.train_idx
        return EpochBatches(len(idx), lambda rows: self.pairs(idx[rows]), batch_size, seed,
                            rank, world_size)  # fmt: skip

    def val_batches(self, batch_size, eval_iters):
        return [self.pairs(self.test_idx)]  # the whole test split: one exact figure

    def train_eval_batches(self, batch_size, eval_iters):
        return [self.pairs(self.train_idx)]

    def loss(self, model, batch):
        x, y = batch
        return F.cross_entropy(self.number_logits(model(x, logits_to_keep=1)).float(), y)

    def count(self, batch) -> int:
        return int(batch[0].size(0))

    @torch.no_grad()
    def accuracy(self, model, index: torch.Tensor) -> float:
        x, y = self.pairs(index)
        device = next(model.parameters()).device
        with evaluating(model):
            pred = self.number_logits(model(x.to(device), logits_to_keep=1)).argmax(-1)
        return float((pred.cpu() == y).float().mean())

    def evaluate(self, model, val_loss):
        return {"val_accuracy": self.accuracy(model, self.test_idx),
                "train_accuracy": self.accuracy(model, self.train_idx)}  # fmt: skip

    def example(self, model) -> str | None:
        x, y = self.pairs(self.test_idx[:1])
        with torch.no_grad(), evaluating(model):
            got = int(self.number_logits(model(x)).argmax(-1))
        a, b = int(x[0, 0]) - 1, int(x[0, 1]) - 1
        return f"test pair: {a} + {b} = {got} (mod {self.p}; the answer is {int(y)})"

    # -- the run directory ---------------------------------------------------------------------

    def run_config(self) -> dict:
        n_train, n_test = split_sizes(self.p, self.params["frac"])
        return {**super().run_config(), "data": self.options.data, "modulus": self.p,
                "train_pairs": n_train, "test_pairs": n_test}  # fmt: skip

    def describe(self, model) -> str:
        n_train, n_test = split_sizes(self.p, self.params["frac"])
        n = sum(q.numel() for q in model.parameters())
        return (f"(a + b) mod {self.p}: {n_train:,} training pairs, {n_test:,} test pairs; "
                f"{n:,} parameters")  # fmt: skip

    def summary(self, result, final) -> str:
        ev = result.last_eval
        if "val_accuracy" not in ev:
            return f"trained {result.step} steps"
        return (f"trained {result.step} steps: test accuracy {100 * ev['val_accuracy']:.1f}%, "
                f"train accuracy {100 * ev['train_accuracy']:.1f}%, test loss "
                f"{result.val_loss:.4f}")  # fmt: skip

    # -- after training ------------------------------------------------------------------------

    def parse(self, text: str) -> tuple[int, int]:
        """ "12 5 =", "12 + 5", "12+5=" -> (12, 5): the two numbers, each in 0 .. p-1."""
        import re

        nums = re.findall(r"-?\d+", text)
        if len(nums) != 2 or not all(0 <= int(n) < self.p for n in nums):
            raise ConfigError(f"{text!r}: a modular addition run reads two numbers in "
                              f"0..{self.p - 1}, e.g. \"12 5 =\"")  # fmt: skip
        return int(nums[0]), int(nums[1])

    @torch.no_grad()
    def predict(self, model, inputs, options=None, **given):
        """The ``top_k`` most probable answers to each "a b =", with probabilities, and the
        right one, (a + b) mod p."""
        top_k = predict_options(options, given).top_k
        out = []
        for text in inputs:
            a, b = self.parse(text)
            x, _ = self.pairs(torch.tensor([a * self.p + b]))
            with evaluating(model):
                probs = torch.softmax(self.number_logits(model(x)).float(), -1)[0]  # (p,)
            top = torch.topk(probs, min(top_k, self.p))
            out.append({"input": text, "a": a, "b": b, "answer": (a + b) % self.p,
                        "next": [{"token": str(i), "id": i + 1, "p": q}
                                 for q, i in zip(top.values.tolist(), top.indices.tolist())]})  # fmt: skip
        return out

    def prediction_lines(self, pred):
        lines = [f"{pred['a']} + {pred['b']} (mod {self.p}) -> (the answer is {pred['answer']})"]
        lines += [f"  {q['p']:.4f}  {q['token']}" for q in pred["next"]]
        return lines

    def score(self, model, options=None):
        """Loss and accuracy on the test split (or ``--split train``), over the p number
        tokens at the last position."""
        from attnlab.evaluation import Evaluation, Figure

        o = options or EvalOptions()
        if o.data is not None:
            raise ConfigError("--task modular scores its own pairs: drop --data (use --split "
                              "test or train)")  # fmt: skip
        split = self.check_split(o)
        index = self.test_idx if split == "test" else self.train_idx
        if o.limit:
            index = index[: o.limit]
        x, y = self.pairs(index)
        device = next(model.parameters()).device
        with torch.no_grad(), evaluating(model):
            logits = self.number_logits(model(x.to(device), logits_to_keep=1)).float().cpu()
        loss = float(F.cross_entropy(logits, y))
        acc = float((logits.argmax(-1) == y).float().mean())
        figures = [Figure("loss", "loss", loss, "nats/pair"),
                   Figure("accuracy", "accuracy", acc, "%"),
                   Figure("pairs", "pairs", len(index), "count")]  # fmt: skip
        return Evaluation(self.name, f"the {split} split of (a + b) mod {self.p}", figures)
