"""`attnlab train`: one verb for every task. It parses the options and calls
``attnlab.training.run``: ``plan`` checks them, ``train`` trains. An option not typed is None
here and takes the task's default (``attnlab train --help`` shows each, read from the tasks)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnlab.cli import Verb, register


def run(args: argparse.Namespace) -> int:
    from attnlab.training import run as training
    from attnlab.training.loop import TrainingError

    given = {k: v for k, v in vars(args).items() if k not in ("func", "verb", "_argv", "json")}
    p = training.plan(given)
    # Everything before this line reads only; train() writes p.out, holding its writer lock.
    try:
        outcome = training.train(p)
    except TrainingError as e:
        print(f"attnlab: error: {e}", file=sys.stderr, flush=True)
        return 1
    if not outcome.main:
        return 0
    r = outcome.result
    if r.interrupted:
        task = outcome.task.name
        print(f"stopped at step {r.step}; checkpoint saved in {p.out}. Continue with: attnlab "
              f"train --task {task} --data {p.options.data} --out {p.out} --resume",
              file=sys.stderr)  # fmt: skip
        return 130 if r.interrupted == "SIGINT" else 143
    if args.json:
        from attnlab.run import about_run

        print(json.dumps({"about": about_run(p.out), **outcome.to_dict()}, ensure_ascii=False))
        return 0
    print(outcome.summary)
    from attnlab.rundir import CURVE_FILE

    curve = ", loss.png" if (Path(p.out) / CURVE_FILE).is_file() else ""
    print(f"run: {p.out}  (model.safetensors, metrics.jsonl{curve}; best/ holds the best model)")
    return 0


# Defaults that are chosen when the run starts, in words (the rules are TrainConfig's and the
# tasks'; the numbers below them are read from the tasks, never written here).
RULES = {
    "warmup_iters": "min(100, max_iters // 10)",
    "eval_interval": "min(250, ceil(max_iters / 8))",
    "lr_decay_iters": "max_iters",
    "compile": "when the run is long enough to repay it",
    "token_cache": "a corpus of 32 MiB or more streams, into $ATTNLAB_CACHE or ~/.cache/attnlab",
    "src_tokenizer": "--tokenizer",
    "tgt_tokenizer": "--tokenizer",
    "attend_eos": "--attend-eos",
}
SIZED = {"n_layer", "n_head", "d_model", "block_size", "dropout", "pos", "norm", "ffn", "kv_heads",
         "qk_norm", "activation", "tie_weights", "zero_init", "softcap", "bias"}  # fmt: skip
# Variants of a task whose defaults are listed after its own: (label, given options) by task.
VARIANTS = {
    "lm": [("lm --arch llama", {"arch": "llama"})],  # its own recipe
    "seq2seq": [("seq2seq --arch lstm*", {"arch": "lstm"})],
}


def _option_defaults() -> list[tuple[str, dict]]:
    """(label, defaults) of every task, in the registry's order, each followed by its variants."""
    from attnlab.tasks import registered

    return [(label, cls.option_defaults(given)) for name, cls in registered().items()
            for label, given in [(name, {}), *VARIANTS.get(name, [])]]  # fmt: skip


def default_text(name: str, per_task: list[tuple[str, dict]]) -> str | None:
    """An option's default as ``--help`` shows it: the first task's (lm's), then each task whose
    default differs (``2000; classify 500, vision 600``); None where no task has the option."""
    values = [(label, d[name]) for label, d in per_task if name in d]
    if not values:
        return RULES.get(name)

    def words(v) -> str:
        if v is None:
            return RULES.get(name) or ("the preset's" if name in SIZED else "none")
        return str(v)

    own = {label: v for label, v in values if " " not in label}  # each task's plain default
    base = values[0][1]
    others = [f"{label} {words(v)}" for label, v in values[1:]
              if v != own.get(label.split()[0], base) or (" " not in label and v != base)]  # fmt: skip
    text = words(base) if values[0][0] == "lm" else f"{values[0][0]}: {words(base)}"
    return text + ("; " + ", ".join(others) if others else "")


def presets() -> tuple[list[str], str]:
    """Every size preset a task accepts (the GPT's, then the encoder's), and whose each is."""
    from attnlab.models.encoder import ENCODER_PRESETS
    from attnlab.models.gpt import PRESETS

    whose = f"a GPT: {', '.join(PRESETS)}; an encoder: {', '.join(ENCODER_PRESETS)}"
    return list(dict.fromkeys([*PRESETS, *ENCODER_PRESETS])), whose


def add(sub) -> None:
    p = sub.add_parser(
        "train",
        help=VERB.help,
        description="Train a model. --task lm (the default) trains a GPT on next-token "
        "prediction; mlm and classify train a BERT-style encoder (classify --arch lstm-attention: "
        "a BiLSTM pooled by additive attention); classify on images (--data "
        "digits or DIR/<label>/*.png, or --arch vit) trains a vision transformer; seq2seq "
        "trains an encoder-decoder (--arch transformer, lstm-attention or lstm). An option "
        "not given takes its task's default, shown after each option: lm's, then each task "
        "whose default differs.",
    )
    p.set_defaults(func=run)
    per_task = _option_defaults()

    def a(*names, help: str, **kw):
        """An option whose absence (None) means its task's default, which the help shows."""
        dest = names[0].lstrip("-").replace("-", "_")
        shown = None if kw.get("action") == "store_true" else default_text(dest, per_task)
        if shown is not None:
            help += f" (default: {shown})"
        p.add_argument(*names, **kw, help=help.replace("%", "%%"), default=None)

    from attnlab.tasks import registered
    from attnlab.train_config import DTYPES, OPTIMIZERS, SCHEDULES

    a(
        "--task",
        choices=list(registered()),
        help="what to train (classify on images trains a ViT) (default: lm)",
    )
    a("--data",
      help="a text file, a directory of .txt files, a built-in corpus (shakespeare), a "
      "label<TAB>text or source<TAB>target file, a generated task (dates, copy, reverse, sort, "
      "addition), repeating random tokens (--task induction: repeat, "
      "repeat:vocab=64,min_period=8,max_period=40), modular addition (--task modular: add, "
      "add:p=113,frac=0.3, frac the share of the p^2 pairs trained on) or images (digits, "
      "DIR/<label>/*.png)")  # fmt: skip
    a("--out", help="run directory to write (default: runs/<data name>)")
    a("--encoding", help="text encoding of the data files")
    a("--token-cache", metavar="DIR",
      help="--task lm: stream the corpus through token shards cached in DIR, which the next run "
      "on the same files reuses")  # fmt: skip
    a("--tokenizer", choices=["char", "word", "bpe", "wordpiece"],
      help="tokenizer to build (wordpiece: encoder tasks only)")  # fmt: skip
    a("--vocab-size", type=int, help="BPE / WordPiece vocabulary size")
    a("--min-freq", type=int, help="word tokenizer: rarer words become <unk>")
    names, whose = presets()
    a("--preset", choices=names, help=f"size preset ({whose})")
    a("--n-layer", type=int, help="layers")
    a("--n-head", type=int, help="attention heads")
    a("--d-model", type=int, help="model width (an LSTM's hidden units)")
    a("--block-size", type=int, help="longest sequence, in tokens")
    a("--dropout", type=float, help="dropout probability")
    a("--pos", choices=["learned", "sinusoidal", "rotary"], help="position scheme")
    a("--norm", choices=["pre", "post", "rms"],
      help="pre-norm (GPT-2, ViT), post-norm (the paper, BERT), or --task lm: pre-norm RMSNorm")  # fmt: skip
    a("--ffn", choices=["mlp", "swiglu", "geglu"],
      help="--task lm: feed-forward network (swiglu: Llama's, geglu: Gemma's)")  # fmt: skip
    a("--kv-heads", type=int,
      help="--task lm: K/V heads, each shared by n_head / kv_heads query heads (GQA; 1: MQA)")  # fmt: skip
    a("--attention", choices=["softmax", "softmax1", "sigmoid"],
      help="--task lm: how a head's scores become weights: softmax; softmax1, softmax with an "
      "extra logit fixed at 0; sigmoid, each key on its own, unnormalised (rows of softmax1 and "
      "sigmoid need not sum to 1)")  # fmt: skip
    a("--bos", action="store_true",
      help="--task lm, char or bpe tokens: a <bos> token starts every window the model reads "
      "(and every text a verb gives it), so the first position is always the same token")  # fmt: skip
    a("--qk-norm", action=argparse.BooleanOptionalAction,
      help="--task lm: an RMSNorm on each head's queries and keys (Qwen3, Gemma 3, the "
      "speedrun)")  # fmt: skip
    from attnlab.blocks import ACTIVATIONS

    a("--activation", choices=list(ACTIVATIONS),
      help="--task lm: the feed-forward's activation (relu2: ReLU squared, the speedrun's)")  # fmt: skip
    a("--tie-weights", action=argparse.BooleanOptionalAction,
      help="--task lm: the output head is the token embedding (GPT-2); --no-tie-weights: a "
      "head of its own")  # fmt: skip
    a("--zero-init", action=argparse.BooleanOptionalAction,
      help="--task lm: each block's output projections and an untied head start at zero")  # fmt: skip
    a("--softcap", type=float,
      help="--task lm: logits -> cap tanh(logits / cap), at most cap in size (0: none)")  # fmt: skip
    a("--bias", action=argparse.BooleanOptionalAction,
      help="--task lm: biases in the linear layers and LayerNorms")  # fmt: skip
    # optimisation: TrainConfig (attnlab.train_config)
    a("--max-iters", type=int, help="optimizer steps")
    a("--batch-size", type=int, help="examples per step (per process)")
    a("--grad-accum", type=int, help="micro-batches per step")
    a("--lr", type=float, help="peak learning rate")
    a("--min-lr", type=float, help="cosine schedule: the floor")
    a("--schedule", choices=list(SCHEDULES),
      help="learning-rate schedule (wsd: warmup, constant, then a linear cool-down)")  # fmt: skip
    a("--warmup-iters", type=int, help="linear warmup steps")
    a("--lr-decay-iters", type=int, help="cosine, wsd: the step it reaches --min-lr")
    a("--cooldown-iters", type=int, help="wsd: the steps of the linear cool-down")
    a("--optimizer", choices=list(OPTIMIZERS),
      help="adamw, or muon: Muon for the blocks' matrices, AdamW for the embeddings, the head "
      "and the scalars (at --lr)")  # fmt: skip
    a("--muon-lr", type=float, help="--optimizer muon: Muon's peak learning rate")
    a("--muon-momentum", type=float, help="--optimizer muon: Muon's momentum")
    a("--embed-lr", type=float, help="--optimizer muon: AdamW's peak rate for the embeddings")
    a("--head-lr", type=float, help="--optimizer muon: AdamW's peak rate for the output head")
    a("--weight-decay", type=float, help="weight decay on matrices (AdamW's; Muon's)")
    a("--beta1", type=float, help="AdamW beta1")
    a("--beta2", type=float, help="AdamW beta2")
    a("--grad-clip", type=float, help="gradient norm clipping, 0 = none")
    a("--eval-interval", type=int, help="steps between evaluations")
    a("--eval-iters", type=int, help="validation batches sampled where a task samples")
    a("--eval-batch-size", type=int, help="rows of each of those batches (default: --batch-size)")
    a("--log-interval", type=int, help="steps between log lines")
    a("--checkpoint-seconds", type=float,
      help="also checkpoint when this many seconds have passed (0: at evaluations only)")  # fmt: skip
    a("--val-fraction", type=float, help="held-out fraction of the data")
    a("--seed", type=int, help="seed of the data split, the initial weights and the batches")
    a("--device", help="where the model trains: cpu, cuda, cuda:N, mps, xpu, or auto (a GPU "
      "when torch sees one, else the CPU)")  # fmt: skip
    a("--dtype", choices=list(DTYPES),
      help="autocast dtype (auto: bfloat16 on a GPU that has it, else float32)")  # fmt: skip
    a("--compile", action=argparse.BooleanOptionalAction, help="torch.compile the model")
    a("--fsdp", action="store_true",
      help="under torchrun: shard parameters, gradients and optimizer state (FSDP)")  # fmt: skip
    a("--snapshot-every", type=int, metavar="N",
      help="every N steps, record each head's attention and scores into snapshots/ (read by "
      "attnlab timeline; 0: never)")  # fmt: skip
    a("--init-from", metavar="RUN",
      help="fine-tune: start from the weights and tokenizer of RUN (trained, or imported with "
      "import-hf): a language model continues on --data, an encoder gets the head of --task "
      "(classify: a new classifier), an encoder-decoder continues on pairs, a ViT classifies "
      "new images; options that change the architecture are refused, --block-size may "
      "shrink")  # fmt: skip
    a("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    a("--force", action="store_true",
      help="train even when the run's estimated memory is past what the device has")  # fmt: skip
    a("--quiet", action="store_true", help="no progress on stderr")
    a("--log", choices=["tensorboard"],
      help="also write the metrics as TensorBoard event files in the run directory (needs "
      "pip install 'attnlab[tensorboard]')")  # fmt: skip
    a("--json", action="store_true", help="print the result as JSON")
    # encoder-decoder and vision
    a("--arch", choices=["gpt", "llama", "transformer", "lstm-attention", "lstm", "vit"],
      help="--task lm: gpt or llama (RMSNorm, SwiGLU, rotate-half rotary, K/V heads shared "
      "by pairs, no biases, untied head); seq2seq architecture; vit for --task classify "
      "on images; or lstm-attention for --task classify on text (a BiLSTM pooled by additive "
      "attention, Jain & Wallace 2019)")  # fmt: skip
    a("--patch-size", type=int, help="--arch vit: side of a square patch in pixels")
    a("--score", choices=["dot", "scaled-dot", "general", "additive", "uniform"],
      help="LSTM attention score (scaled-dot: h . s / sqrt(C); uniform: --task classify, every "
      "token weighs the same)")  # fmt: skip
    a("--attend-eos", action=argparse.BooleanOptionalAction,
      help="--arch lstm-attention: whether the attention may read the source's <eos> state "
      "(--no-attend-eos: the words only, as the notes' \"let's go\" picture)")  # fmt: skip
    a("--label-smoothing", type=float, help="seq2seq: label smoothing")
    a("--src-tokenizer", choices=["char", "word", "bpe"], help="seq2seq TSV: source tokenizer")
    a("--tgt-tokenizer", choices=["char", "word", "bpe"], help="seq2seq TSV: target tokenizer")


VERB = register(
    Verb("train", 10, add, own_threads=True, help="train a model on a text, a task or a TSV file")
)
