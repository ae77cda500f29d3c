"""Language modelling: a GPT learns to predict the next token of a text.

data    a text file, a directory of .txt files or the built-in ``shakespeare``, tokenized once
        into token shards read from disk (``attnlab.data.stream``): in the run's ``tokens/``,
        or for a corpus of 32 MiB or more (or any, given ``token_cache``) in a cache that the
        next run on the same files reuses; the last ``val_fraction`` of each shard held out
batch   windows x = t[i : i+T], y = t[i+1 : i+T+1]                  (B, T) each
        drawn at random (as nanoGPT does), or for a streamed corpus read once per epoch in a
        shuffled order; either resumes mid-epoch exactly
loss    mean cross-entropy of model(x) (B, T, V) against y, in nats per token
figures val loss, perplexity exp(loss), bits per character loss / ln 2 / (chars per token)
example a short sample continuing the start of the held-out text
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab import data
from attnlab.blocks import ACTIVATIONS
from attnlab.config import BaseConfig, ConfigError
from attnlab.heartbeat import beating
from attnlab.heartbeat import count as count_done
from attnlab.metrics import Metric
from attnlab.models.gpt import ARCHS, FFN_KINDS, GPT, PRESETS, GPTConfig, arch_fields
from attnlab.tasks.base import EvalOptions, Task, on, predict_options, register
from attnlab.tokenizers import Tokenizer, TokenizerError, build_tokenizer
from attnlab.train_config import TrainConfig

MODEL_OPTIONS = ("n_layer", "n_head", "d_model", "block_size", "dropout", "pos")
# the modern-decoder pieces, and the speedrun's (each None unless given: the preset's)
DECODER_OPTIONS = ("arch", "ffn", "kv_heads", "qk_norm", "activation", "tie_weights", "zero_init",
                   "softcap", "bias", "attention", "bos")  # fmt: skip

# How a preset is trained when it is not the TrainConfig default. ``fast``: the quickest way
# found to val <= 1.88 on tiny Shakespeare (nanoGPT's CPU run reaches 1.886 in 2000 steps at lr
# 1e-3; benchmarks/bench.py measures both). Its sizes (models.gpt.PRESETS) are baby's with
# rotary positions and a feed-forward width of 2x, not 4x, d_model: a step costs ~0.7x baby's.
# It trains hotter (lr 3e-3, floor 3e-4, beta2 0.95) for 1100 steps, evaluated once at the end.
# Searched, val on 20 batches at seeds 2 and 3 (1 and 1337 for the choice), final weights also
# on 4,800 fixed windows (in brackets):
#   1100 steps, d_ff 2x, lr 3e-3, beta2 0.95:  1.855, 1.867 (1.851, 1.857); seeds 1 and 1337:
#                                              1.854, 1.858
#   baby sizes + rotary, lr 2e-3, beta2 0.99, 1000 steps (the recipe before): 1.896, 1.892;
#   900 steps at lr 2e-3 floor 0: 1.899, 1.925; at 3e-3 floor 0: 1.881, 1.927; at 3e-3 floor
#   3e-4 beta2 0.95: 1.884, 1.898 (1.884, 1.890); 1000 steps of that: 1.875, 1.876;
#   batch 8 for 1350 steps (lr 2e-3): 1.882 at seed 1337, 1.899;
#   3 layers (full feed-forward), 1100 steps: 1.867 at seed 2, a slower step than d_ff 2x.
PRESET_TRAINING: dict[str, dict] = {
    "toy": dict(
        max_iters=600, batch_size=32, lr=3e-3, min_lr=3e-4, warmup_iters=50, eval_interval=600
    ),
    "fast": dict(
        max_iters=1100, lr=3e-3, min_lr=3e-4, beta2=0.95, warmup_iters=100, eval_interval=1100
    ),
    # ``speedrun``: Muon (peak 0.02) for the blocks' matrices; AdamW (betas 0.8, 0.95, no
    # decay) for the embedding (0.05), the head (0.005) and the norm gains (0.01); 5 steps of
    # warmup, constant, then a straight line to 0 over the last 40%; evaluated once, at the end,
    # on nanoGPT's 20 batches of 12 windows. The search behind each number: docs/speedrun.md.
    "speedrun": dict(
        max_iters=300,
        batch_size=12,
        optimizer="muon",
        muon_lr=0.02,
        lr=0.01,
        embed_lr=0.05,
        head_lr=0.005,
        beta1=0.8,
        beta2=0.95,
        weight_decay=0.0,
        schedule="wsd",
        warmup_iters=5,
        cooldown_iters=120,
        min_lr=0.0,
        eval_interval=300,
        eval_batch_size=12,
    ),  # fmt: skip
}


# How an --arch trains when its preset has no recipe of its own (a preset's recipe, such as
# fast's, is for the preset's shape and wins). ``llama`` at baby's sizes (nanoGPT's CPU config:
# 2000 steps, batch 12, block 64, warmup 100, cosine to a tenth of the peak, weight decay 0.1)
# with Llama's own AdamW beta2, 0.95. Searched on tiny Shakespeare, seed 1337, val on 20 batches
# at step 2000 (500, 1000, 1500 in brackets):
#   lr 1e-3, beta2 0.95:  1.694  (1.990, 1.848, 1.737)   <- the recipe
#   lr 1e-3, beta2 0.99:  1.715  (1.998, 1.845, 1.756)   (TrainConfig's defaults)
#   lr 2e-3, beta2 0.95:  1.705  (1.994, 1.836, 1.745)
#   lr 3e-3, beta2 0.95:  1.717  (2.028, 1.863, 1.765)
# The peak is flat from 1e-3 to 3e-3; beta2 0.95 gains ~0.02 at the end. nanoGPT's CPU run (the
# GPT-2 shape) reaches 1.886 in the same 2000 steps (benchmarks/llama_vs_nanogpt.py).
ARCH_TRAINING: dict[str, dict] = {
    "llama": dict(lr=1e-3, min_lr=1e-4, beta2=0.95),
}


def next_token_loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    """Mean cross-entropy of model(x) (B, T, V) against y (B, T); y = -1 is ignored."""
    x, y = batch
    logits = model(x)  # (B, T, V)
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1), ignore_index=-1
    )


def bits_per_char(loss_nats_per_token: float, chars_per_token: float) -> float:
    """Nats per token -> bits per character: loss / ln 2 / (characters per token)."""
    return loss_nats_per_token / math.log(2) / chars_per_token


def score_tokens(model: nn.Module, tokens, chars_per_token: float, batch_size: int = 32,
                 max_tokens: int | None = None, bos: int | None = None) -> dict:  # fmt: skip
    """Loss (nats/token), perplexity and bits per character of ``model`` over non-overlapping
    windows of block_size spread evenly over ``tokens`` (an array, or token shards: then only
    the windows scored are read, a batch at a time); at most ``max_tokens`` are scored. ``bos``:
    each window is read after it (a run trained with ``--bos``)."""
    block = model.config.block_size
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in data.sequential_batches(tokens, block, batch_size, max_tokens, bos):
            logits = model(x.to(device))  # (B, T, V)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(),
                                   y.to(device).reshape(-1), reduction="sum")  # fmt: skip
            total += float(loss)
            count += y.numel()
            count_done(count, None, "tokens scored")  # a Heartbeat around this shows it
    loss = total / count
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 700.0)),
        "bits_per_char": bits_per_char(loss, chars_per_token),
        "tokens": count,
        "corpus_tokens": len(tokens),
        "chars_per_token": chars_per_token,
    }


@dataclasses.dataclass
class LMOptions(BaseConfig):
    data: str = ""
    encoding: str = "utf-8"
    tokenizer: str = "char"  # char, word or bpe
    vocab_size: int = 512  # bpe
    min_freq: int = 1  # word: rarer words become <unk>
    val_fraction: float = 0.1
    preset: str = "baby"  # sizes: baby, fast, small, gpt2 (attnlab.models.gpt.PRESETS)
    n_layer: int | None = None  # None: the preset's
    n_head: int | None = None
    d_model: int | None = None
    block_size: int | None = None
    dropout: float | None = None  # None: 0
    pos: str | None = None  # learned (GPT-2), sinusoidal, rotary
    norm: str | None = None  # pre (GPT-2), post, or rms (pre-norm RMSNorm)
    arch: str | None = None  # gpt (default) or llama (attnlab.models.gpt.ARCHS)
    ffn: str | None = None  # mlp, swiglu or geglu
    kv_heads: int | None = None  # K/V heads shared by groups of query heads (GQA)
    qk_norm: bool | None = None  # an RMSNorm on each head's queries and keys
    attention: str | None = None  # softmax (default), softmax1 or sigmoid (attnlab.attention)
    activation: str | None = None  # the feed-forward's: gelu (GPT-2), relu2 (ReLU squared), ...
    tie_weights: bool | None = None  # the head is the token embedding (GPT-2); False: its own
    zero_init: bool | None = None  # output projections and an untied head start at zero
    softcap: float | None = None  # logits -> cap tanh(logits / cap); 0: none
    bias: bool | None = None  # biases in the linear layers and LayerNorms
    token_cache: str | None = None  # stream the tokens through shards cached here
    bos: bool | None = None  # every window starts with a <bos> token (char and bpe tokenizers)

    def to_dict(self) -> dict:
        """Every option, less the modern-decoder ones not given: a run's config.json is what
        it was before they existed."""
        d = super().to_dict()
        return {k: v for k, v in d.items() if not (k in DECODER_OPTIONS and v is None)}

    def validate(self) -> None:
        self._one_of("tokenizer", ("char", "word", "bpe"))
        self._positive("vocab_size", "min_freq")
        if self.bos and self.tokenizer == "word":
            raise ConfigError("--bos adds a <bos> token to the char and bpe tokenizers, not to "
                              "word; use --tokenizer char or bpe, or drop --bos")  # fmt: skip
        if not 0 <= self.val_fraction < 1:
            raise ConfigError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        self.model_config(vocab_size=1)  # sizes, d_model % n_head, ...

    def model_config(self, vocab_size: int) -> GPTConfig:
        """The preset, then every size given."""
        if self.preset not in PRESETS:
            raise ConfigError(f"unknown preset {self.preset!r}; choose from {', '.join(PRESETS)}")
        fields = {"dropout": 0.0, **PRESETS[self.preset]}
        fields.update({k: getattr(self, k) for k in MODEL_OPTIONS if getattr(self, k) is not None})
        if self.arch is not None:  # the architecture's pieces, over the preset's
            self._one_of("arch", ARCHS)
            fields.update(arch_fields(self.arch, fields["d_model"], fields["n_head"]))
            if self.pos not in (None, "rotary") and fields.get("rotary") == "half":
                fields.update(pos=self.pos, rotary="pairs")  # --pos learned beside --arch llama
        if self.norm is not None:
            self._one_of("norm", ("pre", "post", "rms"))
            fields["norm_first"] = self.norm != "post"
            fields["norm"] = "rms" if self.norm == "rms" else "layer"
        if self.ffn is not None:
            self._one_of("ffn", FFN_KINDS)
            fields["ffn"], act = FFN_KINDS[self.ffn]
            fields["activation"] = act or fields.get("activation", "gelu")
        if self.kv_heads is not None:
            fields["n_kv_heads"] = self.kv_heads
        if self.activation is not None:
            self._one_of("activation", ACTIVATIONS)
            fields["activation"] = self.activation
        for name in ("qk_norm", "tie_weights", "zero_init", "bias"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        if self.softcap is not None:
            if self.softcap < 0:
                raise ConfigError(f"softcap must be >= 0 (0: none), got {self.softcap}")
            fields["final_softcap"] = self.softcap or None
        if self.attention is not None:
            fields["attention"] = self.attention
        try:
            return GPTConfig(vocab_size=vocab_size, **fields)
        except ConfigError as e:
            raise ConfigError(str(e).replace("n_kv_heads", "kv_heads")) from None


@register
class LanguageModel(Task):
    name = "lm"
    eval_reads = Task.eval_reads | {"encoding", "batch_size", "max_tokens"}
    order = 10
    label = "--task lm"
    Options = LMOptions
    unit = "tokens"
    loss_unit = "nats / token"
    metrics = (Metric("val_ppl", "perplexity"), Metric("val_bpc", "bits/char", "bits/char"))
    best = "val_loss"
    data_files = (data.TOKENS_DIR, f".{data.TOKENS_DIR}.lock")  # a small corpus's shards

    def __init__(self, options: LMOptions, seed: int = 1337):
        super().__init__(options, seed)
        self.train_tokens = self.val_tokens = None
        self.info: data.TokenFileInfo | None = None
        self.sampler = "random"  # how training windows are drawn (see data.lm_batches)
        self.record: dict = {}  # where the tokens are, for config.json (see data.reopen_lm_tokens)

    @classmethod
    def defaults_for(cls, given: dict) -> dict:
        """A preset's training recipe (PRESET_TRAINING), where it has one, else the
        architecture's (ARCH_TRAINING: ``--arch llama``'s). With another ``max_iters`` given, a
        shorter run keeps the recipe's share of warmup and evaluation interval (a 40-step
        ``fast`` run warms up for 4 steps, not 100, and evaluates at its end); a longer one
        keeps the recipe's numbers, except what is a share of the run whatever its length: the
        cool-down (``cooldown_iters``) and an evaluation only at the end. With another ``lr`` given, the recipe's floor (``min_lr``)
        keeps its share of the peak."""
        given = given if isinstance(given, dict) else {}
        preset, arch = given.get("preset"), given.get("arch")
        recipe = dict(PRESET_TRAINING.get(preset) or ARCH_TRAINING.get(arch) or {})
        steps = given.get("max_iters")
        total = recipe.get("max_iters", TrainConfig.max_iters)
        if recipe and isinstance(steps, int) and 0 < steps < total:
            for name, least in (("warmup_iters", 0), ("eval_interval", 1)):
                if name in recipe:
                    recipe[name] = max(least, recipe[name] * steps // total)
        if recipe and isinstance(steps, int) and steps > 0:  # shorter or longer
            if "cooldown_iters" in recipe:  # the cool-down is a share of the run
                recipe["cooldown_iters"] = recipe["cooldown_iters"] * steps // total
            if recipe.get("eval_interval") == total:  # evaluated once, at the end
                recipe["eval_interval"] = steps
        lr = given.get("lr")
        if "min_lr" in recipe and isinstance(lr, (int, float)) and lr > 0:
            recipe["min_lr"] = lr * recipe["min_lr"] / recipe["lr"]  # the floor's share of the peak
        return {**cls.train_defaults, **recipe}

    @classmethod
    def redirect(cls, given: dict) -> type[Task]:
        if given.get("arch") == "vit":
            raise ConfigError("--arch vit trains an image classifier: use --task classify")
        if given.get("arch") not in (None, *ARCHS):
            raise ConfigError(f"--arch {given['arch']} is an encoder-decoder: use --task seq2seq")
        return cls

    @classmethod
    def default_out(cls, options) -> Path:
        return Path("runs") / data.corpus_name(options.data)

    @classmethod
    def from_tokens(cls, train, val, tokenizer: Tokenizer | None = None,
                    chars_per_token: float = 1.0, seed: int = 1337, **options) -> LanguageModel:  # fmt: skip
        """A task over token arrays already in hand (notebooks, tests)."""
        task = cls(LMOptions(data="<tokens>", **options), seed)
        task.tokenizer = tokenizer
        task.train_tokens, task.val_tokens = np.asarray(train), np.asarray(val)
        n = len(task.train_tokens) + len(task.val_tokens)
        task.info = data.TokenFileInfo(n, round(n * chars_per_token), str(task.train_tokens.dtype))
        return task

    # -- data ----------------------------------------------------------------------------------

    def prepare(self, run_dir: Path | None) -> None:
        """The tokenizer and the token shards (``data.prepare_lm_tokens``); without a run
        directory, a corpus that does not stream is tokenized in memory instead (its last
        ``val_fraction`` held out: the same split as one shard's)."""
        o = self.options
        corpus = data.open_corpus(o.data, o.encoding)
        if run_dir is None and not data.streams(corpus, o.token_cache):
            if self.tokenizer is None:  # else --init-from's, the run's own
                self.log(f"building the {o.tokenizer} tokenizer on {corpus.name} ...")
                with beating(f"building the {o.tokenizer} tokenizer", self.log):
                    self.tokenizer = build_tokenizer(o.tokenizer, corpus.chunks(), o.vocab_size, o.min_freq, bos=bool(o.bos))  # fmt: skip
            text = corpus.read()
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            tokens = np.asarray(ids, dtype=data.token_dtype(self.tokenizer.vocab_size))
            self.info = data.TokenFileInfo(len(tokens), len(text), tokens.dtype.name, str(o.data))
            self._split(data.split_tokens, tokens)
            return
        if self.init is not None:
            self._check_characters(corpus)
        self._use(self._prepare_tokens(corpus, run_dir, self.tokenizer))  # set: --init-from's

    def _check_characters(self, corpus) -> None:
        """--init-from a run whose tokenizer has no <unk> (attnlab's char tokenizer): a
        character of the new text outside its vocabulary is a DataError naming it, said
        before anything else is (one pass over the text, counting its distinct characters)."""
        if getattr(self.tokenizer, "unk_id", 0) is not None:
            return
        seen: set[str] = set()
        for chunk in corpus.chunks():
            seen.update(chunk)
        try:
            self.tokenizer.encode("".join(sorted(seen)))
        except TokenizerError as e:
            raise data.DataError(f"{self.options.data}: {e} of {self.init.path}, whose "
                                 "tokenizer --init-from keeps") from None  # fmt: skip

    def reload(self, run_dir: Path, tokenizer, cfg: dict) -> None:
        """The run's tokens, from where its config.json says they are (``--resume``, ``eval``);
        a new run's other processes (``cfg`` empty) find the shards rank 0 made. A run from
        before token shards (``tokens.bin``) is read as it is."""
        self.tokenizer = tokenizer
        if not cfg:
            corpus = data.open_corpus(self.options.data, self.options.encoding)
            self._use(self._prepare_tokens(corpus, run_dir, tokenizer))
        else:
            self._use(data.reopen_lm_tokens(run_dir, cfg, tokenizer, self._corpus, self.log))

    def _prepare_tokens(self, corpus, run_dir, tokenizer) -> data.LMTokens:
        o = self.options
        return data.prepare_lm_tokens(corpus, o.tokenizer, run_dir, vocab_size=o.vocab_size,
                                      min_freq=o.min_freq, cache=o.token_cache,
                                      tokenizer=tokenizer, log=self.log, bos=bool(o.bos))  # fmt: skip

    def _corpus(self):
        """The run's text, needed on --resume only to encode damaged shards again; None if it
        cannot be read."""
        try:
            return data.open_corpus(self.options.data, self.options.encoding)
        except data.DataError:
            return None

    def _use(self, lm: data.LMTokens) -> None:
        self.tokenizer, self.sampler, self.record = lm.tokenizer, lm.sampler, lm.record
        self.info = data.TokenFileInfo(lm.n_tokens, lm.n_chars, lm.tokens.dtype.name,
                                       str(self.options.data), self.options.encoding)  # fmt: skip
        self._split(data.split_held_out, lm.tokens)

    def _split(self, split, tokens) -> None:
        try:
            self.train_tokens, self.val_tokens = split(
                tokens, self.options.val_fraction, self.block_size
            )
        except data.DataError as e:
            raise data.DataError(f"{self.options.data}: {e}") from None  # too short

    def model_config(self) -> GPTConfig:
        if self.init is not None:
            return self.init_model_config()
        return self.options.model_config(self.tokenizer.vocab_size)

    @classmethod
    def fine_tunes(cls, model_class: type) -> bool:
        """Any GPT: trained by attnlab, or a decoder imported from Hugging Face."""
        return issubclass(model_class, GPT)

    def build_model(self) -> GPT:
        return GPT(self.model_config())

    # -- training ------------------------------------------------------------------------------

    @property
    def block_size(self) -> int:
        return self.options.model_config(1).block_size

    def train_batches(self, batch_size, seed, rank=0, world_size=1):
        return data.lm_batches(self.train_tokens, self.sampler, self.block_size, batch_size,
                               seed=seed, rank=rank, world_size=world_size, bos=self.bos_id)  # fmt: skip

    def val_batches(self, batch_size, eval_iters):
        return data.fixed_batches(self.val_tokens, self.block_size, batch_size, eval_iters, 0,
                                  self.bos_id)  # fmt: skip

    def train_eval_batches(self, batch_size, eval_iters):
        return data.fixed_batches(self.train_tokens, self.block_size, batch_size, eval_iters, 1,
                                  self.bos_id)  # fmt: skip

    @property
    def bos_id(self) -> int | None:
        """The id every window starts with: the tokenizer's <bos> (``--bos``, or an imported
        tokenizer that puts one first, Llama's <s>), if it has one."""
        return getattr(self.tokenizer, "bos_id", None)

    def loss(self, model, batch):
        return next_token_loss(model, batch)

    def sample_inputs(self, n, max_len):
        """The first ``n`` windows of the held-out text (of the training text if none is held
        out), ``min(max_len, block_size)`` tokens each."""
        tokens = self.val_tokens if len(self.val_tokens) > 1 else self.train_tokens
        T = min(max_len, self.block_size, len(tokens))
        n = max(1, min(n, len(tokens) // T))
        rows = np.asarray(tokens[: n * T], dtype=np.int64).reshape(n, T)
        return torch.from_numpy(rows), True

    def count(self, batch) -> int:
        return int(batch[0].numel())

    def evaluate(self, model, val_loss):
        return {
            "val_ppl": math.exp(min(val_loss, 700.0)),
            "val_bpc": bits_per_char(val_loss, self.info.chars_per_token),
        }

    def example(self, model) -> str | None:
        """Sampled (temperature 0.8, a fixed seed) after the start of the held-out text."""
        from attnlab.generation import SamplingConfig, generate

        if self.tokenizer is None:
            return None
        head = self.val_tokens[np.arange(min(16, self.block_size // 2))]  # array or shards
        prompt = self.tokenizer.decode(head.tolist())
        cfg = SamplingConfig(max_new_tokens=min(48, self.block_size), temperature=0.8, seed=0)
        text = generate(model, self.tokenizer, prompt, cfg)[0].text
        return f"sample: {prompt[-24:]!r} -> {text!r}"

    # -- the run directory ---------------------------------------------------------------------

    @property
    def title(self) -> str:
        return f"language model: {self.options.data} ({self.options.tokenizer} tokens)"

    def run_config(self) -> dict:
        o, info = self.options, self.info
        return {
            **super().run_config(),
            "data": str(o.data),
            "encoding": o.encoding,
            "tokenizer": o.tokenizer if self.init is None else getattr(self.tokenizer, "kind", ""),
            "val_fraction": o.val_fraction,
            "chars_per_token": info.chars_per_token if info else None,
            "n_tokens": info.n_tokens if info else None,
            **self.record,  # where the token shards are and how batches are drawn
        }

    def describe(self, model) -> str:
        n = sum(p.numel() for p in model.parameters())
        return (
            f"{self.info.n_tokens:,} tokens ({len(self.train_tokens):,} train, "
            f"{len(self.val_tokens):,} val), vocab {self.tokenizer.vocab_size}, "
            f"{n / 1e6:.2f}M parameters"
        )

    def summary(self, result, final) -> str:
        if result.val_loss is None:
            return f"trained {result.step} steps: no validation split"
        bpc = bits_per_char(result.val_loss, self.info.chars_per_token)
        best = f"; best {result.best['value']:.4f}" if result.best else ""
        return (f"trained {result.step} steps: val loss {result.val_loss:.4f} ({bpc:.3f} "
                f"bits/char){on(result)}{best}")  # fmt: skip

    def predict(self, model, inputs, options=None, **given):
        """The ``top_k`` most probable next tokens after each text, with probabilities: the
        decoding protocol's first step (past block_size, the last block_size tokens)."""
        from attnlab.generation import decoder_for, next_token_logprobs

        top_k = predict_options(options, given).top_k
        dec, out = decoder_for(model), []
        for text in inputs:
            ids = torch.tensor([dec.encode(self.tokenizer, text)])  # (1, T)
            out.append(self._next(text, next_token_logprobs(model, ids)[0], top_k))
        return out

    def predict_recorded(self, model, rec, options):
        """The next tokens from the recorded logits at the last position: log_softmax of
        ``rec.last_logits`` (the others are not computed), as the decoding protocol's first
        step computes it."""
        last = rec.last_logits  # (1, V)
        if last is None or last.dim() != 2:
            return None
        logp = torch.log_softmax(last[0], dim=-1)  # (V,)
        return self._next(rec.text, logp, options.top_k)

    def _next(self, text: str, logp, top_k: int) -> dict:
        """{"input", "next": the ``top_k`` most probable tokens}, from log p (V,)."""
        probs = logp.exp()  # (V,)
        top = torch.topk(probs, min(top_k, probs.numel()))
        return {"input": text, "next": [
            {"token": self.tokenizer.decode([i]), "id": i, "p": p}
            for p, i in zip(top.values.tolist(), top.indices.tolist())]}  # fmt: skip

    def prediction_lines(self, pred):
        lines = [f"{pred['input']!r} -> next token:"]
        lines += [f"  {p['p']:.4f}  {p['token']!r}" for p in pred["next"]]
        return lines

    # -- eval ----------------------------------------------------------------------------------

    def score(self, model, options=None):
        """Loss (nats/token), perplexity and bits per character on ``options.data`` or on the
        run's held-out tokens (the last val_fraction of its token shards), over non-overlapping
        windows of block_size spread evenly over the text."""
        from attnlab.evaluation import Evaluation, Figure

        o = options or EvalOptions()
        if o.data is not None:
            corpus = data.open_corpus(o.data, o.encoding)
            parts, n_chars = [], 0
            dtype = data.token_dtype(self.tokenizer.vocab_size)
            for chunk in corpus.chunks():
                ids = self.tokenizer.encode(chunk, add_special_tokens=False)
                parts.append(np.asarray(ids, dtype=dtype))
                n_chars += len(chunk)
            tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
            cpt, where = n_chars / max(len(tokens), 1), str(o.data)
        else:
            split = self.check_split(o)
            tokens = self.val_tokens if split == "val" else self.train_tokens
            cpt = self.info.chars_per_token
            where = f"the {split} split of {self.options.data}"
        max_tokens = o.max_tokens
        if o.limit:  # N examples: N windows of the block, spread as --max-tokens spreads them
            cap = o.limit * model.config.block_size
            max_tokens = cap if max_tokens is None else min(max_tokens, cap)
        try:
            r = score_tokens(model, tokens, cpt, o.batch_size, max_tokens, self.bos_id)
        except data.DataError as e:
            raise data.DataError(f"{o.data or where}: {e}") from None  # shorter than one window
        count = r["tokens"]
        figures = [
            Figure("loss", "loss", r["loss"], "nats/token"),
            Figure("perplexity", "perplexity", r["perplexity"]),
            Figure("bits_per_char", "bits/char", r["bits_per_char"]),
            Figure("tokens", "tokens scored", count, "count"),
            Figure("chars_per_token", "chars/token", cpt),
        ]
        return Evaluation(self.name, f"{where}: {count:,} of {len(tokens):,} tokens", figures)
