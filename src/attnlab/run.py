"""A run directory, ready to use from Python: what the CLI's verbs do, as methods.

    import attnlab
    run = attnlab.load_run("runs/mine")        # any run: trained or imported, any kind
    run.kind, run.describe()                    # "gpt", "GPT: a causal decoder-only ..."
    run.predict("ROMEO:")                       # as `attnlab predict RUN TEXT`
    run.generate("ROMEO:", max_new_tokens=100)  # as `attnlab generate RUN --prompt ...`
    run.evaluate()                              # as `attnlab eval RUN` (an Evaluation)
    rec = run.record("I like to eat apples")    # what trace, attention, explore read
    model, tokenizer = attnlab.load_run("runs/mine")   # still unpacks as before

Each method takes the CLI verb's options, with the CLI's defaults: both read them from one
place (``PredictOptions`` and ``EvalOptions`` in ``attnlab.tasks.base``, ``SamplingConfig`` in
``attnlab.generation``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from attnlab import rundir
from attnlab.data import DataError
from attnlab.models.declare import InputError, max_positions
from attnlab.modes import evaluating
from attnlab.tasks.base import EvalOptions, PredictOptions, Task, open_task, predict_options

RECORDED_PREDICT_TOKENS = 512  # predict reads a recorded pass up to this many tokens (Run.predict)


class Run:
    """A loaded run directory: ``model`` (eval mode), ``tokenizer``, ``config`` (config.json).

    Unpacks as ``model, tokenizer = run``, as ``load_run`` always did.
    """

    def __init__(self, path: str | Path, model: nn.Module, tokenizer, config: dict):
        self.path = Path(path)
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self._task: Task | None = None

    # -- what it is ----------------------------------------------------------------------------

    def __iter__(self):
        return iter((self.model, self.tokenizer))

    def __getitem__(self, i: int):
        return (self.model, self.tokenizer)[i]

    def __len__(self) -> int:
        return 2

    @property
    def kind(self) -> str:
        """gpt, mlm, text-classifier, encoder, seq2seq-transformer, t5, lstm-attention, lstm,
        lstm-classifier, vit: the model's declared kind (``attnlab.models.declare``)."""
        return self.model.kind

    @property
    def imported(self) -> str | None:
        """The Hugging Face directory the weights came from, if they were imported."""
        return rundir.imported_from(self.config)

    @property
    def no_data_of_its_own(self) -> str | None:
        """Why the run has no held-out split of its own ("was imported from DIR", "names no
        data"); None when its config.json names the data it was trained on."""
        if self.imported:
            return f"was imported from {self.imported}"
        return None if self.config.get("data") else "names no data"

    def describe(self) -> str:
        """What the model is, in one sentence (and where imported weights came from)."""
        text = self.model.describe()
        return text + (f" (imported from {self.imported})" if self.imported else "")

    @property
    def about(self) -> dict:
        """{"kind", "model_type", "description"}: what every --json output starts with."""
        return about(self.model, self.config)

    @property
    def task(self) -> Task:
        """The run's task, rebuilt without its data (what ``predict`` needs); a RunError for a
        model that predicts nothing (an encoder with no head)."""
        if self._task is None:
            try:
                self._task = open_task(self.path, cfg=self.config, tokenizer=self.tokenizer)
            except rundir.RunError as e:
                raise rundir.RunError(f"{self.path}: {e}") from None
        return self._task

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, kind={self.kind!r})"

    def _repr_html_(self) -> str:
        """In a notebook: the directory, what the model is, its size and its last figures."""
        from attnlab.render.display import table_html

        n = sum(p.numel() for p in self.model.parameters())
        rows = [["path", str(self.path)], ["kind", self.kind], ["model", self.describe()],
                ["parameters", f"{n:,}"]]  # fmt: skip
        metrics = self.config.get("metrics")
        if isinstance(metrics, dict):
            rows += [[k, f"{v:.4g}" if isinstance(v, float) else v] for k, v in metrics.items()]
        return table_html(["run", ""], rows)

    # -- what it does --------------------------------------------------------------------------

    def predict(self, inputs: str | list[str], options: PredictOptions | None = None, *,
                rec=None, **given):  # fmt: skip
        """The model's prediction for one input (a dict) or several (a list): the next tokens
        of a GPT, the fillers of each [MASK], the classes of a text or image (a file or
        ``test:N``), the translation of an encoder-decoder (greedy, or ``beam=N``).

        Each input the model reads whole, of at most ``RECORDED_PREDICT_TOKENS`` tokens, is
        predicted from one recorded forward pass (``record``; ``rec``: a recording of the one
        input already made, used where that applies): the pass every look-inside tool reads,
        so the workbench's panels share it and show these numbers to the bit. A longer input
        (a GPT's prompt past its block: the last block), a beam search, or an input the task
        reads otherwise runs the task's own pass (the same prediction, to float rounding)."""
        options = predict_options(options, given)
        task = self.task
        if options.beam != 1 and task.name != "seq2seq":
            raise rundir.RunError(f"beam search is for encoder-decoder runs; this is a {self.kind}")
        single = isinstance(inputs, str)
        items = [inputs] if single else list(inputs)
        if any(x == "" for x in items):  # as trace and attention say
            raise InputError("the text has no tokens")
        if rec is not None and not (single and rec.text == inputs):
            raise InputError("rec must be a recording of the one input predicted")
        preds = [self._predict_recorded(x, options, rec) for x in items]
        if any(p is None for p in preds):
            rest = iter(task.predict(self.model, [x for x, p in zip(items, preds) if p is None],
                                     options))  # fmt: skip
            preds = [p if p is not None else next(rest) for p in preds]
        return preds[0] if single else preds

    def _predict_recorded(self, text: str, options: PredictOptions, rec=None) -> dict | None:
        """``predict``'s answer for ``text`` read off a recording of it (``rec``, else one made
        here) where ``recorded_predict`` says so; None: the task's own pass answers."""
        if not self.recorded_predict(text):
            return None
        if rec is None:
            from attnlab.inspect.recording import InspectError

            try:
                rec = self.record(text)
            except (InspectError, InputError):  # the task's own pass says why, in its words
                return None
        with torch.no_grad():
            return self.task.predict_recorded(self.model, rec, options)

    def recorded_predict(self, text: str) -> bool:
        """Whether ``predict`` reads ``text`` off a recorded forward pass: the model reads it
        whole, in at most ``RECORDED_PREDICT_TOKENS`` tokens (a recording holds every head's
        tokens x tokens weights; past that, the task's own pass keeps memory flat)."""
        if self.model.reads == "image":
            return True  # a ViT's patches: a fixed, small number
        try:
            n = len(self.tokenizer.encode_source(text) if self.model.reads == "source"
                    else self.tokenizer.encode(text))  # fmt: skip
        except (ValueError, AttributeError):  # a character it cannot read: predict says so
            return False
        limit = max_positions(self.model)
        return 0 < n <= RECORDED_PREDICT_TOKENS and (limit is None or n <= limit)

    def prediction_lines(self, pred: dict) -> list[str]:
        """A prediction as terminal lines, in the words of the run's task."""
        return self.task.prediction_lines(pred)

    def evaluate(self, data: str | None = None, options: EvalOptions | None = None, **given):
        """The task's figures (an ``attnlab.evaluation.Evaluation``) on ``data`` (a file in
        the task's format) or, without it, on the run's held-out split."""
        options = self.eval_options(data, options, **given)
        return self.score(self.scoring_task(options), options)

    def eval(self, data: str | None = None, options: EvalOptions | None = None, *,
             ablate: str | None = None, mode: str = "zero", quiet: bool = True, **given):  # fmt: skip
        """As ``attnlab eval RUN``: ``evaluate``'s figures (an ``Evaluation``); with ``ablate``
        ("1.2,0.3", "decoder.0.1", "context"), the same figures on the same data, split and
        limits with those heads ablated (``mode``: zero, mean or resample), then intact, an
        ``attnlab.interventions.AblatedEval`` (``quiet=False``: progress on stderr)."""
        if ablate is None:
            return self.evaluate(data, options, **given)
        from attnlab.interventions import ablated_eval

        options = self.eval_options(data, options, **given)
        if options.data is not None:
            from attnlab.data import open_corpus

            open_corpus(options.data, options.encoding)  # a missing or binary file: refused now
        task = self.scoring_task(options)  # nothing to score: refused before anything runs
        scored = []

        def score():
            scored.append(self.score(task, options))
            return scored[-1]

        result = ablated_eval(self.model, score, ablate, mode, quiet=quiet)
        result.source = scored[-1].data
        return self._about(result)

    def eval_options(self, data: str | None = None, options: EvalOptions | None = None,
                     **given) -> EvalOptions:  # fmt: skip
        """``options`` with ``data`` and the ``given`` fields put in (what ``evaluate`` takes),
        each one the run's task reads (an option it would ignore is a ConfigError)."""
        base = options.to_dict() if options is not None else {}
        options = EvalOptions.from_dict({**base, **given, **({"data": data} if data else {})})
        self.task.check_eval_options(options)
        return options

    def scoring_task(self, options: EvalOptions) -> Task:
        """The task ``evaluate`` scores with, its data read: a RunError (or DataError) saying
        what to give instead when the run has nothing to score, before any model runs."""
        if options.data is not None:
            return self.task
        _ = self.task  # an encoder with no head is refused before any data is read
        where = self.no_data_of_its_own
        if where is not None:
            raise rundir.RunError(f"{self.path} {where}, so it has no held-out split: give "
                                "--data FILE (Python: evaluate(data=...))")  # fmt: skip
        try:
            return open_task(self.path, True, self.config, self.tokenizer)
        except DataError as e:  # its data moved, changed or was never kept
            what = ("a text" if self.model.predicts == "next-token"
                    else "a file in its task's format")  # fmt: skip
            raise type(e)(f"{e}; score {what} with --data") from None

    def score(self, task: Task, options: EvalOptions):
        """``task``'s figures of the model as it runs now (``evaluate`` once the task is open;
        ``eval --ablate`` calls it with heads ablated, then intact)."""
        with evaluating(self.model), torch.no_grad():
            return task.score(self.model, options)

    def generate(self, prompt: str | list[str] = "\n", *, stop=(), num_samples: int = 1,
                 use_cache: bool = True, stream=None, window: str = "slide",
                 beam: int | None = None, alpha: float = PredictOptions.alpha,
                 samples: bool = False, **sampling):  # fmt: skip
        """What ``attnlab generate`` prints: a GPT's continuation of ``prompt`` (an
        encoder-decoder's sampled output for a source text), sampled with ``SamplingConfig``'s
        options and defaults (``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``,
        ``repetition_penalty``, ``seed``), or the best ``num_samples`` of a beam search
        (``beam=N``): the one place that choice is made. A str for one prompt and one sample;
        otherwise a list; ``samples=True``: always the list of ``attnlab.generation.Sample``
        (each its prompt, text and tokens), each prompt's in turn."""
        from attnlab.generation import SamplingConfig, beam_generate
        from attnlab.generation import generate as sample

        if not self.model.decodes:
            raise rundir.RunError(
                f"{self.path}: generate samples text from a GPT (or an encoder-decoder); this "
                f"run is a {self.kind} ({self.describe()}): use predict"
            )
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        cfg = SamplingConfig(**sampling)
        if beam is not None:
            rows = beam_generate(self.model, self.tokenizer, prompts, beam, alpha,
                                 cfg.max_new_tokens, n_best=num_samples, window=window,
                                 use_cache=use_cache)  # fmt: skip
            found = [s for row in rows for s in row]
        else:
            found = sample(self.model, self.tokenizer, prompts, cfg, stop=stop,
                           num_samples=num_samples, use_cache=use_cache, stream=stream,
                           window=window)  # fmt: skip
        if samples:
            return found
        texts = [s.text for s in found]
        return texts[0] if isinstance(prompt, str) and len(texts) == 1 else texts

    def translate(self, texts: str | list[str], *, beam: int | None = None,
                  alpha: float = PredictOptions.alpha, max_len: int | None = None,
                  num_samples: int = 1, stop=(), **sampling) -> list[dict]:  # fmt: skip
        """What ``attnlab translate`` prints: an encoder-decoder's output for each source text,
        rows {"source", "output"}. Greedy (``predict``'s translation) unless it searches
        (``beam=N``, the best ``num_samples``) or samples (``temperature`` > 0, a repetition
        penalty, ``stop`` strings or several samples; ``generate``'s decoding, with
        ``SamplingConfig``'s other options). ``max_len``: the longest output (default: twice
        the source + 10)."""
        import dataclasses

        from attnlab.generation import SamplingConfig

        if self.model.predicts != "decoder-step":
            raise rundir.RunError(f"{self.path}: not an encoder-decoder run (train one with --task "
                                "seq2seq); `attnlab predict` answers for any run")  # fmt: skip
        texts = [texts] if isinstance(texts, str) else list(texts)
        cfg = SamplingConfig(max_len, **{"temperature": 0.0, **sampling})
        sampled = cfg.temperature > 0 or cfg.repetition_penalty != 1.0 or bool(stop)
        if beam is None and not sampled and num_samples == 1:  # greedy: predict's answer
            preds = self.predict(texts, alpha=alpha, max_len=max_len)
            return [{"source": t, "output": p["output"]} for t, p in zip(texts, preds)]
        found = self.generate(texts, stop=stop, num_samples=num_samples, beam=beam, alpha=alpha,
                              samples=True, **dataclasses.asdict(cfg))  # fmt: skip
        return [{"source": s.prompt, "output": s.text} for s in found]

    def classify(self, inputs: str | list[str], top_k: int = PredictOptions.top_k):
        """What ``attnlab classify`` prints: a classifier's ``top_k`` classes of each input (a
        text; for a ViT an image file or ``test:N``), as ``predict`` gives them."""
        if self.model.predicts != "class":
            raise rundir.RunError(f"{self.path}: not a classifier run (train one with --task "
                                "classify); `attnlab predict` answers for any run")  # fmt: skip
        return self.predict(inputs, top_k=top_k)

    def record(self, text: str):
        """One recorded forward pass over ``text`` (an image path or ``test:N`` for a ViT): the
        ``attnlab.inspect.Recording`` every look-inside tool reads."""
        from attnlab.inspect.recording import record

        rec = record(self.model, self.tokenizer, text)
        rec.description = self.describe()
        if "classes" not in rec.extra and self.config.get("labels"):
            rec.extra["classes"] = list(self.config["labels"])
        return rec

    def what_if(self, text: str, layer: int | None = None, head: int = 0, *,
                map: str | None = None, temperature: float | None = None,
                pad: int | None = None, pad_text: str | None = None):  # fmt: skip
        """As ``attnlab what-if RUN TEXT``: one head's attention as the model computes it and
        with one piece changed at a time (no 1/sqrt(d_k), no causal mask, temperature T and
        1/T, ``pad`` pads without a padding mask; ``pad_text``: as many pads as ``text`` is
        shorter than it; None: the defaults of ``attnlab.inspect.what_if``, T = 2, 2 pads).
        An ``attnlab.inspect.what_if.WhatIf``."""
        from attnlab.inspect.recording import InspectError
        from attnlab.inspect.what_if import what_if

        rec = self.record(text)
        if pad_text is not None:
            info = rec.select(layer=layer, name=map)
            mine, theirs = len(rec.tokens[info.query_stack]), len(
                self.record(pad_text).tokens[info.query_stack])  # fmt: skip
            if theirs <= mine:
                raise InspectError(f"the pad text must be longer than the text, which it pads: "
                                   f"it has {theirs} tokens, the text {mine}")  # fmt: skip
            pad = theirs - mine
        given = {k: v for k, v in (("temperature", temperature), ("pad", pad)) if v is not None}
        return what_if(rec, self.model, layer, head, map, text=text, **given)

    @staticmethod
    def walk(tokens: list[str] | str | None = None, x=None, w_q=None, w_k=None, w_v=None, *,
             matrices=None, n: int | None = None, m: int | None = None, d_k: int | None = None,
             d_v: int | None = None, seed: int = 0, init: str = "linear", scale: bool = True,
             causal: bool = True, temperature: float | None = None, pad: int | None = None,
             padding_mask: bool = True, what_if: bool = False):  # fmt: skip
        """As ``attnlab walk``: attention by hand, no model (call it on the class,
        ``Run.walk(...)``, or on any run). The matrices (``matrices``, a HandMatrices, or each
        of ``x``, ``w_q``, ``w_k``, ``w_v`` given or drawn at random: see
        ``attnlab.inspect.by_hand.hand_matrices``) walked step by step, Q = X W_Q, K = X W_K,
        V = X W_V, softmax(Q K^T / sqrt(d_k) / T, masked) V, with the switches ``scale``,
        ``causal``, ``temperature`` (default 1), ``pad`` pads (default 0) and
        ``padding_mask``: a ``Walk``. ``what_if=True``: those weights beside each change (no
        scale, no causal mask, temperature T and 1/T, default 2, ``pad`` pads without a
        padding mask, default 2), a ``WhatIf``."""
        from attnlab.inspect.by_hand import Settings, hand_matrices
        from attnlab.inspect.by_hand import walk as walk_
        from attnlab.inspect.recording import InspectError
        from attnlab.inspect.what_if import DEFAULT_PAD, DEFAULT_TEMPERATURE, what_if_by_hand

        hand = hand_matrices(tokens, x, w_q, w_k, w_v, matrices=matrices, n=n, m=m, d_k=d_k,
                             d_v=d_v, seed=seed, init=init)  # fmt: skip
        if not what_if:
            return walk_(hand, Settings(scale=scale, causal=causal,
                                        temperature=1.0 if temperature is None else temperature,
                                        pad=pad or 0, padding_mask=padding_mask))  # fmt: skip
        if not padding_mask:
            raise InspectError("--what-if shows the attention without a padding mask itself: "
                               "drop --no-padding-mask")  # fmt: skip
        t = DEFAULT_TEMPERATURE if temperature is None else temperature
        if t == 1:
            raise InspectError("--what-if compares temperatures T and 1/T: give --temperature "
                               "other than 1")  # fmt: skip
        return what_if_by_hand(hand, Settings(scale=scale, causal=causal), temperature=t,
                               pad=DEFAULT_PAD if pad is None else pad)  # fmt: skip

    def align(self, text: str, *others: Run, layer: int | None = None, head: int | None = None,
              words: bool = False, rec=None):  # fmt: skip
        """As ``attnlab align RUN [RUN ...] TEXT``: this encoder-decoder run's output for
        ``text`` and each decoder step's weights over the source (an LSTM's alignment, a
        Transformer's cross-attention; ``layer``/``head``, else their mean; ``words``: each
        word's tokens added up), beside the same of each of ``others``, named by directory and
        kind: an ``attnlab.inspect.source_attention.SideBySide``. ``rec``: a recording of
        ``text`` by this run already made."""
        from attnlab.inspect.source_attention import side_by_side

        runs = (self, *others)
        results = [r.source_attention(text, layer=layer, head=head, words=words,
                                      rec=rec if r is self else None) for r in runs]  # fmt: skip
        names = [f"{r.path.name or r.path} ({r.kind})" for r in runs]
        return side_by_side(results, names, text)

    def source_attention(self, text: str, layer: int | None = None, head: int | None = None,
                         words: bool = False, rec=None):  # fmt: skip
        """As one run of ``attnlab align``: an encoder-decoder's output for ``text`` and each
        decoder step's weights over the source (``words``: each word's tokens added up), an
        ``attnlab.inspect.source_attention.SourceAttention`` (``rec``: a recording of ``text``
        already made)."""
        from attnlab.inspect.source_attention import source_attention

        rec = self.record(text) if rec is None else rec
        return source_attention(rec, self.tokenizer, layer, head, words, text)

    def explore(self, text: str, *, max_tokens: int | None = None, start: int = 0,
                interventions: bool = False, rec=None):  # fmt: skip
        """As ``attnlab explore RUN TEXT``: the self-contained explorer page of ``text``'s
        attention (every layer x head, the head view, the Q·K neuron view, influence bars, the
        prediction), at most ``max_tokens`` tokens per sequence from ``start`` (default
        ``attnlab.inspect.explorer.MAX_TOKENS``); ``interventions``: the one-input
        interventions as extra tabs (lens, rollout, flow, DLA, integrated gradients, head
        importance). An ``attnlab.inspect.explorer.Explorer``: ``save(path)`` writes it,
        ``data`` is what the page draws (its neuron view names the ``attnlab why`` command for
        this run and text). ``rec``: a recording of ``text`` already made."""
        from attnlab.inspect.explorer import MAX_TOKENS, explore

        rec = self.record(text) if rec is None else rec
        tabs = None
        if interventions:
            from attnlab.interventions import explorer_tabs

            tabs = explorer_tabs(self.subject, text)
        return explore(rec, self.model, title=f"attnlab explorer: {text}",
                       max_tokens=MAX_TOKENS if max_tokens is None else max_tokens, start=start,
                       tabs=tabs, tokenizer=self.tokenizer,
                       why={"run": str(self.path), "text": text})  # fmt: skip

    # -- look inside: what `attnlab trace | similarity | influence` print --------------------
    # Each returns the result the verb prints (its ``to_json()`` the verb's ``--json``, starting
    # with ``about``); the verb only parses options, calls the method and prints it.

    def trace(self, text: str, layer: int = 0, head: int = 0, top_k: int = 5):
        """As ``attnlab trace RUN TEXT``: one forward pass over ``text`` explained step by step
        for one layer and head, with the model's ``top_k`` predictions (an
        ``attnlab.inspect.trace.Trace``)."""
        from attnlab.inspect.trace import trace

        rec = self.record(text)
        result = trace(self.model, self.tokenizer, text, layer=layer, head=head, top_k=top_k,
                       rec=rec)  # fmt: skip
        result.widest = max(map(len, rec.tokens.values()), default=0)
        return result

    def attention(self, text: str, layer: int | None = None, head: int | None = None, *,
                  mean: bool = False, map: str | None = None, start: int = 0,
                  all: bool = False, title: str | None = None):  # fmt: skip
        """As ``attnlab attention RUN TEXT``: one layer and head's token x token attention
        (``mean``: the mean over heads; ``map``: maps whose name contains it; ``start``: the
        first key the terminal shows), an ``attnlab.inspect.attention.AttentionMap``; ``all``:
        the grid of every layer x head (``--all``), an ``AttentionGrid`` titled ``title``."""
        from attnlab.inspect.attention import attention, attention_grid

        rec = self.record(text)
        if all:
            return attention_grid(rec, name=map, title=title)
        return attention(rec, layer=layer, head=head, mean=mean, name=map, start=start)

    def similarity(self, text: str, layer: int | None = None, measure: str = "cosine"):
        """As ``attnlab similarity RUN TEXT``: token x token cosine similarity and dot products
        before and after each block (``measure``: what the terminal shows; None ``layer``:
        the input and the last output), an ``attnlab.inspect.similarity.Similarity``."""
        from attnlab.inspect.similarity import similarity

        return similarity(self.record(text), layer=layer, measure=measure)

    def influence(self, text: str, sources: int = 3, top: int = 20):
        """As ``attnlab influence RUN TEXT``: how far its context moved each token, layer by
        layer, with the ``sources`` source tokens that moved it most (``top``: rows the
        terminal shows), an ``attnlab.inspect.influence.Influence``."""
        from attnlab.inspect.influence import influence

        return influence(self.model, self.record(text), n_sources=sources, top=top)

    def check(self, length: int = 16, batch: int = 2, seed: int = 0):
        """As ``attnlab check RUN``: the conformance checks (no future leak, cache == no cache,
        ...) on ``batch`` random probes of ``length`` tokens, an
        ``attnlab.inspect.check.CheckReport`` (``ok``: none failed)."""
        from attnlab.inspect.check import check

        report = check(self.model, length=length, batch=batch, seed=seed)
        return self._about(report)

    def embed(self, texts: str | list[str], pool: str | None = None,
              normalize: bool = False) -> list:  # fmt: skip
        """As ``attnlab embed RUN TEXT...``: each text's sentence embedding from an encoder run,
        rounded as the verb prints it (one text: one list; several: a list of lists).
        ``pool``: "mean" or "cls" (None: the run's sentence-transformers setting, else mean)."""
        from attnlab.embeddings import sentence_embeddings

        if not self.model.sentence_embedding:
            raise rundir.RunError(f"{self.path}: embed needs an encoder run, not "
                                  f"{self.model.model_type!r}")  # fmt: skip
        if self.tokenizer is None:
            raise rundir.RunError(f"{self.path}: the run has no tokenizer.json")
        texts = [texts] if isinstance(texts, str) else list(texts)
        pool = pool or self.config.get("sentence_embedding", {}).get("pool", "mean")
        emb = sentence_embeddings(self.model, self.tokenizer, texts, pool=pool,
                                  normalize=normalize)  # fmt: skip
        rows = [[round(float(v), 7) for v in row] for row in emb]
        return rows[0] if len(rows) == 1 else rows

    # -- interventions: what `attnlab ablate | patch | lens | attribute | heads` print -----------
    # Each returns the result the verb prints, its JSON (``result.to_json()``) the verb's
    # ``--json``, starting with ``about``; a notebook draws it (``_repr_html_``). The defaults
    # are the verbs' own (tests/integration/test_run_interventions.py checks both agree).

    def _about(self, result):
        result.about = self.about
        return result

    def ablate(self, text: str, heads: str | None = None, *, site: str | None = None,
               context: bool = False, positions: list[int] | None = None,
               neurons: list[int] | None = None, mode: str = "zero",
               reference: str | None = None, top: int = 5, position: int | None = None):  # fmt: skip
        """As ``attnlab ablate RUN TEXT``: heads ("1.2,0.3"; "decoder.0.1"), an LSTM's
        ``context`` vector, or any hook ``site`` (with ``neurons``), ablated by ``mode`` (zero,
        mean, resample from ``reference``); the loss change and the top predictions."""
        from attnlab.interventions import InterventionError, ablation

        if sum(bool(x) for x in (heads, site, context)) != 1:
            raise InterventionError("say what to ablate: --head L.H[,L.H...], --site HOOK_NAME "
                                    "or --context")  # fmt: skip
        if neurons is not None and site is None:
            raise InterventionError("--neurons picks units of one activation: give it with --site")
        s = self.subject
        if context:
            if s.model.residual:  # the context vector is the attention of an LSTM
                raise InterventionError("--context ablates an LSTM decoder's context vector; "
                                        f"this run is a {s.kind} model: use --head")  # fmt: skip
            heads = "context"
        elif heads and not s.model.residual:
            raise InterventionError("an LSTM has no heads: its attention is one context vector, "
                                    "ablate it with --context")  # fmt: skip
        return self._about(ablation(s, text, heads=heads, site=site, positions=positions,
                                    neurons=neurons, mode=mode, reference_text=reference,
                                    top=top, position=position))  # fmt: skip

    def patch(self, clean: str, corrupt: str, target: str, *, foil: str | None = None,
              by: str = "position", position: int | None = None, reverse: bool = False,
              positions: list[int] | None = None):  # fmt: skip
        """As ``attnlab patch RUN --clean A --corrupt B --target T``: activation patching (by
        layer x position or layer x head), with attribution patching beside it."""
        from attnlab.interventions import patch

        return self._about(patch(self.subject, clean, corrupt, target, foil=foil, by=by,
                                 position=position, reverse=reverse, positions=positions))  # fmt: skip

    def circuit(self, *, pairs: str | None = None, clean: str | None = None,
                corrupt: str | None = None, target: str | None = None, foil: str | None = None,
                induction: int | None = None, half: int = 12, metric: str | None = None,
                method: str = "eap-ig", steps: int = 5, ablation: str = "corrupt",
                k: int | None = None, fraction: float | None = None, reach: float = 0.9,
                random_sets: int = 20, resamples: int = 1000, seed: int = 0,
                acdc: float | None = None, positions: bool = False,
                position: int | None = None, direction: str = "denoising"):  # fmt: skip
        """As ``attnlab circuit RUN``: every edge of the residual graph scored on clean/corrupt
        pairs (a TSV file ``pairs``, one pair ``clean``/``corrupt``/``target``[/``foil``], or
        ``induction`` random r r vs r' r pairs of ``half`` tokens) by ``method`` (eap, eap-ig
        with ``steps``, exact), the top-k circuit and its faithfulness curve beside random sets
        with bootstrap CIs, and with ``acdc`` ACDC's greedy pruning at that tau; ``direction``
        denoising (units patched in the corrupt run) or noising (in the clean run). The result's
        ``to_dict()`` is what ``--json`` prints (plain JSON-able data)."""
        from attnlab.interventions import InterventionError
        from attnlab.interventions.circuits import find_circuit
        from attnlab.interventions.pairs import induction_pairs, one_pair, read_pairs

        given = sum(x is not None for x in (pairs, clean, induction))
        if given != 1 or (clean is not None) != (corrupt is not None):
            raise InterventionError("give the pairs one way: --pairs FILE, --clean A --corrupt B "
                                    "--target T [--foil F], or --induction N")  # fmt: skip
        if pairs is not None:
            prompts = read_pairs(pairs)
        elif clean is not None:
            if target is None:
                raise InterventionError("--clean/--corrupt need --target (the token the clean "
                                        "input gives)")  # fmt: skip
            prompts = one_pair(clean, corrupt, target, foil)
        else:
            prompts = induction_pairs(self.subject, induction, half, seed)
        return self._about(find_circuit(
            self.subject, prompts, method=method, steps=steps, metric=metric, ablation=ablation,
            positions=positions, k=k, fraction=fraction, target=reach,
            random_sets=random_sets, resamples=resamples, seed=seed, acdc=acdc,
            position=position, direction=direction))  # fmt: skip

    def path_patch(self, clean: str, corrupt: str, target: str, sender: str,
                   receivers: list[str], *, foil: str | None = None,
                   position: int | None = None) -> dict:  # fmt: skip
        """A sender's effect along chosen paths only (``interventions.edges.path_patch``):
        ``sender`` a writer's name (``blocks.0.attn.head1``, ``embed``), ``receivers`` readers'
        names (``blocks.1.attn.head0.k``, ``readout``). Plain data: the metric clean, corrupt
        and path-patched per pair, and the share of the change the path carries."""
        from attnlab.interventions import InterventionError
        from attnlab.interventions.edges import Circuits, path_patch
        from attnlab.interventions.pairs import one_pair, prepare_pairs

        metric = "logit-diff" if foil is not None else "logprob"
        (batch,) = prepare_pairs(self.subject, one_pair(clean, corrupt, target, foil), metric,
                                 position)  # fmt: skip
        circ = Circuits(self.subject)
        try:
            out = path_patch(circ, batch, sender, receivers, metric)
        except KeyError as e:
            raise InterventionError(str(e).strip("'\"")) from None
        return {"metric": metric, **{k: (v.tolist() if hasattr(v, "tolist") else v)
                                     for k, v in out.items()}}  # fmt: skip

    def weights(self, head: str | None = None, top: int = 5) -> dict:
        """As ``attnlab weights RUN``: the Q-, K- and V-composition scores of every earlier head
        into every later one beside their random baselines
        (``interventions.weights.composition_scores``), and with ``head``
        (``blocks.1.attn.head0``) that head's QK and OV circuits read through a GPT's
        embeddings and unembedding, ``top`` tokens per singular direction
        (``head_circuits``). Plain data."""
        from attnlab.interventions import InterventionError
        from attnlab.interventions.weights import composition_scores, head_circuits

        out = {"composition": composition_scores(self.subject)}
        if head is not None:
            try:
                out["head"] = head_circuits(self.subject, head, top)
            except KeyError as e:
                raise InterventionError(str(e.args[0])) from None
        return out

    def why(self, text: str, head: str, query: int, key: int) -> dict:
        """Why head ``head`` (``blocks.1.attn.head0``) attends from position ``query`` to
        ``key`` on ``text``: its score split into (query-side writer, key-side writer) parts
        that sum to the model's score (``interventions.why.split_score``), as plain data."""
        from attnlab.interventions import InterventionError
        from attnlab.interventions.why import split_score

        p = self.subject.prepare(text)
        try:
            return split_score(self.subject, p.args, head, query, key).to_dict()
        except KeyError as e:  # a name the residual graph does not have
            raise InterventionError(str(e.args[0])) from None

    def lens(self, text: str, *, tuned: bool = False):
        """As ``attnlab lens RUN TEXT``: the logit lens (``tuned``: the run's tuned lens)."""
        from attnlab.interventions import TunedLens, logit_lens

        s = self.subject
        return self._about(logit_lens(s, text, TunedLens.load(self.path, s) if tuned else None))

    def attribute(self, text: str, method: str, target: str | None = None, *,
                  foil: str | None = None, position: int | None = None, steps: int = 64,
                  rule: str = "gauss-legendre", stack: str | None = None,
                  residual: float = 0.5):  # fmt: skip
        """As ``attnlab attribute RUN TEXT --method M``: dla, rollout, flow, ig or grad."""
        from attnlab.interventions import (
            InterventionError,
            attention_paths,
            direct_logit_attribution,
            input_attribution,
        )

        s = self.subject
        if method in ("dla", "ig", "grad") and target is None:
            raise InterventionError(f"--method {method} attributes a token's logit: give "
                                    "--target TOKEN")  # fmt: skip
        if method == "dla":
            result = direct_logit_attribution(s, text, target, foil, position)
        elif method in ("rollout", "flow"):
            result = attention_paths(s, text, method, position, stack, residual)
        elif method in ("ig", "grad"):
            result = input_attribution(s, text, target, foil, method, steps, position, rule)
        else:
            raise InterventionError(f"unknown method {method!r}: dla, rollout, flow, ig or grad")
        return self._about(result)

    def heads(self, text: str | None = None, *, importance: bool = False,
              data: str | None = None, inputs: str | None = None, windows: int = 16,
              mode: str = "zero", prune: bool = True, sequences: int = 16, seed: int = 0,
              quiet: bool = True):  # fmt: skip
        """As ``attnlab heads RUN``: every head's scores and kind (the JSON of ``--json
        --all``); ``importance=True``: the loss change per ablated head and the pruning curve,
        on ``text``, ``data`` (a GPT's corpus windows), ``inputs`` (one per line) or, given
        none, the run's held-out split."""
        from attnlab import interventions as iv
        from attnlab.interventions.importance import check_rankable, inputs_loss

        if not importance:
            from attnlab.inspect.heads import heads_of_run

            return self._about(heads_of_run(self, n=sequences, seed=seed))
        check_rankable(self.subject)  # nothing to rank, or nothing to rank by
        if data is not None:
            s = self.subject
            evaluate, source = iv.corpus_loss(s, data, windows), f"{windows} windows of {data}"
        elif inputs is not None:
            s = self.subject
            evaluate, n = inputs_loss(s, inputs)
            source = f"{n} inputs of {inputs}"
        elif text is not None:
            s = self.subject
            evaluate, source = iv.text_loss(s, [text]), repr(text)
        else:  # a trained run: its task's held-out loss, as training measured it
            h = iv.held_out(self)
            s = iv.Subject(h.model, h.task.tokenizer)
            evaluate, source = h.loss(), h.source
        return self._about(iv.head_importance(s, evaluate, mode, source, prune=prune,
                                              quiet=quiet))  # fmt: skip

    def hooks(self, text: str, names: list[str] | None = None,
              edit: dict | None = None):  # fmt: skip
        """One forward pass over ``text`` recording the named activations (``names``; None:
        every hook point) while ``edit`` (hook name -> f(tensor, name) -> tensor) replaces
        others: a ``Hooked`` (its ``cache``, ``logits``, and how many values each edit
        changed). An unknown name, or an edit that never fired, is an InterventionError.

            run.hooks("I like", ["blocks.0.attn.weights"]).cache["blocks.0.attn.weights"]
            run.hooks("I like", edit={"blocks.0.attn.z": lambda x, n: 0 * x}).logits
        """
        from attnlab import hooks
        from attnlab.interventions import edited
        from attnlab.interventions.hooked import Hooked

        s = self.subject
        names = list(hooks.hook_points(self.model)) if names is None else list(names)
        p = s.prepare(text)
        with torch.no_grad(), edited(self.model, dict(edit or {}), names) as (cache, log):
            logits = s.logits(p)
        return self._about(Hooked(text, list(p.input_tokens), dict(cache), logits, log))

    @property
    def subject(self):
        """The model, its tokenizer and its class names as every intervention reads them (an
        ``attnlab.interventions.Subject``)."""
        from attnlab.interventions.subjects import Subject

        return Subject(self.model, self.tokenizer, self.config.get("labels"))


def about(model: nn.Module, config: dict) -> dict:
    """{"kind", "model_type", "description"} of a model and its run's config.json: what every
    ``--json`` output starts with."""
    imported = rundir.imported_from(config)
    text = model.describe() + (f" (imported from {imported})" if imported else "")
    return {"kind": model.kind, "model_type": config.get("model_type", ""), "description": text}


def about_run(path: str | Path) -> dict:
    """``about`` of the run at ``path`` without reading its weights (the model is built on the
    meta device): for verbs that read a run's files but run no model (timeline, train)."""
    checked = rundir.check_run(path)
    return about(checked.model, checked.config)


def load_run(path: str | Path, device: str | torch.device = "cpu") -> Run:
    """The run directory at ``path`` (trained or imported, any kind), loaded on ``device``:
    the one door to a run (config.json is read once, then checked against the weights and
    the tokenizer before any weight is read)."""
    config = rundir.read_run_config(path)
    model, tokenizer = rundir.open_model(path, device=device, cfg=config)
    return Run(path, model, tokenizer, config)
