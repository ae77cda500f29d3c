"""The bound of every numeric option, declared once, and the argparse converter that enforces it.

Every size, count, rate and index the CLI takes is read by ``Bound.convert``: a number (an
integer may be written ``1e4``), finite, and inside its bound, or one line naming the option
and the bound, exit 2, before anything is built, allocated or printed (argparse converts
while it parses, before any verb runs). ``BOUNDS`` below is the one table; ``apply`` gives
each option of each verb its bound when the parser is built, and a test walks the parsers and
checks that every numeric option has one.

The table's bounds are what no machine and no model can use past (an integer index is
bounded by the model instead, which says how many layers or heads it has). What depends on
the machine and the model is checked once they are known, still before any work:
``--threads`` against the cores (``attnlab.runtime.max_threads``), ``train``'s sizes against
the memory they need (``attnlab.training.memory.check_fits``; ``--force`` to try anyway),
``generate``'s ``--max-new-tokens`` and ``--num-samples`` against the memory their buffers
need (``attnlab.cli.generate``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass

from attnlab.errors import AttnlabError


class LimitError(AttnlabError):
    """A value past what the machine or the model can do (one line, exit 2)."""


SEED_MAX = 2**32 - 1  # what every generator attnlab seeds accepts (numpy's legacy one too)
GAUSS_LEGENDRE_MAX = 256  # its nodes cost O(n^3) (1024: seconds; 2048: 20 s) and integrate
# polynomials of degree 2n - 1 exactly: 256 nodes are far past what attribution needs
SIZE_MAX = 2**20  # a width, a vocabulary, a batch: past a million no model here fits anywhere
STEPS_MAX = 10**9  # optimizer steps and intervals: 11 days at a microsecond a step
INDEX_MAX = 2**31 - 1  # an index; the model then says how many it has


@dataclass(frozen=True)
class Bound:
    """``kind`` (int or float) in [low, high] (``low_open``: low itself excluded; None: no
    bound that side). ``high`` may be a function of nothing (a bound read from the machine).
    ``why`` says where an upper bound comes from, after the number."""

    kind: type = int
    low: float | None = None
    high: float | Callable[[], float] | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    def upper(self) -> float | None:
        return self.high() if callable(self.high) else self.high

    def describe(self, side: str = "both") -> str:
        """The bound in words: 'positive', '>= 0', 'in [0, 1)', 'at most 1048576'; ``side``
        'low' or 'high' says only that side (a fraction's range is always said whole)."""
        low, high = self.low, self.upper()
        if low is not None and high is not None and high <= 1:
            lo, hi = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"in {lo}{_num(low)}, {_num(high)}{hi}"
        parts = []
        if low is not None and side != "high":
            if (self.low_open and low == 0) or (self.kind is int and low == 1):
                parts.append("positive")
            else:
                parts.append(f"{'>' if self.low_open else '>='} {_num(low)}")
        if high is not None and side != "low":
            parts.append(f"{'below' if self.high_open else 'at most'} {_num(high)}")
        return " and ".join(parts) or "a finite number"

    def check(self, value: float, text: str) -> None:
        """Raise ArgumentTypeError('must be ..., got TEXT') when ``value`` is out of bounds."""
        low, high = self.low, self.upper()
        if low is not None and (value <= low if self.low_open else value < low):
            raise argparse.ArgumentTypeError(f"must be {self.describe('low')}, got {text}")
        if high is not None and (value >= high if self.high_open else value > high):
            why = f" ({self.why})" if self.why else ""
            raise argparse.ArgumentTypeError(f"must be {self.describe('high')}{why}, got {text}")

    def convert(self, text: str):
        """The argparse ``type``: the number ``text`` names, checked against the bound."""
        s = text.strip()
        try:
            value = float(s)
        except ValueError:
            what = "an integer" if self.kind is int else "a number"
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {s}")
        if self.kind is int:
            try:
                number = int(s)  # exact, however many digits
            except ValueError:  # 1e4, 2.0: a whole number written as a float
                if not value.is_integer():
                    raise argparse.ArgumentTypeError(f"must be an integer, got {s}") from None
                number = int(value)
            self.check(number, s)
            return number
        self.check(value, s)
        return value

    def converter(self) -> Callable[[str], float]:
        """``convert`` as a function carrying this bound as ``.bound`` (apply and the tests
        read it), named after its kind as argparse names a type."""

        def conv(text: str):
            return self.convert(text)

        conv.__name__ = self.kind.__name__
        conv.bound = self  # type: ignore[attr-defined]
        return conv


def _num(x: float) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e16:
        x = int(x)
    return f"{x:g}" if isinstance(x, float) else str(x)


def bounded(kind: type = int, low=None, high=None, **kw):
    """An argparse type enforcing ``Bound(kind, low, high, ...)``; it carries the bound as
    ``.bound`` (so ``apply`` and the tests can read it)."""
    return Bound(kind, low, high, **kw).converter()


def _threads_max() -> int:
    from attnlab.runtime import max_threads

    return max_threads()


def _count(high: float = SIZE_MAX, low: int = 1, why: str = "") -> Bound:
    return Bound(int, low, high, why=why)


def _rate(high: float, low: float = 0.0, low_open: bool = False, why: str = "") -> Bound:
    return Bound(float, low, high, low_open=low_open, why=why)


INDEX = Bound(int, 0, INDEX_MAX, why="the model then says how many it has")
POSITION = Bound(int, -INDEX_MAX, INDEX_MAX, why="negative counts from the end")
SEED = Bound(int, 0, SEED_MAX, why="2**32 - 1, what every random generator here takes")
ROWS = _count(10**6, why="rows to show")
BEAM = _count(1024, why="each beam is a whole decoding")
ALPHA = _rate(10.0, why="a length-penalty exponent; 0.6-1 is usual")

# option dest -> its bound, for every verb that has the option; (verb, dest) -> a bound that
# differs for that verb. Only options that take a number are here.
BOUNDS: dict = {
    # every verb that runs a model
    "threads": Bound(int, 1, _threads_max, why="4 per core this process may use"),
    # train: sizes (the memory they need is checked too: attnlab.training.memory.check_fits)
    "vocab_size": _count(),
    "min_freq": _count(STEPS_MAX),
    "n_layer": _count(),
    "n_head": _count(),
    "kv_heads": _count(),
    "d_model": _count(),
    "block_size": _count(),
    "patch_size": _count(4096, why="a patch of 4096 x 4096 pixels"),
    "dropout": Bound(float, 0.0, 1.0, high_open=True),
    "label_smoothing": Bound(float, 0.0, 1.0, high_open=True),
    "val_fraction": Bound(float, 0.0, 1.0, high_open=True),
    # train: optimisation
    "max_iters": _count(STEPS_MAX),
    "batch_size": _count(),
    "grad_accum": _count(),
    "lr": _rate(10.0, low_open=True, why="an AdamW step of 10 per weight already diverges"),
    "min_lr": _rate(10.0),
    "warmup_iters": _count(STEPS_MAX, low=0),
    "lr_decay_iters": _count(STEPS_MAX),
    "weight_decay": _rate(100.0),
    "beta1": Bound(float, 0.0, 1.0, high_open=True),
    "beta2": Bound(float, 0.0, 1.0, high_open=True),
    "cooldown_iters": _count(STEPS_MAX, low=0),
    "muon_lr": _rate(10.0, low_open=True, why="an orthogonal step of 10 already diverges"),
    "muon_momentum": Bound(float, 0.0, 1.0, high_open=True),
    "embed_lr": _rate(10.0, low_open=True, why="an AdamW step of 10 per weight already diverges"),
    "head_lr": _rate(10.0, low_open=True, why="an AdamW step of 10 per weight already diverges"),
    "eval_batch_size": _count(),
    "softcap": _rate(1e4, why="a cap past 10^4 caps no logit a float32 softmax can tell apart"),
    "grad_clip": _rate(1e6, why="a gradient norm clip past 1e6 clips nothing; 0 turns it off"),
    "eval_interval": _count(STEPS_MAX),
    "eval_iters": _count(10**6),
    "log_interval": _count(STEPS_MAX),
    "checkpoint_seconds": _rate(1e7, why="about 4 months; 0 checkpoints at evaluations only"),
    "seed": SEED,
    "snapshot_every": _count(STEPS_MAX, low=0),
    # decoding: generate, translate, predict (the memory they need is checked once the model is
    # loaded: attnlab.cli.generate)
    "max_new_tokens": _count(2**40, low=0),
    "max_len": _count(4096, why="tokens in one output; a Transformer also stops at its max_len"),
    "temperature": _rate(100.0, why="past 100 every token is as likely as any"),
    "top_k": _count(),
    "top_p": Bound(float, 0.0, 1.0, low_open=True),
    "repetition_penalty": _rate(100.0, low_open=True),
    "num_samples": _count(2**16),
    "sinks": _count(SIZE_MAX, why="first tokens kept; the model then says how many fit"),
    "beam": BEAM,
    "alpha": ALPHA,
    # eval
    ("eval", "batch_size"): _count(2**16, why="examples in one forward pass"),
    ("eval", "max_tokens"): _count(2**40),
    "limit": _count(STEPS_MAX, low=0),
    # look inside and intervene
    "layer": INDEX,
    "head": INDEX,
    "start": INDEX,
    "position": POSITION,
    "top": ROWS,
    "sources": ROWS,
    ("explore", "max_tokens"): _count(4096, why="the page holds every head's T x T map"),
    "length": _count(2**16, why="tokens per probe"),
    "batch": _count(2**10, why="probes"),
    ("lens", "max_tokens"): _count(2**24, low=2, why="tokens recorded at every layer"),
    "ridge": _rate(1e6),
    "steps": _count(4096, why="a forward and backward pass each; Gauss-Legendre: at most 256"),
    "residual": _rate(1.0),
    "windows": _count(1024, why="every window is scored again for every head"),
    # circuit
    ("circuit", "k"): _count(INDEX_MAX, why="units; the graph then says how many it has"),
    "fraction": Bound(float, 0.0, 1.0, low_open=True),
    "reach": Bound(float, 0.0, 1.0, low_open=True),
    "random_sets": _count(10_000, low=20, why="sets per size, each a patched forward pass"),
    "resamples": _count(10**6, why="bootstrap resamples of the pairs"),
    "acdc": _rate(1e6, why="tau, a drop in faithfulness"),
    "induction": _count(4096, why="pairs, each a forward pass per patched set"),
    "half": _count(4096, why="tokens repeated"),
    # attention by hand (walk) and its what-ifs (what-if): hand-sized
    ("walk", "n"): _count(256, why="tokens by hand; a real run: attnlab trace"),
    "m": _count(1024, why="columns of X by hand"),
    "d_k": _count(1024, why="columns of W_Q and W_K by hand"),
    "d_v": _count(1024, why="columns of W_V by hand"),
    ("walk", "temperature"): _rate(100.0, low_open=True, why="past 100 the weights are uniform"),
    ("what-if", "temperature"): _rate(100.0, low_open=True, why="past 100 the weights are uniform"),
    "pad": _count(256, low=0, why="pad positions"),
    "sequences": _count(1024, why="every head is scored on every sequence"),
    # serve
    "port": Bound(int, 0, 65535, why="a TCP port; 0 picks a free one"),
    "memory_gb": Bound(float, 0.0, 4096.0, low_open=True, why="GiB of weights held at once"),
    "max_text": _count(100_000, why="characters of one input; every panel runs on it"),
}


def bound_for(verb: str, dest: str) -> Bound | None:
    return BOUNDS.get((verb, dest)) or BOUNDS.get(dest)


def is_numeric(action: argparse.Action) -> bool:
    """An option that takes a number: typed int or float, or already bounded."""
    return action.type in (int, float) or hasattr(action.type, "bound")


def apply(parsers: dict[str, argparse.ArgumentParser]) -> None:
    """Give every numeric option of every verb its bound from ``BOUNDS`` (an option missing
    from the table keeps its own converter; a test finds it)."""
    for verb, parser in parsers.items():
        for action in parser._actions:
            if not action.option_strings or not is_numeric(action):
                continue
            bound = bound_for(verb, action.dest)
            if bound is not None:
                action.type = bound.converter()


def numeric_options(parsers: dict[str, argparse.ArgumentParser]):
    """(verb, option string, dest, action) of every numeric option: what the tests walk."""
    for verb, parser in parsers.items():
        for action in parser._actions:
            if action.option_strings and is_numeric(action):
                yield verb, action.option_strings[-1], action.dest, action


def check_decoding_memory(
    model, sequences: int, prompt_len: int, new_tokens: int, use_cache: bool = True
) -> None:
    """Refuse (a LimitError, one line) decoding whose buffers cannot fit in the memory of the
    model's device, before any token is printed: ``sequences`` rows (prompts x samples or
    beams) of ``prompt_len + new_tokens`` ids, held twice as int64 (the ids fed and the ids
    sampled), a KV cache of up to block_size positions per layer, and the (B, V) logits a step
    makes. Says how many new tokens do fit."""
    from attnlab.training.memory import GIB, HUGE_FRACTION, device_memory

    device = next(model.parameters()).device
    have = device_memory(device)
    if have is None:
        return
    c = model.config
    layers = config_field(c, "n_layer", "n_decoder_layers")
    width = config_field(c, "d_model", "d_hidden")
    block = config_field(c, "block_size", "max_len")  # none: an LSTM, which keeps no cache
    vocab = config_field(c, "vocab_size", "tgt_vocab_size")
    window = min(block, prompt_len + new_tokens)
    fixed = sequences * (2 * layers * window * width * 4 if use_cache else 0)  # KV cache
    fixed += sequences * vocab * 4 * 4  # logits, probabilities, a sort for top-p, a mask
    per_token = 16 * sequences  # int64 ids, twice
    need = fixed + per_token * (prompt_len + new_tokens)
    budget = HUGE_FRACTION * have
    if need <= budget:
        return
    most = int((budget - fixed) // per_token) - prompt_len
    where = "this machine" if device.type == "cpu" else str(device)
    fit = (
        f"at most {most:,} new tokens fit (--max-new-tokens)"
        if most > 0
        else "fewer prompts or --num-samples fit"
    )
    raise LimitError(
        f"generating {new_tokens:,} tokens for {sequences:,} sequence{'s' * (sequences != 1)} "
        f"needs about {need / GIB:,.1f} GiB, past the {budget / GIB:.1f} GiB {where} may use "
        f"({HUGE_FRACTION:.0%} of its {have / GIB:.1f} GiB): {fit}"
    )


def config_field(config, *names: str) -> int:
    """The first of ``names`` that ``config`` (a config object or its dict) sets, else 0."""
    for name in names:
        value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def check_forward_memory(
    config, device, rows: int, tokens: int, option: str, record: bool = False
) -> None:
    """Refuse (a LimitError naming ``option``, one line) a forward pass over ``rows``
    sequences of ``tokens`` tokens whose memory cannot fit in ``device``'s, before it runs:
    the logits and their log-probabilities (8 bytes a vocabulary entry a token), the residual
    stream (4 floats a channel a token, a few per layer when every activation is recorded) and,
    recorded, every head's scores and weights (8 bytes a query a key). Says how many rows fit.
    ``config`` is the model's config (or its dict from config.json)."""
    from attnlab.training.memory import GIB, HUGE_FRACTION, device_memory

    have = device_memory(device)
    if have is None or rows < 1 or tokens < 1:
        return
    vocab = config_field(config, "vocab_size", "tgt_vocab_size", "n_classes")
    width = config_field(config, "d_model", "d_hidden")
    layers = config_field(config, "n_layer") or (
        config_field(config, "n_encoder_layers") + config_field(config, "n_decoder_layers")
    )
    heads = config_field(config, "n_head")
    per_row = tokens * (8 * vocab + 4 * width * (8 * max(layers, 1) if record else 4))
    if record:
        per_row += 8 * heads * max(layers, 1) * tokens * tokens
    budget = HUGE_FRACTION * have
    if rows * per_row <= budget:
        return
    most = int(budget // per_row)
    where = "this machine" if device.type == "cpu" else str(device)
    raise LimitError(
        f"{option} {rows:,}: {rows:,} sequences of {tokens:,} tokens need about "
        f"{rows * per_row / GIB:,.1f} GiB in one pass of this model, past the "
        f"{budget / GIB:.1f} GiB {where} may use ({HUGE_FRACTION:.0%} of its "
        f"{have / GIB:.1f} GiB): at most {max(most, 1):,} fit"
    )
