"""Tasks: one module per task family, each a ``Task`` (see ``attnlab.tasks.base``).

lm        a GPT learns the next token of a text               (tokens; loss, ppl, bits/char)
mlm       a BERT-style encoder fills in masked tokens          (tokens; masked accuracy)
classify  an encoder names the class of a label<TAB>text line  (examples; accuracy, P/R/F1)
seq2seq   an encoder-decoder (Transformer, LSTM +/- attention) (pairs; exact match,
          turns a source string into a target string            token accuracy, BLEU, chrF)
vision    a ViT names the class of an image                    (images; accuracy, P/R/F1)

After training, ``open_task(run)`` rebuilds a run's task: its ``predict`` answers for one input,
its ``score`` gives the figures ``attnlab eval`` prints.
"""

from attnlab.tasks.base import (
    TASKS,
    EvalOptions,
    PredictOptions,
    Task,
    open_task,
    register,
    registered,
    task_class,
    task_for_run,
)

__all__ = [
    "TASKS",
    "EvalOptions",
    "PredictOptions",
    "Task",
    "open_task",
    "register",
    "registered",
    "task_class",
    "task_for_run",
]
