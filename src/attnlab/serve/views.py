"""What each panel of the workbench shows: one function per view, each calling the same library
function (most often a ``Run`` method) that the CLI verb calls, and returning the verb's
``--json`` text unchanged, so the page, the CLI and Python never disagree.

    view          the verb whose --json it is
    predict       attnlab predict RUN TEXT
    explorer      attnlab explore RUN TEXT (the data the page embeds), plus each map's head labels
    trace         attnlab trace RUN TEXT --layer L --head H (params ``trace_step``,
                  ``trace_window``: only the step the page shows, see ``trace_slice``)
    similarity    attnlab similarity RUN TEXT (param ``similarity_layer``: only that layer)
    influence     attnlab influence RUN TEXT
    lens          attnlab lens RUN TEXT
    dla           attnlab attribute RUN TEXT --method dla --target T (T: the top prediction)
    ablate        attnlab ablate RUN TEXT --head L.H --mode M
    patch         attnlab patch RUN --clean A --corrupt B --target T --by B
    generate      attnlab generate RUN --prompt TEXT --json, and each new token's attention
    what_if       attnlab what-if RUN TEXT --layer L --head H
    align         attnlab align RUN TEXT [--words]
    walk          attnlab walk --tokens TEXT ... (attention by hand: no model runs)
    learn         attnlab timeline RUN --json and explore RUN --steps's maps, read again as
                  training writes

A new view is one function here, registered with ``@view("name", needs_text=...)``; the page
draws it with one ``panel({...})`` entry in ``page/panels.js`` (docs/serve.md says how).

Each view takes (run, params, cache) and returns JSON text. A view that reads one text shares
one recorded forward pass with the others (``cache``: the run's recordings, the last few
texts). A refusal (a model without layers for the lens, a token the vocabulary lacks) is an
AttnlabError whose one line the page shows in that panel.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from attnlab.models.declare import max_positions
from attnlab.serve.runs import ServeError

RECORDINGS_KEPT = 4  # recordings kept per run: the last few texts typed


@dataclass(frozen=True)
class View:
    name: str
    fn: Callable
    needs_text: bool = True  # reads the input box (the learn view reads the run's files)


VIEWS: dict[str, View] = {}


def view(name: str, needs_text: bool = True):
    def add(fn):
        VIEWS[name] = View(name, fn, needs_text)
        return fn

    return add


def dumps(data) -> str:
    """JSON text of ``data`` (orjson: the numbers are the same, written ten times faster than
    the json module writes them; NaN and infinities, which JSON lacks, become null)."""
    import orjson

    return orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def _json(result, run) -> str:
    """A result's JSON as the CLI's --json prints it (``about`` first)."""
    if getattr(result, "about", None) is None:
        result.about = run.about
    d = result.to_dict()
    return dumps({"about": result.about, **d} if "about" not in d else d)


def recording(run, cache: dict, text: str):
    """``run.record(text)``, shared by the views of one text (the last few kept)."""
    recs = cache.setdefault("recordings", OrderedDict())
    if text in recs:
        recs.move_to_end(text)
        return recs[text]
    rec = run.record(text)
    recs[text] = rec
    while len(recs) > RECORDINGS_KEPT:
        recs.popitem(last=False)
    return rec


def _int(params: dict, key: str, default: int, low: int = 0, high: int = 2**31 - 1) -> int:
    value = params.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ServeError(f"{key} must be a whole number, got {value!r}")
    if value != int(value) or not low <= value <= high:
        raise ServeError(f"{key} must be a whole number in [{low}, {high}], got {value!r}")
    return int(value)


def _str(params: dict, key: str, default: str | None = None) -> str | None:
    value = params.get(key, default)
    if value is not None and not isinstance(value, str):
        raise ServeError(f"{key} must be text, got {type(value).__name__}")
    return value


# -- one text -----------------------------------------------------------------------------------


@view("predict")
def predict(run, params: dict, cache: dict, text: str) -> str:
    """``attnlab predict RUN TEXT --json``: {"about", "predictions": [one prediction]}, read
    off the recording the other views share wherever ``predict`` reads a recorded pass."""
    rec = recording(run, cache, text) if run.recorded_predict(text) else None
    pred = run.predict(text, rec=rec)
    return dumps({"about": run.about, "predictions": [pred]})


@view("explorer")
def explorer(run, params: dict, cache: dict, text: str) -> str:
    """The data ``attnlab explore RUN TEXT`` embeds in its page (every layer x head, the head
    view, the matrix, the Q·K neuron view, influence bars, a ViT's image, the prediction),
    and ``heads``: for each map, the label ``ablate --head`` takes for each head (null where
    the map's heads cannot be ablated one by one)."""
    from attnlab.inspect.explorer import MAX_TOKENS

    max_tokens = _int(params, "max_tokens", MAX_TOKENS, 1, 512)
    data = run.explore(text, max_tokens=max_tokens, rec=recording(run, cache, text)).data
    groups = {g.path: g for g in run.model.head_groups()} if run.model.residual else {}
    labels = {}
    for m in data["maps"]:
        g = groups.get(m["name"].rsplit(".", 1)[0])
        if g is not None:
            labels[m["name"]] = [g.label(h) for h in range(m["H"])]
        elif not run.model.residual:  # an LSTM: its one attention is the context vector
            labels[m["name"]] = ["context"] * m["H"]
    data["heads"] = labels
    return dumps(data)


@view("trace")
def trace(run, params: dict, cache: dict, text: str) -> str:
    """``attnlab trace RUN TEXT --layer L --head H --json``: one forward pass, step by step."""
    from attnlab.inspect.trace import trace as trace_

    layer, head = _int(params, "layer", 0), _int(params, "head", 0)
    rec = recording(run, cache, text)
    result = trace_(run.model, run.tokenizer, text, layer=layer, head=head, top_k=5, rec=rec)
    if params.get("trace_step") is None:
        return _json(result, run)
    result.about = result.about or run.about
    return dumps(trace_slice(trace_head(result), params, result.steps))


def trace_head(result) -> dict:
    """``result.to_dict()`` less its steps (each step's numbers are written only where sent)."""
    steps, result.steps = result.steps, []
    try:
        d = result.to_dict()
    finally:
        result.steps = steps
    return d


WINDOW_MAX = 512  # rows and columns of a step's numbers one sliced request may ask for


def trace_slice(d: dict, params: dict, objects: list | None = None) -> dict:
    """The walkthrough as the page shows it: ``trace --json``'s dict ``d`` with only step
    ``trace_step`` (0-based) whole, its ``values`` cut to the first ``trace_window`` rows and
    columns (``values_shape``: the uncut rows x columns); every other step keeps its name,
    title and shape (the page's step list), and ``step`` says which one is whole. The numbers
    kept are the CLI's, unchanged. Given the steps themselves (``objects``: the Trace's Step
    list), only the step sent whole is turned into JSON's lists: rounding every step's numbers
    took a fifth of an edit's time on the server."""
    if objects is not None:
        metas = [{"name": s.name, "title": s.title, "shape": list(s.shape)} for s in objects]
    else:
        metas = [{"name": s["name"], "title": s["title"], "shape": s["shape"]} for s in d["steps"]]
    n = len(metas)
    k = _int(params, "trace_step", 0, 0, n - 1)
    w = _int(params, "trace_window", 24, 1, WINDOW_MAX)
    steps = metas
    s = objects[k].to_dict() if objects is not None else dict(d["steps"][k])
    if s.get("values") is not None:
        v = s["values"]
        if v and isinstance(v[0], list):
            s["values_shape"] = [len(v), len(v[0])]
            s["values"] = [r[:w] for r in v[:w]]
        else:
            s["values_shape"] = [len(v)]
            s["values"] = v[:w]
    steps[k] = s
    return {**d, "steps": steps, "step": k}


@view("similarity")
def similarity(run, params: dict, cache: dict, text: str) -> str:
    """``attnlab similarity RUN TEXT --json``: cosine similarity before and after each block."""
    from attnlab.inspect.similarity import similarity as similarity_

    result = similarity_(recording(run, cache, text))
    if params.get("similarity_layer") is None:
        return _json(result, run)
    result.about = result.about or run.about
    # only the layer sent whole is turned into JSON's lists (the others: label and means)
    k = _int(params, "similarity_layer", 0, 0, max(0, len(result.layers) - 1))
    layers = result.layers
    result.layers = layers[k : k + 1]
    try:
        whole = result.to_dict()["layers"]
    finally:
        result.layers = layers
    from attnlab.inspect.similarity import mean_off_diagonal

    d = {"about": result.about, "layers": [
        {"prefix": ly.prefix, "label": ly.label, "mean_before": mean_off_diagonal(ly.before),
         "mean_after": mean_off_diagonal(ly.after), "mean_dot_before": mean_off_diagonal(ly.dot_before),
         "mean_dot_after": mean_off_diagonal(ly.dot_after)} for ly in layers]}  # fmt: skip
    return dumps(similarity_slice(d, params, whole[0] if whole else None))


def similarity_slice(d: dict, params: dict, whole: dict | None = None) -> dict:
    """The similarity panel as the page shows it: ``similarity --json``'s dict ``d`` with only
    layer ``similarity_layer`` (an index into ``layers``) whole; every other layer keeps its
    prefix, label and means (the page's layer list), and ``layer`` says which one is whole.
    The numbers kept are the CLI's, unchanged."""
    n = len(d["layers"])
    k = _int(params, "similarity_layer", 0, 0, max(0, n - 1))
    keep = ("prefix", "label", "mean_before", "mean_after", "mean_dot_before", "mean_dot_after")
    layers = [{key: ly[key] for key in keep if key in ly} for ly in d["layers"]]
    if n:
        layers[k] = whole if whole is not None else d["layers"][k]
    return {**d, "layers": layers, "layer": k}


@view("influence")
def influence(run, params: dict, cache: dict, text: str) -> str:
    """``attnlab influence RUN TEXT --json``: how far its context moved each token."""
    from attnlab.inspect.influence import influence as influence_

    return _json(influence_(run.model, recording(run, cache, text)), run)


@view("lens")
def lens(run, params: dict, cache: dict, text: str) -> str:
    """``attnlab lens RUN TEXT --json``: the logit lens, layer by layer."""
    return _json(run.lens(text), run)


def top_target(run, text: str) -> str:
    """The output the model ranks first for ``text`` (what DLA explains when no target is
    given): the first that reads back as one token."""
    s = run.subject
    p = s.prepare(text)
    logits = s.logits(p)[0, p.position]
    for i in logits.argsort(descending=True)[:50].tolist():
        name = s.decode(i)
        try:
            if s.token_id(name) == i:
                return name
        except ValueError:
            continue
    raise ServeError("no output of this model reads back as one token: give a target")


@view("dla")
def dla(run, params: dict, cache: dict, text: str) -> str:
    """``attnlab attribute RUN TEXT --method dla --target T --json`` (T: the target given, else
    the model's top prediction, named in the result)."""
    target = _str(params, "target") or top_target(run, text)
    return _json(run.attribute(text, "dla", target, foil=_str(params, "foil")), run)


@view("ablate")
def ablate(run, params: dict, cache: dict, text: str) -> str:
    """``attnlab ablate RUN TEXT --head L.H --mode zero|mean --json`` (an LSTM: --context);
    params ``ablate`` (the head's label, or "context") and ``mode``."""
    head = _str(params, "ablate")
    if not head:
        raise ServeError("say which head to ablate: click one in the grid")
    mode = _str(params, "mode", "zero")
    if mode not in ("zero", "mean"):
        raise ServeError(f"mode must be zero or mean, got {mode!r}")
    if head == "context":
        return _json(run.ablate(text, context=True, mode=mode), run)
    return _json(run.ablate(text, head, mode=mode), run)


@view("patch")
def patch(run, params: dict, cache: dict, text: str) -> str:
    """``attnlab patch RUN --clean TEXT --corrupt C --target T --by position|head --json``."""
    corrupt, target = _str(params, "corrupt"), _str(params, "target")
    by = _str(params, "by", "position")
    if not corrupt:
        raise ServeError("give a corrupt input beside the clean one")
    if by not in ("position", "head"):
        raise ServeError(f"by must be position or head, got {by!r}")
    target = target or top_target(run, text)
    return _json(run.patch(text, corrupt, target, foil=_str(params, "foil"), by=by), run)


GENERATE_MAX = 256  # new tokens one request may ask for


@view("generate")
def generate(run, params: dict, cache: dict, text: str) -> str:
    """``attnlab generate RUN --prompt TEXT --max-new-tokens N --temperature T --seed S
    --json`` ({"about", "samples": [{"prompt", "text"}]}), and ``steps``: each new token with
    its attention over the tokens before it, per map and head, from one recorded pass over
    prompt + continuation (a causal model's attention at a position is the same whether the
    later tokens exist or not); past the model's block, over its last block of tokens
    (``offset``: the tokens cut before ``tokens``)."""
    n = _int(params, "max_new_tokens", 20, 1, GENERATE_MAX)
    seed = _int(params, "seed", 0, 0, 2**32 - 1)
    temperature = params.get("temperature", 0.8)
    if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 100:
        raise ServeError(f"temperature must be a number in [0, 100], got {temperature!r}")
    out = run.generate(text, max_new_tokens=n, temperature=float(temperature), seed=seed)
    data = {"about": run.about, "samples": [{"prompt": text, "text": out}]}
    steps = []
    if run.model.causal and run.model.reads == "text" and out:
        ids = run.tokenizer.encode(text + out)
        block = max_positions(run.model) or len(ids)
        cut = max(0, len(ids) - block)  # past the block: the last block of tokens, as decoding slid
        rec = run.record(run.tokenizer.decode(ids[cut:]))
        toks = next(iter(rec.tokens.values()))
        for t in range(max(0, len(run.tokenizer.encode(text)) - cut), len(toks)):
            rows = {}
            for info in rec.maps():
                w = rec.weights(info.name)[:, t, : t + 1]  # (H, t + 1): the keys it saw
                rows[info.name] = [[round(float(x), 4) for x in h] for h in w]
            steps.append({"position": t + cut, "token": toks[t], "attention": rows})
        data["tokens"], data["offset"] = toks, cut
    data["steps"] = steps
    return dumps(data)


@view("what_if")
def what_if(run, params: dict, cache: dict, text: str) -> str:
    """``attnlab what-if RUN TEXT --layer L --head H --temperature T --pad P --json``: the
    selected head's attention as the model computes it, and with one piece changed at a time
    (no 1/sqrt(d_k), no causal mask, temperature T and 1/T, P pads without a padding mask);
    params ``layer``, ``head``, ``what_if_temperature`` (default 2), ``what_if_pad`` (2)."""
    from attnlab.inspect.what_if import DEFAULT_PAD, DEFAULT_TEMPERATURE
    from attnlab.inspect.what_if import what_if as what_if_

    layer, head = _int(params, "layer", 0), _int(params, "head", 0)
    t = params.get("what_if_temperature", DEFAULT_TEMPERATURE)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise ServeError(f"the temperature must be a number, got {t!r}")
    pad = _int(params, "what_if_pad", DEFAULT_PAD, 0, 256)
    rec = recording(run, cache, text)
    return _json(what_if_(rec, run.model, layer, head, text=text, temperature=float(t), pad=pad),
                 run)  # fmt: skip


@view("align")
def align(run, params: dict, cache: dict, text: str) -> str:
    """``attnlab align RUN TEXT [--words] --json`` for this run: the output it decodes and each
    decoder step's weights over the source (an LSTM's alignment, a Transformer's
    cross-attention, mean over heads and layers); param ``align_words`` adds up each word's
    tokens. Two columns, an LSTM beside a Transformer, are ``align LSTM TRANSFORMER TEXT``."""
    words = params.get("align_words", False)
    if not isinstance(words, bool):
        raise ServeError(f"align_words must be true or false, got {words!r}")
    return run.align(text, words=words, rec=recording(run, cache, text)).to_json(indent=None)


# -- by hand ------------------------------------------------------------------------------------


def _bool(params: dict, key: str, default: bool) -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise ServeError(f"{key} must be true or false, got {value!r}")
    return value


@view("walk")
def walk(run, params: dict, cache: dict, text: str) -> str:
    """``attnlab walk --tokens TEXT [--x X --wq W_Q --wk W_K --wv W_V] --m M --d-k D --d-v E
    --seed S [--no-scale] [--no-causal] --temperature T --pad P --json``: the words typed are
    the tokens (the notes' "I like to eat apples": 5 x 5); params ``hand_`` + ``x``, ``wq``,
    ``wk``, ``wv`` (rows typed, ";" or a new line between them; any left empty drawn at random
    as the CLI draws them), ``m``, ``d_k``, ``d_v``, ``seed`` and the switches ``scale``,
    ``causal``, ``temperature``, ``pad``, ``padding_mask`` (prefixed: generation has a seed and
    a temperature of its own). No model runs: the run is not read."""
    from attnlab.inspect.by_hand import MAX_TOKENS, MAX_WIDTH, parse_matrix, token_labels
    from attnlab.run import Run

    given = {}
    for key, name in (("x", "X"), ("wq", "W_Q"), ("wk", "W_K"), ("wv", "W_V")):
        value = (_str(params, "hand_" + key) or "").strip()
        given[key] = parse_matrix(value, name)[0] if value else None
    tokens = token_labels(text)
    if len(tokens) > MAX_TOKENS:
        raise ServeError(f"{len(tokens)} words: by hand takes at most {MAX_TOKENS}")
    temperature = params.get("hand_temperature", 1.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ServeError(f"temperature must be a number, got {temperature!r}")
    x, w_q, w_k, w_v = given["x"], given["wq"], given["wk"], given["wv"]
    # a size is read (and must be valid) only where no matrix typed gives it
    sizes = {"m": None if any(a is not None for a in (x, w_q, w_k, w_v)) else "hand_m",
             "d_k": None if w_q is not None or w_k is not None else "hand_d_k",
             "d_v": None if w_v is not None else "hand_d_v"}  # fmt: skip
    sizes = {k: _int(params, p, None, 1, MAX_WIDTH) if p else None for k, p in sizes.items()}
    result = Run.walk(tokens, x, w_q, w_k, w_v, **sizes,
                      seed=_int(params, "hand_seed", 0, 0, 2**32 - 1),
                      scale=_bool(params, "hand_scale", True),
                      causal=_bool(params, "hand_causal", True), temperature=float(temperature),
                      pad=_int(params, "hand_pad", 0, 0, MAX_TOKENS),
                      padding_mask=_bool(params, "hand_padding_mask", True))  # fmt: skip
    return result.to_json(indent=None)


# -- the run's files ----------------------------------------------------------------------------


@view("learn", needs_text=False)
def learn(run_path, params: dict, cache: dict, text: str = "") -> str:
    """What ``attnlab train`` has written so far, read without its lock: the loss rows of
    metrics.jsonl (as ``timeline`` reads them) and, where the run takes snapshots,
    ``attnlab timeline RUN --json`` (every head's scores at every snapshot) and ``maps``: the
    data ``attnlab explore RUN --steps`` embeds (``step_data``: per probe, every head's
    attention pattern at each snapshot that kept one, one byte per weight, round(255 w),
    base64), so the page shows the maps as well as the scores forming. ``run_path`` is the
    run directory (this view loads no model)."""
    from attnlab.inspect.recording import InspectError
    from attnlab.inspect.step_explorer import step_data
    from attnlab.inspect.timeline import timeline
    from attnlab.rundir import read_metrics

    metrics = _retry(lambda: read_metrics(run_path))
    loss = [{"step": r["step"], "train_loss": r["train_loss"]} for r in metrics
            if "train_loss" in r and "val_loss" not in r]  # fmt: skip
    evals = [r for r in metrics if "val_loss" in r]
    out: dict = {"loss": loss, "evals": evals, "timeline": None, "maps": None, "note": ""}
    try:
        tl = _retry(lambda: timeline(run_path))
        from attnlab.run import about_run

        tl.about = about_run(run_path)
        out["timeline"] = {"about": tl.about, **tl.to_dict()}
    except InspectError as e:
        out["note"] = " ".join(str(e).split())
        return dumps(out)
    try:
        out["maps"] = _retry(lambda: step_data(run_path))
    except InspectError as e:  # snapshots without patterns (a model with no self-attention)
        out["note"] = " ".join(str(e).split())
    return dumps(out)


def _retry(fn, tries: int = 3):
    """``fn()`` again when it met a file mid-write (a half-written last line of metrics.jsonl,
    a snapshot being renamed into place)."""
    import time

    for attempt in range(tries):
        try:
            return fn()
        except (json.JSONDecodeError, OSError, EOFError):
            if attempt == tries - 1:
                raise
            time.sleep(0.1)
