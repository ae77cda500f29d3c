"""``attention-sinks``: Xiao et al. (2023), "Efficient Streaming Language Models with Attention
Sinks" (StreamingLLM), and Gu et al. (2025), "When Attention Sink Emerges in Language Models:
An Empirical View".

Their findings: many heads of a trained language model put a large share of their attention on
the first token whatever it is (an "attention sink"); a sliding window whose KV cache drops the
first tokens collapses (Llama-2-13B: perplexity 5158 with a 1024-token window), while keeping
the first 4 beside the window restores it (5.40); sinks come from softmax's sum to one, and a
language model trained with sigmoid attention without normalisation has none (Sink_1^0.3:
0.44% of its heads against 18.18% with softmax, Gu et al.'s Table 6).

Here, per seed, ``attnlab train --bos`` trains GPTs with rotary positions on the built-in
Shakespeare corpus, every window starting with a ``<bos>`` token (Gu et al.'s models read one),
with character and BPE tokens, each with softmax attention and with sigmoid attention
(``--attention sigmoid``); and a decoder imported from the Hugging Face format: a
Llama-architecture model built by transformers from a config (random weights, no pretrained
model being reachable offline; its tokenizer's template puts ``<bos>`` first), saved, imported
with ``import-hf`` and trained on the same corpus with ``--init-from``. On held-out text
(``attnlab.inspect.sinks``):
  - alpha_1 of every head, on sequences of 64 tokens, and Sink_1^0.3, the share of heads with
    alpha_1 > 0.3 (Gu et al.'s metric and threshold; rows that need not sum to one are taken
    as shares of their sum, Gu et al.'s proxy);
  - the perplexity of the tokens past the trained block, in sequences four blocks long, with
    full attention (the rotary table stretched), a sliding window whose cache keeps only the
    last block (``--window ring``), the window beside the first 4 tokens (``--window sinks``)
    and the window recomputed at every token (``--window slide``), StreamingLLM's comparison.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass

import numpy as np
import torch

from attnlab.experiments.recipe import Context, Experiment, register
from attnlab.experiments.report import Claim, Report, Table, value_range

CITATION = ("Xiao, Tian, Chen, Han & Lewis (2023), Efficient Streaming Language Models with "
            "Attention Sinks, ICLR 2024; Gu, Pang, Du, Liu, Zhang, Du, Wang & Lin (2025), When "
            "Attention Sink Emerges in Language Models: An Empirical View, ICLR 2025")  # fmt: skip
EPS = 0.3  # Gu et al.'s threshold on alpha_1
WINDOWS = {"full": "full attention", "ring": "window", "sinks:4": "window + 4 sinks",
           "slide": "window, recomputed"}  # fmt: skip
SINK_SEQUENCES = 64  # held-out sequences of 64 tokens the sink metric averages over
PPL_SEQUENCES = 8  # held-out sequences of 4 blocks the perplexity is measured on
BLOCKS = 4  # each perplexity sequence is this many blocks long


@dataclass(frozen=True)
class Model:
    name: str  # char-softmax, ...
    label: str
    attention: str  # softmax, sigmoid
    options: dict  # attnlab train's options (the seed is added); {} for the imported decoder


def models(ctx: Context) -> list[Model]:
    size = QUICK if ctx.quick else SIZE
    out = []
    for tok in ("char", "bpe"):
        for att in ("softmax", "sigmoid"):
            o = dict(task="lm", tokenizer=tok, pos="rotary", attention=att, bos=True,
                     eval_interval=size["max_iters"], compile=False, **size, **corpus(ctx))  # fmt: skip
            if ctx.quick:
                o["eval_iters"] = QUICK_EVAL_ITERS
            if tok == "bpe":
                o["vocab_size"] = 512
            out.append(Model(f"{tok}-{att}", f"GPT, {tok} tokens, {att} attention", att, o))
    out.append(Model("imported-llama", "Llama imported from the HF format, softmax", "softmax",
                     {}))  # fmt: skip
    return out


# Sinks need a first token that is the same in every window (--bos, as Gu et al. train) and
# heads with nothing to do on most tokens. Measured on the built-in Shakespeare, char tokens,
# softmax, one seed: 4 layers x 8 heads of width 64, 1000 steps at lr 3e-3 without <bos>: no
# sink head; with <bos>, 4 x 16 heads at lr 1e-2 and weight decay 0.5: 3% after 1000 steps, 20%
# after 3000; 2 layers x 16 heads, 2000 steps: 41% (layer 0's heads put 0.95 on <bos>), in a
# third of the time, so the experiment's 12 runs and 3 imports take under 15 minutes.
SIZE = dict(n_layer=2, n_head=16, d_model=64, block_size=64, max_iters=2000, lr=1e-2,
            weight_decay=0.5)  # fmt: skip
QUICK = dict(n_layer=2, n_head=4, d_model=32, block_size=16, max_iters=40, lr=5e-3)
QUICK_EVAL_ITERS = 2  # --quick: held-out batches of each model's one evaluation
QUICK_CHARS = 30_000  # --quick trains on the first this many characters of the corpus


def corpus(ctx: Context) -> dict:
    """Where every model reads its text: the built-in Shakespeare (--quick: its first
    QUICK_CHARS characters, written to OUT/corpus.txt), its tokens cached in OUT/tokens so that
    each tokenizer is built and each text tokenized once for every model and seed."""
    tokens = str((ctx.out / "tokens").resolve())
    if not ctx.quick:
        return {"data": "shakespeare", "token_cache": tokens}
    path = ctx.out / "corpus.txt"
    if not path.is_file():
        from attnlab import data
        from attnlab.files import atomic_write_text

        ctx.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, data.open_corpus("shakespeare").read()[:QUICK_CHARS])
    return {"data": str(path.resolve()), "token_cache": tokens}


def held_out(run, n: int, length: int) -> torch.Tensor:
    """``n`` held-out windows of ``length`` tokens, spread evenly over the run's held-out text,
    each starting with <bos> where the run was trained with one (as its training windows did):
    (n, length) token ids."""
    from attnlab import data
    from attnlab.tasks import open_task

    tokens = open_task(run.path, with_data=True, cfg=run.config, tokenizer=run.tokenizer).val_tokens
    total = len(tokens)
    if total < n * length:
        raise ValueError(f"{run.path}: {total} held-out tokens, fewer than {n} x {length}")
    starts = np.linspace(0, total - length - 1, n).astype(np.int64)
    return data.windows(tokens, starts, length, run.tokenizer.bos_id)[0]


def measure_run(run, quick: bool = False) -> dict:
    """The sink metric and the perplexity past the block under each window, for one run."""
    from attnlab.inspect.sinks import SINK_TOKENS, first_token_share, full_nll, window_nll

    model = run.model.eval()
    block = model.config.block_size
    n_sink, n_ppl, blocks = (16, 4, 3) if quick else (SINK_SEQUENCES, PPL_SEQUENCES, BLOCKS)
    x = held_out(run, n_sink, min(SINK_TOKENS, block))
    shares = first_token_share(model, x)  # (L, H)
    long = held_out(run, n_ppl, blocks * block)
    ppl = {}
    for w in WINDOWS:
        nll = full_nll(model, long) if w == "full" else window_nll(model, long, w)
        past = nll[:, block - 1 :]  # the tokens past the block: positions block + 1 .. N
        within = nll[:, : block - 1]
        ppl[w] = {"past": math.exp(float(past.mean())), "within": math.exp(float(within.mean()))}
    return {"shares": shares.tolist(), "sink_ratio": float((shares > EPS).double().mean()),
            "ppl": ppl, "block": block}  # fmt: skip


def imported_run(ctx: Context, seed: int):
    """The imported decoder of this seed: a Llama built by transformers from a config (random
    weights, the seed's), with a byte-level BPE tokenizer of 512 tokens learned on the corpus,
    saved in the Hugging Face format, imported with import-hf, then trained with --init-from.
    None (the report says why) when transformers is not installed."""
    try:
        import transformers
        from transformers.tokenization_utils_fast import TOKENIZER_FILE as HF_TOKENIZER
        from transformers.utils import CONFIG_NAME as HF_CONFIG

        from attnlab.rundir.layout import CONFIG_FILE
    except ImportError:
        return None
    from attnlab import data
    from attnlab.interop.hf import import_hf
    from attnlab.tokenizers import HFTokenizer, train_bpe, with_bos

    size = QUICK if ctx.quick else SIZE
    text = corpus(ctx)
    hf = ctx.out / "hf" / f"llama-seed{seed}"
    imported = ctx.out / "runs" / f"llama-imported-seed{seed}"
    shared = ctx.out / "hf" / HF_TOKENIZER  # one tokenizer for every seed: its tokens cached
    if not shared.is_file():
        shared.parent.mkdir(parents=True, exist_ok=True)
        bpe = with_bos(train_bpe(data.open_corpus(text["data"]).chunks(), vocab_size=512))
        bpe.tok.save(str(shared))  # <bos> $A: the imported run starts each window with <bos>
    if not (imported / CONFIG_FILE).is_file():
        if not (hf / HF_CONFIG).is_file():
            from tokenizers import Tokenizer

            tok = HFTokenizer(Tokenizer.from_file(str(shared)))
            d, h = size["d_model"], size["n_head"]
            cfg = transformers.LlamaConfig(
                vocab_size=tok.vocab_size, hidden_size=d, intermediate_size=-(-8 * d // 3 // 32) * 32,
                num_hidden_layers=size["n_layer"], num_attention_heads=h,
                num_key_value_heads=h // 2, max_position_embeddings=size["block_size"],
                rope_theta=10000.0, tie_word_embeddings=False, attn_implementation="eager",
            )  # fmt: skip
            torch.manual_seed(seed)
            transformers.logging.set_verbosity_error()
            transformers.logging.disable_progress_bar()  # its bars are not attnlab's to show
            transformers.LlamaForCausalLM(cfg).save_pretrained(hf)
            shutil.copyfile(shared, hf / HF_TOKENIZER)
        import_hf(hf, imported)
    quick = {"eval_iters": QUICK_EVAL_ITERS} if ctx.quick else {}
    return ctx.train(f"imported-llama-seed{seed}", dict(
        task="lm", init_from=str(imported), max_iters=size["max_iters"], compile=False,
        eval_interval=size["max_iters"], lr=size["lr"], seed=seed, **text, **quick,
        **{k: size[k] for k in ("weight_decay",) if k in size}))  # fmt: skip


def recipe(ctx: Context) -> Report:
    size = QUICK if ctx.quick else SIZE
    ms = models(ctx)
    results: dict[str, dict[int, dict]] = {m.name: {} for m in ms}
    runs, missing = [], None
    for seed in ctx.seeds:
        for m in ms:
            if m.options:
                run = ctx.train(f"{m.name}-seed{seed}", {**m.options, "seed": seed})
            else:
                run = imported_run(ctx, seed)
                if run is None:
                    missing = "transformers is not installed (pip install transformers)"
                    continue
            ctx.log(f"experiment: sinks and windows of {m.name}, seed {seed}")
            results[m.name][seed] = measure_run(run, ctx.quick)
            runs.append((f"{m.label}, seed {seed}", str(run.path.relative_to(ctx.out))))
    ms = [m for m in ms if results[m.name]]
    claims = []
    for m in ms:
        r = results[m.name]
        ratio = {s: v["sink_ratio"] for s, v in r.items()}
        if m.attention == "softmax":
            claims.append(Claim(
                f"{m.name}.sinks", f"the {m.name} model's Sink_1^0.3 (share of heads putting more "
                "than 30% of their attention on the first token)",
                "with softmax attention, sinks appear: Sink_1^0.3 = 18.18% of the heads of a 60M "
                "LLaMA-style LM, 45.11% at 1B (Gu et al. 2025, Table 6 and section 7.4)",
                ratio, ">=", SINK_MIN, "%"))  # fmt: skip
            claims.append(Claim(
                f"{m.name}.window", f"the {m.name} model's perplexity past the block, window "
                "over window + 4 sinks",
                "a window that drops the first tokens collapses and keeping 4 restores it: "
                "Llama-2-13B 5158.07 (0+1024) against 5.40 (4+1020) (Xiao et al. 2023, Table 1)",
                {s: v["ppl"]["ring"]["past"] / v["ppl"]["sinks:4"]["past"] for s, v in r.items()},
                ">", 1.0))  # fmt: skip
            claims.append(Claim(
                f"{m.name}.dense", f"the {m.name} model's perplexity past the block, full "
                "attention over the recomputed window",
                "dense attention fails once the text outgrows the pre-training window, where a "
                "window recomputed at every token holds (Xiao et al. 2023, Figure 3)",
                {s: v["ppl"]["full"]["past"] / v["ppl"]["slide"]["past"] for s, v in r.items()},
                ">", 1.0))  # fmt: skip
        else:
            claims.append(Claim(
                f"{m.name}.sinks", f"the {m.name} model's Sink_1^0.3 (rows taken as shares of "
                "their sum)",
                "without normalisation (sigmoid attention) sinks do not appear: Sink_1^0.3 = "
                "0.44% (Gu et al. 2025, Table 6)", ratio, "<=", SINK_MAX, "%"))  # fmt: skip
    tables = [_sink_table(ms, results), _ppl_table(ms, results, ctx.seeds)]
    notes = [
        f"Sink metric (Gu et al.): alpha_1 = (1/T) sum_i A[i, 1] over the queries i = 1..T of "
        f"{SINK_SEQUENCES} held-out sequences of T = 64 tokens (the block, where shorter), the "
        f"first query included; a head is a sink head when alpha_1 > {EPS}. Rows of sigmoid "
        "attention are divided by their sum first (Gu et al.'s proxy attention).",
        f"Perplexity past the block: {PPL_SEQUENCES} held-out sequences of {BLOCKS} blocks, the "
        "tokens after the first block, each predicted from all before it through the window "
        "(attnlab's decoder, one token at a time); full attention runs the same weights with a "
        "rotary table as long as the sequence. window = --window ring (the cache keeps the "
        "last block), window + 4 sinks = --window sinks (StreamingLLM: the first 4 kept, "
        "positions as in the cache), recomputed = --window slide (the last block, recomputed "
        "at every token: StreamingLLM's 'sliding window with re-computation').",
        "Every model reads a <bos> token first in every window (attnlab train --bos), as "
        "Gu et al.'s models do: the first position is the same token everywhere.",
        "The imported decoder is a Llama-architecture model (RMSNorm, SwiGLU, rotate-half "
        f"rotary, {size['n_head'] // 2} K/V heads for {size['n_head']} query heads) built by "
        "transformers from a config with random weights, saved in the Hugging Face format "
        "with a byte-level BPE tokenizer learned on the corpus (its template puts <bos> "
        "first), imported with attnlab import-hf and trained here with --init-from: no "
        "pretrained decoder is reachable offline, so its attention is learned on the same "
        "small corpus.",
    ]  # fmt: skip
    if missing:
        notes.append(f"The imported decoder was left out: {missing}.")
    if ctx.quick:
        notes.insert(0, f"--quick: tiny models (block {QUICK['block_size']}), "
                     f"{QUICK['max_iters']} steps on {QUICK_CHARS:,} characters, fewer held-out "
                     "sequences (16 for the metric, 4 of 3 blocks for perplexity): seconds; its "
                     "figures are not the experiment's")  # fmt: skip
    report = Report(
        "attention-sinks", "Attention sinks and streaming windows", CITATION,
        "Each model is trained with attnlab train (or imported, then trained), once per seed. "
        "On held-out text, the share of every head's attention on the first token gives "
        "Gu et al.'s sink metric; the perplexity past the trained block is measured with full "
        "attention and through the decoder's window policies.",
        claims=claims, tables=tables, runs=runs, notes=notes,
        data={m.name: {str(s): v for s, v in results[m.name].items()} for m in ms},
    )  # fmt: skip
    report.pictures += [
        ("alpha_1 (each head's share of attention on the first token) per layer and head, "
         f"seed {ctx.seeds[0]}; a head above {EPS} is a sink head", _shares(ms, results, ctx.seeds[0])),
        ("Perplexity of the tokens past the trained block under each window (range over "
         "seeds); log scale", _ppl(ms, results)),
    ]  # fmt: skip
    return report


SINK_MIN = 0.1  # "sinks appear": at least a tenth of the heads are sink heads
UNIFORM = sum(1 / i for i in range(1, 65)) / 64  # alpha_1 of uniform causal attention, T = 64
SINK_MAX = 0.05  # "sinks do not appear": at most one head in twenty


def _sink_table(ms, results) -> Table:
    rows = []
    for m in ms:
        r = results[m.name]
        rows.append([m.name, m.attention, value_range([v["sink_ratio"] for v in r.values()], "%", True),
                     value_range([float(np.mean(v["shares"])) for v in r.values()], "", True),
                     value_range([max(map(max, v["shares"])) for v in r.values()], "", True)])  # fmt: skip
    rows += [["paper: 60M LLaMA-style LM", "softmax", "18.18%", "", ""],
             ["paper: 60M LLaMA-style LM", "sigmoid, no normalisation", "0.44%", "", ""],
             ["paper: 1B", "softmax / sigmoid", "45.11% / 2.46%", "", ""]]  # fmt: skip
    return Table("Sink heads: Sink_1^0.3 (share of heads with alpha_1 > 0.3), range over seeds",
                 ["model", "attention", "Sink_1^0.3", "mean alpha_1", "largest alpha_1"], rows,
                 "paper rows: Gu et al. 2025, Table 6 and section 7.4; a head attending "
                 f"uniformly to what it sees has alpha_1 = {UNIFORM:.3f} at T = 64")  # fmt: skip


def _ppl_table(ms, results, seeds) -> Table:
    rows = []
    for m in ms:
        r = results[m.name]
        cells = [value_range([v["ppl"][w]["past"] for v in r.values()], "", True) for w in WINDOWS]
        within = value_range([v["ppl"]["full"]["within"] for v in r.values()], "", True)
        rows.append([m.name, within, *cells])
    rows.append(["paper: Llama-2-13B, PG19 book 1", "", "", "5158.07 (0+1024)", "5.40 (4+1020)",
                 ""])  # fmt: skip
    return Table("Perplexity past the trained block (tokens after the first block of "
                 f"{BLOCKS}), range over seeds",
                 ["model", "within the block", *WINDOWS.values()], rows,
                 "paper row: Xiao et al. 2023, Table 1 (their dense attention is Figure 3's: it "
                 "fails once past the pre-training window)")  # fmt: skip


def _shares(ms, results, seed) -> str:
    from attnlab.interventions.figures import new_figure
    from attnlab.render.plots import matrix, png_html, side_colorbar

    fig, axes = new_figure(1, len(ms), figsize=(2.6 * len(ms) + 1.2, 2.9), squeeze=False)
    im = None
    for ax, m in zip(axes[0], ms):
        s = np.asarray(results[m.name][seed]["shares"])  # (L, H)
        im = matrix(ax, s, cmap="magma", vmin=0, vmax=1, aspect="auto")
        for (i, j), v in np.ndenumerate(s):
            if v > EPS:
                ax.text(j, i, "*", ha="center", va="center", color="cyan", fontsize=9)
        ax.set_title(m.name, fontsize=8)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(s.shape[1]))
        ax.set_yticks(range(s.shape[0]))
        ax.tick_params(labelsize=7)
    side_colorbar(fig, axes[0], im, "alpha_1: share on the first token")
    return png_html(fig)


def _ppl(ms, results) -> str:
    from attnlab.interventions.figures import new_figure
    from attnlab.render.plots import png_html

    fig, ax = new_figure(figsize=(1.9 * len(ms) + 2.5, 3.4))
    width = 0.8 / len(WINDOWS)
    colours = ("0.5", "tab:red", "tab:blue", "tab:green")
    for k, (w, label) in enumerate(WINDOWS.items()):
        vals = [[v["ppl"][w]["past"] for v in results[m.name].values()] for m in ms]
        mid = [float(np.median(v)) for v in vals]
        lo = [mid[i] - min(v) for i, v in enumerate(vals)]
        hi = [max(v) - mid[i] for i, v in enumerate(vals)]
        x = np.arange(len(ms)) + (k - (len(WINDOWS) - 1) / 2) * width
        ax.bar(x, mid, width, yerr=[lo, hi], color=colours[k], label=label, capsize=2)
    ax.set_yscale("log")
    ax.set_xticks(range(len(ms)))
    ax.set_xticklabels([m.name.replace("-", "\n", 1) for m in ms], fontsize=8)
    ax.set_xlabel("model (tokens, attention)")
    ax.set_ylabel("perplexity past the block (log)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return png_html(fig)


EXPERIMENT = register(Experiment(
    "attention-sinks", "Attention sinks and streaming windows",
    "the share of attention on the first token (softmax and sigmoid attention), and perplexity "
    "past the block with full attention, a window, and a window plus 4 sinks", CITATION, recipe,
    order=60,
    about="Xiao et al. 2023 and Gu et al. 2025 (attention sinks under softmax and sigmoid "
    "attention; perplexity past the block with a window, with 4 sinks kept, with full attention)",
))  # fmt: skip
