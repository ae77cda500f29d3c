"""The interventions that need only one input, side by side: what the explorer shows as tabs.

For one text: the logit lens, attention rollout and flow, direct logit attribution and
integrated gradients of the model's own top prediction, and head importance on the text. A kind
of model that a tool cannot serve gets a tab that says why. (Patching needs a second input:
``attnlab patch``.)
"""

from __future__ import annotations

import html

import torch

from attnlab.interventions.dla import direct_logit_attribution
from attnlab.interventions.gradients import input_attribution
from attnlab.interventions.importance import head_importance, text_loss
from attnlab.interventions.lens import logit_lens
from attnlab.interventions.rollout import attention_paths
from attnlab.interventions.subjects import InterventionError, Subject


def explorer_tabs(subject: Subject, text: str) -> dict[str, str]:
    """Tab title -> a self-contained HTML fragment (tables and inline PNG figures)."""
    p = subject.prepare(text)
    with torch.no_grad():
        top = subject.decode(int(subject.logits(p)[0, p.position].argmax()))
    tools = {
        "logit lens": lambda: logit_lens(subject, text),
        "rollout": lambda: attention_paths(subject, text, "rollout"),
        "flow": lambda: attention_paths(subject, text, "flow"),
        f"DLA of {top!r}": lambda: direct_logit_attribution(subject, text, top),
        f"integrated gradients of {top!r}": lambda: input_attribution(subject, text, top),
        "head importance": lambda: head_importance(
            subject, text_loss(subject, [text]), source=repr(text), prune=False
        ),  # fmt: skip
    }
    tabs = {}
    for title, make in tools.items():
        try:
            tabs[title] = make()._repr_html_()
        except InterventionError as e:
            tabs[title] = f"<p><i>not available for this model: {html.escape(str(e))}</i></p>"
    return tabs
