"""`attnlab generate` (sampling, beam search, window policies) and `attnlab translate` (greedy,
beam, sampling) on runs written straight from random models: decoding needs no training."""

from __future__ import annotations

import pytest
import torch

from attnlab.cli import main
from attnlab.generation import beam_search
from attnlab.models.rnn import RNNConfig, RNNSeq2Seq
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.rundir import save_model
from attnlab.tokenizers import CharTokenizer, PairTokenizer
from lm_helpers import tiny_gpt

CHARS = "abcdefghij klmnopqr\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("decode")
    torch.manual_seed(0)
    for pos in ("rotary", "learned"):
        save_model(d / pos, tiny_gpt(len(CHARS), pos=pos, block_size=16), CharTokenizer(CHARS))
    pair = PairTokenizer(CharTokenizer("abcde"), CharTokenizer("abcde"))
    t = Seq2SeqTransformer(Seq2SeqConfig(8, 8, max_len=32, d_model=16, n_head=2, dropout=0.0))
    save_model(d / "transformer", t, pair, {"task": "seq2seq"})
    save_model(d / "lstm", RNNSeq2Seq(RNNConfig(8, 8, 8, 16, attention="dot")), pair)
    return d


def out_of(capsys, *args) -> str:
    assert main([*map(str, args)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("window", ["slide", "shift", "ring", "sinks"])
def test_generate_past_the_block_with_each_window(runs, capsys, window):
    args = ("generate", runs / "rotary", "--prompt", "ab", "--max-new-tokens", "40", "--seed", "1")
    text = out_of(capsys, *args, "--window", window)
    if window == "sinks":  # the first tokens it keeps: --sinks K, 4 by default
        assert out_of(capsys, *args, "--window", window, "--sinks", "4") == text
    assert text.startswith("ab") and len(text) == 2 + 40 + 1  # prompt, 40 characters, newline
    assert out_of(capsys, *args, "--window", window) == text  # the seed decides
    if window not in ("ring", "sinks"):  # exact policies: the cache changes nothing
        assert out_of(capsys, *args, "--window", window, "--no-cache") == text


def test_generate_beam_search_on_a_gpt(runs, capsys):
    text = out_of(capsys, "generate", runs / "learned", "--prompt", "ab", "--max-new-tokens",
                  "12", "--beam", "4", "--num-samples", "2")  # fmt: skip
    best, second = text.split("-" * 40 + "\n")
    from attnlab import load_run

    model, tok = load_run(runs / "learned")
    hyps = beam_search(model, torch.tensor([tok.encode("ab")]), 4, max_len=12)
    assert best == "ab" + tok.decode(hyps[0].tokens) + "\n"
    assert second == "ab" + tok.decode(hyps[1].tokens) + "\n" and best != second
    again = out_of(capsys, "generate", runs / "learned", "--prompt", "ab", "--max-new-tokens",
                   "12", "--beam", "4", "--num-samples", "2", "--no-cache")  # fmt: skip
    assert again == text


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_translate_greedy_beam_and_sampling(runs, capsys, arch):
    run = runs / arch
    greedy = out_of(capsys, "translate", run, "abc", "edcba", "--max-len", "9").splitlines()
    assert len(greedy) == 2
    beam = out_of(capsys, "translate", run, "abc", "edcba", "--max-len", "9", "--beam", "1")
    assert beam.splitlines() == greedy
    sampled = ("translate", run, "abc", "--temperature", "1.5", "--seed", "1", "--num-samples", "4")
    lines = out_of(capsys, *sampled).splitlines()
    assert len(lines) == 4 and len(set(lines)) > 1 and set("".join(lines)) <= set("abcde")
    assert out_of(capsys, *sampled).splitlines() == lines


@pytest.mark.parametrize(
    "args, needle",
    [
        (["generate", "{learned}", "--window", "ring"], "ring window needs rotary positions"),
        (["generate", "{rotary}", "--window", "ring", "--no-cache"], "needs the cache"),
        (["generate", "{learned}", "--window", "sinks"], "sinks window needs rotary positions"),
        (["generate", "{rotary}", "--window", "sinks", "--sinks", "999"], "keeps 1 to"),
        (["generate", "{rotary}", "--window", "ring", "--sinks", "2"], "add --window sinks"),
        (["generate", "{rotary}", "--beam", "2", "--temperature", "0.5"], "drop --temperature"),
        (["generate", "{rotary}", "--beam", "2", "--num-samples", "3"], "more than --beam 2"),
        (["generate", "{rotary}", "--beam", "0"], "--beam must be positive, got 0"),
        (["generate", "{transformer}", "--prompt", "abc"], "use attnlab translate"),
        (["translate", "{lstm}", "abc", "--beam", "2", "--seed", "1"], "drop --seed"),
        (["translate", "{lstm}", "abc", "--top-p", "2"], "--top-p must be in (0, 1]"),
    ],
)
def test_bad_decoding_options_are_one_line(runs, cli, args, needle):
    paths = {name: runs / name for name in ("learned", "rotary", "transformer", "lstm")}
    r = cli(*[a.format(**paths) for a in args])
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and r.stdout == "" and len(lines) == 1, r.stderr
    assert lines[0].startswith("attnlab: error:") and needle in lines[0]
