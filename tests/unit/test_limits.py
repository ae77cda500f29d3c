"""Every numeric option has a bound (attnlab.cli.limits), and a run's memory is estimated from its
options before anything is built (attnlab.training.memory.check_fits).

The parser tests walk every verb's parser, so an option added later without a bound fails here.
What the real command does with these values (exit 2, one line, nothing written, in under 5 s)
is tested in tests/integration/test_limits.py.
"""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from attnlab.cli import build_parser, verbs
from attnlab.cli.limits import BOUNDS, Bound, bound_for, numeric_options
from attnlab.config import ConfigError

PARSERS = verbs(build_parser())
OPTIONS = sorted((v, o, d) for v, o, d, _ in numeric_options(PARSERS))
HUGE_INT = str(10**30)
BAD = ("0", "-1", "1e30", HUGE_INT, "nan", "inf", "-inf")


def test_every_numeric_option_of_every_verb_has_a_bound_in_the_table():
    assert len(OPTIONS) > 60
    missing = [(v, o) for v, o, d in OPTIONS if bound_for(v, d) is None]
    assert missing == []
    for verb, option, dest, action in numeric_options(PARSERS):
        assert action.type.bound is bound_for(verb, dest), (verb, option)


def test_the_table_names_no_option_that_no_verb_has():
    dests = {d for _, _, d in OPTIONS} | {(v, d) for v, _, d in OPTIONS}
    assert set(BOUNDS) <= dests


def accepts(bound: Bound, text: str) -> bool:
    try:
        bound.convert(text)
    except argparse.ArgumentTypeError:
        return False
    return True


@pytest.mark.parametrize("verb, option, dest", OPTIONS)
def test_nan_infinity_and_a_huge_value_are_refused_by_every_numeric_option(verb, option, dest):
    bound = bound_for(verb, dest)
    for text in ("nan", "inf", "-inf", "1e30", HUGE_INT, "-" + HUGE_INT, "abc", ""):
        assert not accepts(bound, text), (verb, option, text)


@pytest.mark.parametrize("verb, option, dest", OPTIONS)
def test_a_refusal_is_one_line_naming_the_option_and_the_bound(verb, option, dest, capsys):
    parser = PARSERS[verb]
    for text in BAD:
        if accepts(bound_for(verb, dest), text):
            continue
        with pytest.raises(SystemExit) as e:
            parser.parse_args([f"{option}={text}"])  # = so that -1 is a value, not an option
        err = capsys.readouterr().err
        assert e.value.code == 2, (verb, option, text)
        assert err.count("\n") == 1 and err.startswith(f"attnlab: error: {option} must be "), err
        assert f"got {text}" in err or text in ("", "abc"), err


# Values an option accepts on purpose (documented meanings), and the refusals issue 24 names.
ACCEPTED = [
    ("train", "--seed", "0"),
    ("train", "--grad-clip", "0"),  # no clipping
    ("train", "--checkpoint-seconds", "0"),  # at evaluations only
    ("train", "--snapshot-every", "0"),  # never
    ("train", "--warmup-iters", "0"),
    ("train", "--dropout", "0"),
    ("train", "--max-iters", "1e3"),  # an integer written as a float
    ("generate", "--temperature", "0"),  # greedy
    ("generate", "--max-new-tokens", "0"),
    ("eval", "--limit", "0"),  # all
    ("attention", "--start", "0"),
    ("ablate", "--position", "-1"),  # the last
    ("patch", "--position", "-2"),
]


@pytest.mark.parametrize("verb, option, text", ACCEPTED)
def test_documented_zero_and_negative_values_are_still_accepted(verb, option, text):
    action = next(a for a in PARSERS[verb]._actions if option in a.option_strings)
    value = action.type(text)
    assert math.isfinite(value) and value == float(text)


@pytest.mark.parametrize(
    "verb, args, line",
    [
        ("train", ["--lr", "nan"], "--lr must be a finite number, got nan"),
        ("train", ["--max-iters", "1e30"], "--max-iters must be at most 1000000000"),
        ("train", ["--n-layer", "2.5"], "--n-layer must be an integer, got 2.5"),
        ("generate", ["--max-new-tokens", "-3"], "--max-new-tokens must be >= 0, got -3"),
        ("generate", ["--top-p", "0"], "--top-p must be in (0, 1], got 0"),
        ("train", ["--val-fraction", "1"], "--val-fraction must be in [0, 1), got 1"),
        ("train", ["--lr=-1e-3"], "--lr must be positive, got -1e-3"),
    ],
)
def test_the_refusals_issue_24_names(verb, args, line, capsys):
    with pytest.raises(SystemExit):
        PARSERS[verb].parse_args(args)
    err = capsys.readouterr().err
    assert err.startswith(f"attnlab: error: {line}") and err.count("\n") == 1, err


def test_threads_are_bounded_by_the_cores_before_torch_is_told(monkeypatch, capsys):
    """--threads past 4 per usable core is refused while parsing: torch.set_num_threads is never
    called with it (100000 threads exhausted the process table, then segfaulted)."""
    from attnlab import runtime
    from attnlab.cli import main

    told = []
    monkeypatch.setattr(torch, "set_num_threads", told.append)
    monkeypatch.setattr(runtime, "usable_cpus", lambda: {0, 1})
    with pytest.raises(SystemExit) as e:
        main(["predict", "no-such-run", "RO", "--threads", "100000"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        "attnlab: error: --threads must be at most 8 (4 per core this process may use), "
        "got 100000\n"
    )
    assert told == []
    with pytest.raises(ConfigError, match="--threads must be at most 8"):
        runtime.choose_threads(9, cpus={0, 1}, default=2, env={})
    assert runtime.choose_threads(8, cpus={0, 1}, default=2, env={}).threads == 8


# ---------------------------------------------------------------------------------------------
# memory, from the options
# ---------------------------------------------------------------------------------------------


def _real(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _configs():
    from attnlab.models.encoder import ENCODER_PRESETS, Encoder, EncoderConfig
    from attnlab.models.gpt import GPT, PRESETS, GPTConfig
    from attnlab.models.rnn import RNNConfig, RNNSeq2Seq
    from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
    from attnlab.models.vit import ViT, ViTConfig

    for name, p in PRESETS.items():
        if name != "gpt2":  # ~6 s to build even on meta
            yield name, GPT, GPTConfig(vocab_size=65, **p)
    for name, p in ENCODER_PRESETS.items():
        yield "encoder " + name, Encoder, EncoderConfig(vocab_size=512, **p)
    yield "encoder mlm", Encoder, EncoderConfig(vocab_size=512, mlm_head=True)
    yield "encoder classifier", Encoder, EncoderConfig(num_labels=3, pooler=True)
    yield "seq2seq", Seq2SeqTransformer, Seq2SeqConfig()
    shared = dict(share_embeddings=True, pos="learned", src_vocab_size=512, tgt_vocab_size=512)
    yield "seq2seq shared", Seq2SeqTransformer, Seq2SeqConfig(**shared)
    yield "lstm", RNNSeq2Seq, RNNConfig(n_layer=2)
    yield "lstm 3 layers", RNNSeq2Seq, RNNConfig(n_layer=3, attention="additive")
    yield "vit", ViT, ViTConfig()
    yield "vit rgb", ViT, ViTConfig(image_size=32, patch_size=4, channels=3)


@pytest.mark.parametrize(
    "name, cls, cfg", list(_configs()), ids=lambda x: x if isinstance(x, str) else ""
)
def test_the_parameter_estimate_is_within_10_percent_of_the_built_model(name, cls, cfg):
    from attnlab.training.memory import estimate_parameters

    with torch.device("meta"):
        real = _real(cls(cfg))
    assert 0.9 <= estimate_parameters(cfg) / real <= 1.1, (name, estimate_parameters(cfg), real)


GIB = 2**30


@pytest.mark.parametrize(
    "task, sizes",
    [
        ("lm", {"n_layer": 100_000}),
        ("lm", {"d_model": 65536}),
        ("lm", {"block_size": 100_000}),
        ("mlm", {"d_model": 65536}),
        ("seq2seq", {"d_model": 65536}),
        ("seq2seq", {"d_model": 65536, "arch": "lstm"}),
        ("vision", {"d_model": 65536}),
    ],
)
def test_a_run_past_the_memory_is_refused_from_its_options_naming_the_estimate(task, sizes):
    from attnlab.tasks import task_class
    from attnlab.train_config import TrainConfig
    from attnlab.training.memory import check_fits

    cls = task_class(task)
    options = cls.Options(data="x", **sizes)
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError) as e:
        check_fits(options, TrainConfig(**cls.defaults_for({})), cpu)
    line = str(e.value)
    assert "\n" not in line and "GiB" in line and "it may use" in line and "--force" in line
    assert check_fits(options, TrainConfig(), cpu, force=True) is None


def test_the_default_runs_fit():
    from attnlab.tasks import registered, task_class
    from attnlab.train_config import TrainConfig
    from attnlab.training.memory import check_fits

    for task in registered():
        cls = task_class(task)
        s = check_fits(
            cls.Options(data="x"), TrainConfig(**cls.defaults_for({})), torch.device("cpu")
        )
        assert s is not None and s.total_bytes < GIB, task


def test_plan_refuses_a_run_too_big_before_anything_is_read(tmp_path):
    from attnlab.training.run import plan

    given = {"data": str(tmp_path / "missing.txt"), "n_layer": 100_000, "out": str(tmp_path / "r")}
    with pytest.raises(ConfigError, match=r"this run needs about [\d,]+ GiB .*--force"):
        plan(given)
    p = plan({**given, "force": True})  # the user's call: planned, not refused
    assert p.options.n_layer == 100_000
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# inference memory, once the model is known
# ---------------------------------------------------------------------------------------------


def test_a_forward_pass_past_the_memory_is_refused_naming_the_option_and_what_fits():
    from attnlab.cli.limits import LimitError, check_forward_memory
    from attnlab.models.gpt import PRESETS, GPTConfig

    gpt2 = GPTConfig(vocab_size=50257, **{**PRESETS["gpt2"], "dropout": 0.0})
    cpu = torch.device("cpu")
    with pytest.raises(LimitError) as e:  # heads --sequences 1024 on a GPT-2: scores recorded
        check_forward_memory(gpt2, cpu, 1024, 1024, "--sequences", record=True)
    line = str(e.value)
    assert line.startswith("--sequences 1,024: 1,024 sequences of 1,024 tokens need about ")
    assert "GiB this machine may use" in line and "at most" in line
    most = int(line.rsplit("at most ", 1)[1].split()[0].replace(",", ""))
    check_forward_memory(gpt2, cpu, most, 1024, "--sequences", record=True)  # what it says fits
    with pytest.raises(LimitError):
        check_forward_memory(gpt2, cpu, most + 1, 1024, "--sequences", record=True)
    check_forward_memory(gpt2.to_dict(), cpu, 1, 1024, "--batch")  # config.json's dict too


def test_generation_past_the_memory_is_refused_before_a_token_and_says_what_fits():
    from attnlab.cli.limits import LimitError, check_decoding_memory
    from attnlab.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=1, d_model=8))
    with pytest.raises(LimitError) as e:
        check_decoding_memory(model, 1, 2, 10**12)
    line = str(e.value)
    assert line.startswith("generating 1,000,000,000,000 tokens for 1 sequence needs about")
    most = int(line.split("at most ")[1].split()[0].replace(",", ""))
    check_decoding_memory(model, 1, 2, most)
    with pytest.raises(LimitError):
        check_decoding_memory(model, 1, 2, most + 1)
    with pytest.raises(LimitError, match="fewer prompts or --num-samples fit"):
        check_decoding_memory(model, 10**12, 2, 1)


def test_a_weight_decay_that_would_flip_the_weights_is_refused():
    from attnlab.training.run import plan

    with pytest.raises(
        ConfigError, match=r"--weight-decay x --lr must be below 1 .* got 50.0 x 0.1"
    ):
        plan({"data": "x.txt", "lr": 0.1, "weight_decay": 50.0, "min_lr": 0.0})
    assert plan({"data": "x.txt", "lr": 0.1, "weight_decay": 5.0, "min_lr": 0.0}).config.lr == 0.1


def test_plan_refuses_threads_past_the_cores_as_the_cli_does(monkeypatch):
    from attnlab import runtime
    from attnlab.training.run import plan

    monkeypatch.setattr(runtime, "usable_cpus", lambda: {0, 1})
    with pytest.raises(ConfigError, match=r"--threads must be at most 8 \(4 per core"):
        plan({"data": "x.txt", "threads": 100000})
    assert plan({"data": "x.txt", "threads": 8}).threads == 8


@pytest.mark.parametrize("text", ["x", "1,1", "-1", str(2**32), ",".join(map(str, range(11)))])
def test_experiment_seeds_past_what_a_generator_takes_or_too_many_are_refused(text, capsys):
    """--seeds is a list, not a numeric option the walk finds: its bounds are checked here."""
    from attnlab.cli import main

    with pytest.raises(SystemExit) as e:
        main(["experiment", "grokking", "--out", "never", "--seeds", text])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--seeds" in err[0], err


def test_experiment_seeds_within_the_bounds_are_read():
    from attnlab.cli.experiment import SEEDS_MAX, seeds
    from attnlab.cli.limits import SEED_MAX

    assert seeds(f"0,{SEED_MAX}") == [0, SEED_MAX]
    assert len(seeds(",".join(map(str, range(SEEDS_MAX))))) == SEEDS_MAX
