"""Tasks: one module per task family, each a ``Task`` (see ``attnlab.tasks.base``).

lm        a GPT learns the next token of a text               (tokens; loss, ppl, bits/char)
mlm       a BERT-style encoder fills in masked tokens          (tokens; masked accuracy)
classify  an encoder names the class of a label<TAB>text line  (examples; accuracy)
seq2seq   an encoder-decoder (Transformer, LSTM +/- attention) (pairs; exact match,
          turns a source string into a target string            token accuracy)
vision    a ViT names the class of an image                    (images; accuracy)
"""

from attnlab.tasks.base import TASKS, Task, open_task, task_class, task_for_run

__all__ = ["TASKS", "Task", "open_task", "task_class", "task_for_run"]
