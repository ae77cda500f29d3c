"""train --bos end to end: the run reads <bos> first in training, in eval and in every verb,
never predicts it, never prints it as text; and --bos is refused in one line where it means
nothing (a word tokenizer, another task, --init-from, which keeps its source's tokenizer)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnlab import load_run
from attnlab.tasks import open_task
from lm_helpers import TINY_TRAIN, write_text


@pytest.fixture(scope="module")
def bos_run(tmp_path_factory, forked_cli):
    d = tmp_path_factory.mktemp("bos")
    data = write_text(d)
    run = d / "run"
    r = forked_cli("train", "--data", data, "--out", run, "--bos", *TINY_TRAIN, "--pos", "rotary",
                   "--max-iters", "4", "--eval-interval", "4", "--eval-iters", "1")  # fmt: skip
    assert r.returncode == 0, r.stderr
    return d, run


def test_training_and_eval_windows_read_bos_first(bos_run):
    _, run = bos_run
    model, tok = load_run(run)
    assert tok.bos_id == model.config.vocab_size - 1
    assert json.loads((run / "tokenizer.json").read_text())["attnlab"]["bos"] is True
    task = open_task(run, with_data=True)
    for x, y in [next(task.train_batches(4, seed=0)), task.val_batches(4, 1)[0]]:
        assert (x[:, 0] == tok.bos_id).all() and not (y == tok.bos_id).any()
        assert (x[:, 1:] == y[:, :-1]).all()
    assert tok.bos_id not in set(task.train_tokens[np.arange(2000)].tolist())  # the text has none


def test_verbs_give_the_model_bos_first_and_print_no_bos(bos_run, forked_cli):
    d, run = bos_run
    r = forked_cli("generate", run, "--prompt", "All:", "--max-new-tokens", "12", "--seed", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("All:") and "<bos>" not in r.stdout
    sinks = forked_cli("generate", run, "--prompt", "All:", "--max-new-tokens", "12", "--seed",
                       "1", "--window", "sinks", "--sinks", "1")  # fmt: skip
    assert sinks.returncode == 0 and sinks.stdout == r.stdout  # the block is not reached
    trace = forked_cli("attention", run, "All:", "--json")
    assert trace.returncode == 0, trace.stderr
    assert json.loads(trace.stdout)["queries"][:2] == ["<bos>", "A"]
    ev = forked_cli("eval", run, "--json")
    assert ev.returncode == 0 and json.loads(ev.stdout)["tokens"] > 0


@pytest.mark.parametrize("extra, needle", [
    (["--tokenizer", "word"], "not to word"),
    (["--task", "classify"], "--bos"),
])  # fmt: skip
def test_bos_is_refused_in_one_line_where_it_means_nothing(tmp_path, forked_cli, extra, needle):
    data = write_text(tmp_path)
    r = forked_cli("train", "--data", data, "--out", tmp_path / "r", "--bos", *TINY_TRAIN,
                   "--max-iters", "1", *extra)  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert needle in r.stderr and not (tmp_path / "r").exists()


def test_init_from_keeps_its_tokenizer_so_bos_is_refused(bos_run, forked_cli, tmp_path):
    d, run = bos_run
    r = forked_cli("train", "--data", d / "corpus.txt", "--init-from", run, "--bos",
                   "--out", tmp_path / "tuned", "--max-iters", "1")  # fmt: skip
    assert r.returncode == 2 and "--bos" in r.stderr and len(r.stderr.splitlines()) == 1


def test_resume_keeps_bos_as_trained_and_refuses_adding_it(bos_run, forked_cli, tmp_path):
    import shutil

    d, run = bos_run
    plain = tmp_path / "plain"
    r = forked_cli("train", "--data", d / "corpus.txt", "--out", plain, *TINY_TRAIN,
                   "--max-iters", "1", "--eval-iters", "1")  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = forked_cli("train", "--data", d / "corpus.txt", "--out", plain, "--resume", "--bos",
                   "--max-iters", "2")  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert "--bos cannot change on --resume (the run was trained without it)" in r.stderr
    again = tmp_path / "again"
    shutil.copytree(run, again)
    r = forked_cli("train", "--data", d / "corpus.txt", "--out", again, "--resume", "--bos",
                   "--max-iters", "5", "--eval-iters", "1")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert load_run(again).tokenizer.bos_id == load_run(run).tokenizer.bos_id


def test_export_hf_keeps_bos_first_for_hugging_face_readers(bos_run, forked_cli, tmp_path):
    """The exported tokenizer.json puts <bos> first as attnlab does (its template), so a
    Hugging Face reader gives the model the ids it was trained on."""
    from tokenizers import Tokenizer

    d, _ = bos_run
    run = tmp_path / "gpt2-shaped"  # learned positions: what GPT-2 has
    r = forked_cli("train", "--data", d / "corpus.txt", "--out", run, "--bos", *TINY_TRAIN,
                   "--max-iters", "1", "--eval-iters", "1")  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = forked_cli("export-hf", run, tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    ours = load_run(run).tokenizer
    theirs = Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    for text in ("All:", "First Citizen", ""):
        assert theirs.encode(text).ids == ours.encode(text)
    special = json.loads((tmp_path / "hf" / "special_tokens_map.json").read_text())
    assert special["bos_token"] == "<bos>"


def test_the_tuned_lens_windows_read_bos_first(bos_run, tmp_path):
    """The windows the tuned lens is fitted on start with <bos>, then the text's own tokens in
    order; a text exactly a whole number of windows long is read to its end."""
    from attnlab.interventions.lens import training_batches

    d, run = bos_run
    r = load_run(run)
    block, bos = r.model.config.block_size, r.tokenizer.bos_id
    text = (d / "corpus.txt").read_text(encoding="utf-8")
    exact = tmp_path / "exact.txt"
    exact.write_text(text[: 4 * (block - 1)], encoding="utf-8")
    x = torch.cat(training_batches(r.subject, str(exact), 10_000))
    assert x.shape == (4, block) and (x[:, 0] == bos).all()
    body = r.tokenizer.encode(text[: 4 * (block - 1)], add_special_tokens=False)
    assert x[:, 1:].flatten().tolist() == body
