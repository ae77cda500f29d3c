"""Mean ablation has one definition: every head's mean comes from the clean (unablated) run,
of ``--reference`` or, without one, of the input itself. Ablating heads in several layers must
not take a later layer's mean from a run in which earlier heads are already ablated."""

from __future__ import annotations

import pytest
import torch

from attnlab import hooks
from attnlab.interventions import Subject, ablation, edited, head_importance, text_loss
from attnlab.interventions.edits import head_edits
from intervene_helpers import pair_tokenizer, perturb
from look_helpers import SENTENCE, char_tokenizer, tiny_gpt


def gpt3() -> Subject:
    """A random 3-layer GPT, sharpened so an upstream ablation visibly moves later means."""
    torch.manual_seed(0)
    tok = char_tokenizer()
    model = perturb(tiny_gpt(tok, n_layer=3, n_head=4, d_model=16).eval(), 0.3)
    for p in model.parameters():
        p.data.mul_(3)
    return Subject(model, tok)


def seq2seq() -> Subject:
    from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

    tok = pair_tokenizer()
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                        max_len=48, n_encoder_layers=2, n_decoder_layers=2, n_head=2, d_model=16,
                        dropout=0.0)  # fmt: skip
    model = perturb(Seq2SeqTransformer(cfg).eval(), 0.3)
    for p in model.parameters():
        p.data.mul_(3)
    return Subject(model, tok)


CASES = {  # subject, input, heads in several layers (and stacks)
    "gpt": (gpt3, SENTENCE, "0.1,1.2,2.3"),
    "seq2seq": (seq2seq, "12-03-2021", "encoder.0.1,encoder.1.0,decoder.0.1,cross.1.0,decoder.1.1"),
}


@pytest.mark.parametrize("case", CASES)
def test_mean_ablation_with_the_input_as_reference_equals_no_reference(case):
    make, text, heads = CASES[case]
    s = make()
    plain = ablation(s, text, heads=heads, mode="mean")
    same = ablation(s, text, heads=heads, mode="mean", reference_text=text)
    assert plain.ablated_loss == same.ablated_loss
    assert plain.position_delta == same.position_delta
    assert plain.log.changed == same.log.changed > 0
    assert plain.to_dict()["mean_from"] == "the clean run of the input"
    assert same.to_dict()["mean_from"] == "the clean run of the reference"


def clean_means_loss(s: Subject, text: str, heads: str) -> float:
    """The definition, written out: record every head output of the clean run, then replace
    each ablated head by its clean mean over positions, all at once."""
    refs = s.parse_heads(heads)
    names = sorted({r.group.path + ".z" for r in refs})
    p = s.prepare(text)
    with torch.no_grad(), hooks.record(s.model, names=names) as cache:
        s.logits(p)
    clean = {n: cache[n] for n in names}
    with torch.no_grad(), edited(s.model, head_edits(s, refs, "mean", None, clean)):
        return float(s.mean_loss(s.logits(p), p)[0])


@pytest.mark.parametrize("case", CASES)
def test_mean_ablation_takes_every_mean_from_the_clean_run(case):
    make, text, heads = CASES[case]
    s = make()
    want = clean_means_loss(s, text, heads)
    assert ablation(s, text, heads=heads, mode="mean").ablated_loss == pytest.approx(want, abs=1e-6)


def test_the_pruning_curve_ablates_with_the_clean_run_means():
    """Each point of ``heads --importance --mode mean``'s curve: the heads removed so far, in
    every layer, each replaced by its mean over the intact run of the same input."""
    s = gpt3()
    r = head_importance(s, text_loss(s, [SENTENCE]), mode="mean")
    assert r.to_dict()["mean_from"].startswith("the clean run")
    layers = set()
    for n, _, loss in r.pruning[1:]:
        removed = [h for h, *_ in sorted(r.heads, key=lambda h: h[4])[:n]]
        layers |= {h.split(".")[0] for h in removed}
        assert loss == pytest.approx(clean_means_loss(s, SENTENCE, ",".join(removed)), abs=1e-5)
    assert len(layers) == 3  # the curve reaches heads in every layer
