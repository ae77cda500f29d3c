"""Interventions: test what attention does, not only show it.

Every tool runs on the hooks (``attnlab.hooks``) through checked edits (``edits.edited``): an
edit on a hook that does not exist, is read-only or never fires, a head or layer that does not
exist, or a shape that does not match raises ``InterventionError``; results say how many values
an edit changed. Each function returns a result that prints in the terminal, converts to JSON
(``to_dict``), draws a PNG (``save_png``) and renders in Jupyter (``_repr_html_``).

    from attnlab.interventions import Subject, ablate, patch, logit_lens, direct_logit_attribution
    s = Subject(model, tokenizer)
    patch(s, clean="The bank of the river", corrupt="The bank of the money", target="river")
    with ablate(model, heads=[(1, 2)], mode="zero"):
        ...                                  # any evaluation, with head 1.2 knocked out
    h = held_out(attnlab.load_run(run_dir))  # a trained run's model and its task's held-out data
    ablated_eval(h.model, h.figures, heads="1.2")   # its figures, intact and with 1.2 ablated
"""

from attnlab.interventions.ablation import AblationResult, ablation
from attnlab.interventions.dla import DLAResult, direct_logit_attribution
from attnlab.interventions.edits import EditLog, ablate, ablation_edit, edited
from attnlab.interventions.evaluation import (
    AblatedEval,
    HeldOut,
    ablated_eval,
    held_out,
    task_figures,
    task_loss,
)
from attnlab.interventions.gradients import GradResult, input_attribution
from attnlab.interventions.importance import (
    ImportanceResult,
    corpus_loss,
    head_importance,
    text_loss,
)
from attnlab.interventions.lens import LensResult, TunedLens, fit_tuned_lens, logit_lens
from attnlab.interventions.overview import explorer_tabs
from attnlab.interventions.patching import PatchResult, patch
from attnlab.interventions.rollout import RolloutResult, attention_paths, flow, rollout
from attnlab.interventions.subjects import InterventionError, Subject

__all__ = [
    "AblatedEval",
    "AblationResult",
    "DLAResult",
    "EditLog",
    "GradResult",
    "HeldOut",
    "ImportanceResult",
    "InterventionError",
    "LensResult",
    "PatchResult",
    "RolloutResult",
    "Subject",
    "TunedLens",
    "ablate",
    "ablated_eval",
    "ablation",
    "ablation_edit",
    "attention_paths",
    "corpus_loss",
    "direct_logit_attribution",
    "edited",
    "explorer_tabs",
    "fit_tuned_lens",
    "flow",
    "head_importance",
    "held_out",
    "input_attribution",
    "logit_lens",
    "patch",
    "rollout",
    "task_figures",
    "task_loss",
    "text_loss",
]
