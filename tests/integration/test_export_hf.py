"""export-hf round-trips: AutoTokenizer and AutoModel* from the exported directory give attnlab's
ids and logits (within 1e-5) on texts the model never saw, unicode included; an unknown
character gets the same documented treatment on both sides."""

from __future__ import annotations

import json
import os
import random
import re

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from attnlab.interop.hf import HF_WORD_PATTERN, export_hf, hf_tokenizer  # noqa: E402
from attnlab.models.encoder import Encoder, EncoderConfig  # noqa: E402
from attnlab.models.gpt import GPT, GPTConfig  # noqa: E402
from attnlab.run import load_run  # noqa: E402
from attnlab.rundir import save_model  # noqa: E402
from attnlab.tokenizers import (  # noqa: E402
    WORD_RE,
    CharTokenizer,
    TokenizerError,
    WordTokenizer,
    build_tokenizer,
)

CORPUS = ("Über café naïve — the river's bank, 日本語 and 🙂 emoji.\n\tTabs; digits 3.5e6 "
          "x_y ½ ² ٣ Ω ñ ß ﬁ \u00a0nbsp\u2003em ") * 3  # fmt: skip
UNSEEN = ["The bank of the river", "naïve café — 日本 🙂", "Ω ß ñ", "  spaces  \n\t"]


def random_text(alphabet: str, rng: random.Random, n: int = 24) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, n)))


def _gpt_run(d, tokenizer):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, n_layer=2, n_head=2, d_model=16,
                          block_size=64)).eval()  # fmt: skip
    save_model(d, model, tokenizer)
    return d


def _auto(out, cls):
    tok = transformers.AutoTokenizer.from_pretrained(out)
    model = cls.from_pretrained(out, attn_implementation="eager").eval()
    return tok, model


@pytest.mark.parametrize("kind", ["char", "word", "bpe"])
def test_exported_gpt_gives_attnlab_ids_and_logits(tmp_path, kind):
    tokenizer = build_tokenizer(kind, CORPUS, vocab_size=300)
    run = _gpt_run(tmp_path / "run", tokenizer)
    out = export_hf(run, tmp_path / "hf")
    files = {p.name for p in out.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= files
    tok, hf = _auto(out, transformers.AutoModelForCausalLM)
    assert len(tok) == tokenizer.vocab_size  # not an empty vocabulary
    model, _ = load_run(run)
    rng = random.Random(0)
    alphabet = "".join(sorted(set(CORPUS)))
    texts = [t for t in UNSEEN if kind != "char" or set(t) <= set(alphabet)]
    texts += [random_text(alphabet, rng) for _ in range(30)]
    for text in texts:
        ids = tokenizer.encode(text)
        assert tok(text)["input_ids"] == ids, text
        if not ids:
            continue
        x = torch.tensor([ids[:64]])
        with torch.no_grad():
            diff = (hf(input_ids=x).logits - model(x)).abs().max()
        assert float(diff) <= 1e-5


@pytest.mark.parametrize("head", ["mlm", "classify", "none"])
def test_exported_encoder_loads_as_bert_with_its_tokenizer(tmp_path, head):
    tokenizer = build_tokenizer("wordpiece", CORPUS.splitlines(), vocab_size=200, encoder=True)
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=tokenizer.vocab_size, n_layer=2, n_head=2, d_model=16,
                        block_size=64, mlm_head=head == "mlm", pooler=head != "mlm",
                        num_labels=3 if head == "classify" else 0)  # fmt: skip
    model = Encoder(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # LayerNorms and biases away from 1 and 0 too
            p.add_(0.02 * torch.randn_like(p))
    save_model(tmp_path / "run", model, tokenizer, extra={"labels": ["a", "b", "c"]})
    out = export_hf(tmp_path / "run", tmp_path / "hf")
    cls = {"mlm": transformers.AutoModelForMaskedLM, "none": transformers.AutoModel,
           "classify": transformers.AutoModelForSequenceClassification}[head]  # fmt: skip
    tok, hf = _auto(out, cls)
    arch = json.loads((out / "config.json").read_text())["architectures"][0]
    assert arch == type(hf).__name__
    if head == "classify":
        assert hf.config.id2label == {0: "a", 1: "b", 2: "c"}
    assert tok.mask_token == "[MASK]" and tok.cls_token == "[CLS]"
    for text in [*UNSEEN, "the [MASK] of the river"]:
        ids = tokenizer.encode(text)
        assert tok(text)["input_ids"] == ids
        x = torch.tensor([ids])
        with torch.no_grad():
            got = hf(input_ids=x)
            ours = model(x, head=None if head == "none" else head)
        theirs = got.last_hidden_state if head == "none" else got.logits
        assert float((theirs - ours).abs().max()) <= 1e-5


def test_what_bert_cannot_express_is_refused(tmp_path):
    tokenizer = build_tokenizer("char", CORPUS, encoder=True)
    model = Encoder(EncoderConfig(vocab_size=tokenizer.vocab_size, n_layer=1, n_head=2,
                                  d_model=16, norm_first=True, mlm_head=True))  # fmt: skip
    save_model(tmp_path / "run", model, tokenizer)
    with pytest.raises(Exception, match="pre-norm"):
        export_hf(tmp_path / "run", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_the_word_split_is_attnlabs_on_random_unicode():
    """The exported pre-tokenizer and tokenizers.WORD_RE cut any text into the same words."""
    word = WordTokenizer([])  # every word unknown: only the split is compared
    tok = hf_tokenizer(word)
    rng = random.Random(1)
    pools = [range(0x20, 0x7F), range(0xA0, 0x250), range(0x370, 0x400), range(0x3040, 0x30FF),
             range(0x4E00, 0x4E40), range(0x1F600, 0x1F640), range(0x2000, 0x2070),
             range(0x300, 0x370), range(0x660, 0x66A), range(0x09, 0x0E), range(0x1C, 0x20)]  # fmt: skip
    for _ in range(300):
        text = "".join(chr(rng.choice(rng.choice(pools))) for _ in range(rng.randint(0, 30)))
        words = WORD_RE.findall(text)
        assert len(tok.encode(text).ids) == len(words), (text, words)
        assert [text[a:b] for a, b in tok.encode(text).offsets] == words
    assert re.compile(r"\w+|[^\w\s]").pattern == WORD_RE.pattern  # what HF_WORD_PATTERN mirrors
    assert HF_WORD_PATTERN


def test_an_unknown_character_is_treated_the_same_way_on_both_sides(tmp_path):
    """Documented: without <unk> (a GPT's char tokenizer) both refuse the text; with <unk> (a
    word tokenizer, or a char tokenizer built with one) both give <unk>'s id."""
    char = CharTokenizer.from_text("abc ")
    out = export_hf(_gpt_run(tmp_path / "c", char), tmp_path / "hc")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    with pytest.raises(TokenizerError, match="'z'"):
        char.encode("abz")
    with pytest.raises(Exception, match="WordLevel"):
        tok("abz")
    for t in (CharTokenizer.from_text("abc ", unk=True), WordTokenizer(["a", "b"])):
        d = tmp_path / type(t).__name__
        tok = transformers.AutoTokenizer.from_pretrained(export_hf(_gpt_run(d, t), d / "hf"))
        assert tok("a z b")["input_ids"] == t.encode("a z b") and 0 in t.encode("a z b")
        assert tok.unk_token == "<unk>"


def test_import_of_an_export_brings_back_attnlabs_tokenizer(tmp_path):
    from attnlab.interop.hf import import_hf

    char = CharTokenizer.from_text(CORPUS)
    export_hf(_gpt_run(tmp_path / "run", char), tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "back")
    _, back = load_run(tmp_path / "back")
    assert isinstance(back, CharTokenizer) and back.itos == char.itos
