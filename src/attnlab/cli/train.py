"""`attnlab train`: one verb for every task. It parses the options and calls
``attnlab.training.run``: ``plan`` checks them, ``train`` trains. An option not typed is None
here and takes the task's default (listed at the end of ``attnlab train --help``)."""

from __future__ import annotations

import argparse
import sys


def run(args: argparse.Namespace) -> int:
    from attnlab.training import run as training
    from attnlab.training.loop import TrainingError

    given = {k: v for k, v in vars(args).items() if k not in ("func", "verb", "_argv")}
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
    print(outcome.summary)
    print(f"run: {p.out}  (model.safetensors, metrics.jsonl, loss.png; best/ holds the best model)")
    return 0


def _defaults_epilog() -> str:
    """Each task's defaults, read from the tasks themselves (one definition each)."""
    from attnlab.tasks import TASKS, task_class

    lines = ["defaults by task (an option not given takes its task's default):"]
    shown = ("max_iters", "batch_size", "lr", "weight_decay", "warmup_iters", "eval_interval",
             "tokenizer", "preset", "n_layer", "n_head", "d_model", "patch_size")  # fmt: skip
    for name in TASKS:
        d = task_class(name).option_defaults()
        parts = [f"{k}={d[k]}" for k in shown if k in d and d[k] is not None]
        lines.append(f"  {name:9s} " + ", ".join(parts))
    lines.append("  seq2seq   --arch lstm-attention or lstm: max_iters=3000")
    lines.append(
        "  unset warmup_iters = min(100, max_iters // 10); eval_interval = "
        "min(250, max(1, max_iters // 8))"
    )
    return "\n".join(lines)


def register(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a model on a text, a task or a TSV file",
        description="Train a model. --task lm (the default) trains a GPT on next-token "
        "prediction; mlm and classify train a BERT-style encoder; classify on images (--data "
        "digits or DIR/<label>/*.png, or --arch vit) trains a vision transformer; seq2seq "
        "trains an encoder-decoder (--arch transformer, lstm-attention or lstm).",
        epilog=_defaults_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=run)

    def a(*names, **kw):
        p.add_argument(*names, **kw, default=None)  # None: not given, the task's default

    from attnlab.tasks import TASKS

    a("--task", choices=list(TASKS), help="what to train (default lm; classify on images trains a ViT)")  # fmt: skip
    a("--data",
      help="a text file, a directory of .txt files, a built-in corpus (shakespeare), a "
      "label<TAB>text or source<TAB>target file, a generated task (dates, copy, reverse, sort, "
      "addition), repeating random tokens (--task induction: repeat, "
      "repeat:vocab=64,min_period=8,max_period=40) or images (digits, DIR/<label>/*.png)")  # fmt: skip
    a("--out", help="run directory to write (default runs/<data name>)")
    a("--encoding", help="text encoding of the data files (utf-8)")
    a("--token-cache", metavar="DIR",
      help="--task lm: stream the corpus through token shards cached in DIR, which the next run "
      "on the same files reuses (default: a corpus of 32 MiB or more streams, into "
      "$ATTNLAB_CACHE or ~/.cache/attnlab)")  # fmt: skip
    a("--tokenizer", choices=["char", "word", "bpe", "wordpiece"],
      help="tokenizer to build (char; wordpiece: encoder tasks only)")  # fmt: skip
    a("--vocab-size", type=int, help="BPE / WordPiece vocabulary size (512)")
    a("--min-freq", type=int, help="word tokenizer: rarer words become <unk> (1)")
    a("--preset", help="GPT or encoder size preset: baby, fast (rotary, trained hot and short), "
      "small, gpt2 / bert-base")  # fmt: skip
    a("--n-layer", type=int, help="layers (default: the preset's or the architecture's)")
    a("--n-head", type=int, help="attention heads")
    a("--d-model", type=int, help="model width (an LSTM's hidden units)")
    a("--block-size", type=int, help="longest sequence, in tokens")
    a("--dropout", type=float, help="dropout probability")
    a("--pos", choices=["learned", "sinusoidal", "rotary"], help="position scheme")
    a("--norm", choices=["pre", "post"], help="pre-norm (GPT-2, ViT) or post-norm (the paper, BERT)")  # fmt: skip
    # optimisation: TrainConfig (attnlab.training.config)
    a("--max-iters", type=int, help="optimizer steps")
    a("--batch-size", type=int, help="examples per step (per process)")
    a("--grad-accum", type=int, help="micro-batches per step (1)")
    a("--lr", type=float, help="peak learning rate")
    a("--min-lr", type=float, help="cosine schedule: the floor (1e-4)")
    a("--schedule", choices=["cosine", "noam", "constant"], help="learning-rate schedule (cosine)")  # fmt: skip
    a("--warmup-iters", type=int, help="linear warmup steps (min(100, max_iters // 10))")
    a("--lr-decay-iters", type=int, help="cosine: the step it reaches --min-lr (--max-iters)")
    a("--weight-decay", type=float, help="AdamW weight decay on matrices")
    a("--beta2", type=float, help="AdamW beta2 (0.99)")
    a("--grad-clip", type=float, help="gradient norm clipping, 0 = none (1.0)")
    a("--eval-interval", type=int, help="steps between evaluations (min(250, max(1, max_iters // 8)))")  # fmt: skip
    a("--eval-iters", type=int, help="validation batches sampled where a task samples (20)")
    a("--log-interval", type=int, help="steps between log lines (10)")
    a("--checkpoint-seconds", type=float,
      help="also checkpoint when this many seconds have passed (30; 0: at evaluations only)")  # fmt: skip
    a("--val-fraction", type=float, help="held-out fraction of the data (0.1)")
    a("--seed", type=int, help="seed of the data split, the initial weights and the batches (1337)")  # fmt: skip
    a("--device", help="cpu, cuda, or auto (auto)")
    a("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="autocast dtype (auto)")
    a("--compile", action=argparse.BooleanOptionalAction,
      help="torch.compile the model (default: when the run is long enough to repay it)")  # fmt: skip
    a("--fsdp", action="store_true",
      help="under torchrun: shard parameters, gradients and optimizer state (FSDP)")  # fmt: skip
    a("--snapshot-every", type=int, metavar="N",
      help="every N steps, record each head's attention and scores into snapshots/ (read by "
      "attnlab timeline; 0: never; --task induction: max_iters // 40)")  # fmt: skip
    a("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    a("--quiet", action="store_true", help="no progress on stderr")
    a("--log", choices=["tensorboard"],
      help="also write the metrics as TensorBoard event files in the run directory (needs "
      "pip install 'attnlab[tensorboard]')")  # fmt: skip
    # encoder-decoder and vision
    a("--arch", choices=["transformer", "lstm-attention", "lstm", "vit"],
      help="seq2seq architecture (transformer), or vit for --task classify on images")  # fmt: skip
    a("--patch-size", type=int, help="--arch vit: side of a square patch in pixels (2)")
    a("--score", choices=["dot", "general", "additive"], help="LSTM attention score (dot)")
    a("--label-smoothing", type=float, help="seq2seq: label smoothing (0)")
    a("--src-tokenizer", choices=["char", "word", "bpe"], help="seq2seq TSV: source tokenizer")
    a("--tgt-tokenizer", choices=["char", "word", "bpe"], help="seq2seq TSV: target tokenizer")
