"""Hugging Face models in and out: the families' registry and the whole-directory steps
(``load_hf``, ``import_hf``, ``export_hf``), and the tokenizers both ways.

A Hugging Face model directory holds config.json, model.safetensors (or shards listed in
model.safetensors.index.json) and a tokenizer (tokenizer.json, or vocab.txt / vocab.json +
merges.txt). Reading it and the key-map machinery are ``hf_files``.

Each family attnlab reads (and perhaps writes) is one module of ``attnlab.interop`` that
registers a ``Family``: gpt2.py (GPT-2), bert.py (BERT), decoders.py (Llama, Mistral, Qwen2/3,
Gemma 1-3, GPT-NeoX), t5.py, vit.py. To add a family, add a module there that builds the
model from a config.json and the weights and registers it,
``FAMILY = register(Family(name, order, label, model_types, load, ...))``: ``import-hf`` (its
help included) and ``export-hf`` find it (``families()``), and nothing else changes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from attnlab import __version__ as ATTNLAB_VERSION
from attnlab.files import FileLock, atomic_write_json, atomic_write_text
from attnlab.interop.hf_files import (
    KeyMap,  # noqa: F401  (the families read it from here)
    apply_key_map,  # noqa: F401
    read_hf_config,
    read_hf_weights,  # noqa: F401
    weight_files,
)
from attnlab.registry import Registry
from attnlab.rundir import (
    RunError,
    is_run,
    read_json_object,  # noqa: F401  (vit reads it from here)
    save_model,
    with_weights_dtype,
)
from attnlab.safetensors_io import save_tensors
from attnlab.tokenizers import HFTokenizer, Tokenizer, TokenizerError, tokenizer_from_json

# HF activation name -> ours
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}
ATTNLAB_TOKENIZER = "attnlab_tokenizer.json"  # a char/word tokenizer kept beside an exported model


def activation(cfg: dict, key: str) -> str:
    """attnlab's name for the activation config.json names under ``key`` (gelu if none)."""
    act = cfg.get(key, "gelu")
    if act not in HF_ACTIVATIONS:
        raise RunError(
            f"config.json: activation {act!r} is not supported; "
            f"supported: {', '.join(HF_ACTIVATIONS)}"
        )
    return HF_ACTIVATIONS[act]


# ---------------------------------------------------------------------------------------------
# Families
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """A family of Hugging Face models, declared by its module of ``attnlab.interop``.

    ``label`` names it in ``import-hf``'s help, ``order`` places it there (and its
    ``model_types`` in the list of those import-hf reads). ``load(hf_dir, hf)`` builds the model
    (eval mode) from the directory and its config.json (``hf``). ``needs``: a file it cannot be
    imported without (its text or image reader). ``read_tokenizer(hf_dir, hf, model)`` ->
    (tokenizer, the file it came from), where the family reads its own (None:
    ``load_hf_tokenizer``). ``exports``: the attnlab model_types it writes, with
    ``export(run)`` -> (HF config.json, tensors, the tokenizer's max length); ``fits(model)``:
    for a family that writes only some of those runs (a Llama-shaped GPT), which; such a
    family is tried before one that writes them all."""

    name: str
    order: int
    label: str
    model_types: tuple[str, ...] = ()
    load: Callable | None = None
    needs: str | None = None
    read_tokenizer: Callable | None = None
    exports: tuple[str, ...] = ()
    export: Callable | None = None
    fits: Callable | None = None


FAMILIES = Registry("attnlab.interop")


def register(family: Family) -> Family:
    """Make ``family`` one that import-hf reads and export-hf writes (in its own module)."""
    return FAMILIES.register(family)


def families() -> dict[str, Family]:
    """Every family by name, in order (every module of attnlab.interop imported first)."""
    return FAMILIES.registered()


def loaders() -> dict[str, Family]:
    """The family that reads each Hugging Face model_type, in import-hf's order."""
    return {kind: f for f in families().values() for kind in f.model_types}


def exporter(model) -> Family | None:
    """The family that writes ``model``'s run: one that fits it, else one that takes its
    model_type whole; None when no family writes it."""
    able = [f for f in families().values() if model.model_type in f.exports]
    for f in able:
        if f.fits is not None and f.fits(model):
            return f
    return next((f for f in able if f.fits is None), None)


# ---------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------


def load_hf_tokenizer(
    hf_dir: str | Path, hf: dict | None = None
) -> tuple[Tokenizer | None, str | None]:
    """(tokenizer, the file it came from) for a HF directory; (None, None) if it has none.

    Padding and truncation saved in tokenizer.json are switched off: attnlab pads batches
    itself and reports a too-long text rather than silently cutting it.
    """
    from tokenizers import Tokenizer as HFTok
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

    hf_dir = Path(hf_dir)
    hf = hf or read_hf_config(hf_dir)
    try:
        if (hf_dir / ATTNLAB_TOKENIZER).is_file():  # an attnlab export: its own tokenizer
            text = (hf_dir / ATTNLAB_TOKENIZER).read_text(encoding="utf-8")
            return tokenizer_from_json(text), ATTNLAB_TOKENIZER
        if (hf_dir / "tokenizer.json").is_file():
            tok, source = HFTok.from_file(str(hf_dir / "tokenizer.json")), "tokenizer.json"
        elif (hf_dir / "vocab.txt").is_file():  # BERT WordPiece
            tok_cfg = _json_or_empty(hf_dir / "tokenizer_config.json")
            vocab = (hf_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
            vocab_ids = {w: i for i, w in enumerate(vocab)}
            tok = HFTok(models.WordPiece(vocab_ids, unk_token="[UNK]"))
            tok.normalizer = normalizers.BertNormalizer(
                lowercase=tok_cfg.get("do_lower_case", True)
            )
            tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            tok.decoder = decoders.WordPiece()
            tok.post_processor = processors.BertProcessing(
                ("[SEP]", vocab_ids["[SEP]"]), ("[CLS]", vocab_ids["[CLS]"])
            )
            specials = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
            tok.add_special_tokens([t for t in specials if t in vocab_ids])  # kept whole, never
            source = "vocab.txt"  # lower-cased: "the [MASK] of" has its mask token
        elif (hf_dir / "vocab.json").is_file() and (hf_dir / "merges.txt").is_file():  # GPT-2 BPE
            bpe = models.BPE.from_file(str(hf_dir / "vocab.json"), str(hf_dir / "merges.txt"))
            tok = HFTok(bpe)
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = decoders.ByteLevel()
            source = "vocab.json + merges.txt"
        else:
            return None, None
    except TokenizerError:
        raise
    except KeyError as e:
        raise RunError(f"{hf_dir}: vocab.txt has no {e.args[0]} token") from None
    except Exception as e:  # the Rust side raises its own exception type
        raise RunError(f"{hf_dir}: tokenizer could not be read ({e})") from None
    tok.no_padding()
    tok.no_truncation()
    return HFTokenizer(tok), source


def _json_or_empty(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


# ---------------------------------------------------------------------------------------------
# Whole directories
# ---------------------------------------------------------------------------------------------


def load_hf(hf_dir: str | Path):
    """(model, tokenizer, provenance) for a HF directory of a model type a family reads
    (``loaders()``), in eval mode."""
    hf_dir = Path(hf_dir)
    hf = read_hf_config(hf_dir)
    files = weight_files(hf_dir)  # refuses a directory of pickles before anything else
    kind, known = hf.get("model_type"), loaders()
    if kind not in known:
        raise RunError(
            f"{hf_dir}: model_type {kind!r} is not supported; attnlab imports {', '.join(known)}"
        )
    family = known[kind]
    need = family.needs
    if need and not (hf_dir / need).is_file():
        raise RunError(f"{hf_dir}: no {need}, which a {kind} model needs to read its input")
    model = family.load(hf_dir, hf)
    if family.read_tokenizer is not None:
        tokenizer, tok_source = family.read_tokenizer(hf_dir, hf, model)
    else:
        tokenizer, tok_source = load_hf_tokenizer(hf_dir, hf)
    vocab = model.probe_vocab_size  # the token ids it reads (None: images)
    if tokenizer is not None and vocab is not None and tokenizer.vocab_size > vocab:
        raise RunError(
            f"{hf_dir}: the tokenizer has {tokenizer.vocab_size} tokens but the model only {vocab}"
        )
    digest = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):  # noqa: B023
                digest.update(chunk)
    source = {
        "format": "huggingface",
        "path": str(hf_dir.resolve()),
        "hf_model_type": kind,
        "architectures": hf.get("architectures"),
        "name_or_path": hf.get("_name_or_path"),
        "transformers_version": hf.get("transformers_version"),
        "weights": [f.name for f in files],
        "weights_sha256": digest.hexdigest(),
        "tokenizer": tok_source,
        "imported_by": f"attnlab {ATTNLAB_VERSION}",
    }
    if "attnlab" in hf:
        source["attnlab"] = hf["attnlab"]
    provenance = {"source": source}
    pooling = _sentence_transformers_pooling(hf_dir)
    if pooling:
        provenance["sentence_embedding"] = pooling
    return model, tokenizer, provenance


def _sentence_transformers_pooling(hf_dir: Path) -> dict | None:
    """{"pool": "mean"|"cls", "normalize": bool} from a sentence-transformers layout."""
    modules = _json_or_list(hf_dir / "modules.json")
    pool_cfg = _json_or_empty(hf_dir / "1_Pooling" / "config.json")
    if not modules and not pool_cfg:
        return None
    pool = "cls" if pool_cfg.get("pooling_mode_cls_token") else "mean"
    normalize = any(
        str(m.get("type", "")).endswith("Normalize") for m in modules if isinstance(m, dict)
    )
    return {"pool": pool, "normalize": normalize}


def _json_or_list(path: Path) -> list:
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    except (json.JSONDecodeError, UnicodeDecodeError):
        return []
    return data if isinstance(data, list) else []


def _fresh_output_dir(out_dir: str | Path, verb: str) -> Path:
    """``out_dir`` as a Path, refused when it is a file or already holds an attnlab run."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise RunError(f"{out_dir}: exists and is not a directory")
    if is_run(out_dir):
        raise RunError(
            f"{out_dir}: is an attnlab run directory; {verb} will not overwrite it "
            "(give another directory)"
        )
    return out_dir


def import_hf(hf_dir: str | Path, out_dir: str | Path, dtype: str = "auto") -> Path:
    """Convert a Hugging Face directory into an attnlab run directory. ``dtype`` "auto" keeps
    the weights as the loader gives them (a decoder's bfloat16 weights stay bfloat16: the run is
    the file's size); "float32" computes in float32 whatever the file holds."""
    if dtype not in ("auto", "float32"):
        raise RunError(f"dtype {dtype!r}: choose auto or float32")
    model, tokenizer, provenance = load_hf(hf_dir)
    if dtype == "float32":
        with_weights_dtype(model, "float32")
    with FileLock(out_dir) as lock:  # a train writing out_dir refuses this, and this a train
        out_dir = _fresh_output_dir(out_dir, "import-hf")
        out_dir.mkdir(parents=True, exist_ok=True)
        lock.take()  # a directory made just now: locked before its first file
        save_model(out_dir, model, tokenizer, extra=provenance)
    return out_dir


# ---------------------------------------------------------------------------------------------
# Export: weights, config and a tokenizer that transformers' Auto classes load
# ---------------------------------------------------------------------------------------------

# attnlab's word split (tokenizers.WORD_RE: r"\w+|[^\w\s]") in Oniguruma's words: Python's \w
# is a letter, a number or "_"; its \s includes the ASCII separators \x1c-\x1f.
HF_WORD_PATTERN = r"[\p{L}\p{N}_]+|[^\p{L}\p{N}_\s\x{1c}-\x{1f}]"


def hf_tokenizer(tokenizer: Tokenizer):
    """The run's tokenizer as a Hugging Face ``tokenizers.Tokenizer`` giving the same ids for
    any text. BPE and WordPiece runs already are one. A char run becomes a WordLevel model over
    single characters, a word run a WordLevel model over attnlab's word split. A character (or
    word) the vocabulary lacks: where attnlab has ``<unk>`` both give its id; where it has none
    (a language model's char tokenizer) both refuse the text (attnlab: TokenizerError naming
    the characters; transformers: an exception from the WordLevel model)."""
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTok

    from attnlab.tokenizers import BOS_TOKEN, UNK, CharTokenizer, WordTokenizer, put_bos_first

    if isinstance(tokenizer, HFTokenizer):
        return HFTok.from_str(tokenizer.to_json())
    if isinstance(tokenizer, CharTokenizer):
        vocab = dict(tokenizer.stoi)
        if tokenizer.bos_id is not None:  # train --bos: <bos> after the characters, put first
            vocab[BOS_TOKEN] = tokenizer.bos_id
        tok = HFTok(models.WordLevel(vocab, unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()  # characters join with nothing between them
        if tokenizer.bos_id is not None:
            tok.add_special_tokens([BOS_TOKEN])
            put_bos_first(tok, tokenizer.bos_id)
    elif isinstance(tokenizer, WordTokenizer):
        tok = HFTok(models.WordLevel(dict(tokenizer.stoi), unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.Split(
            Regex(HF_WORD_PATTERN), behavior="removed", invert=True
        )  # keep the words and marks, drop what is between them (whitespace)
    else:
        raise RunError(
            f"a {type(tokenizer).__name__} cannot be written as a Hugging Face tokenizer"
        )
    if UNK in tokenizer.stoi:
        tok.add_special_tokens([UNK])
    return tok


def tokenizer_files(tokenizer: Tokenizer, max_length: int) -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json (file -> text) for
    ``AutoTokenizer.from_pretrained``: a PreTrainedTokenizerFast over ``hf_tokenizer``, with the
    run's special tokens named (BERT's [CLS] [SEP] [MASK] [PAD] [UNK]; <unk>; <|endoftext|>)."""
    tok = hf_tokenizer(tokenizer)
    vocab = tok.get_vocab()
    roles = {"cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]",
             "pad_token": "[PAD]", "unk_token": "[UNK]"}  # fmt: skip
    special = {role: t for role, t in roles.items() if t in vocab}
    if "<unk>" in vocab and "unk_token" not in special:
        special["unk_token"] = "<unk>"
    if "<|endoftext|>" in vocab:
        special.update(bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    if tokenizer.bos_id is not None:  # train --bos: the token every text starts with
        special["bos_token"] = tok.id_to_token(tokenizer.bos_id)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,  # decode gives back what the decoder joins
        **special,
    }
    return {
        "tokenizer.json": tok.to_str(),
        "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False),
        "special_tokens_map.json": json.dumps(special, indent=2, ensure_ascii=False),
    }


def export_hf(run_dir: str | Path, out_dir: str | Path, only: str | None = None) -> Path:
    """Write a GPT run as GPT-2 (``GPT2LMHeadModel``), or as Llama / Qwen2 / Qwen3 where it has
    their pieces, and an encoder run as BERT
    (``BertForMaskedLM``, ``BertForSequenceClassification`` or ``BertModel``), with a tokenizer
    ``AutoTokenizer.from_pretrained`` loads (``tokenizer_files``), in a directory transformers
    opens with ``from_pretrained``. A char or word tokenizer is also kept as attnlab's own
    (attnlab_tokenizer.json), so ``import-hf`` brings the run back exactly."""
    from attnlab.run import load_run
    from attnlab.tokenizers import PairTokenizer

    run = load_run(run_dir)
    model, tokenizer = run
    # a Hugging Face architecture is its family's format, chosen by the model_type config.json
    # names (Family.exports); the models declare nothing about Hugging Face
    if only is not None and model.model_type != only:  # export_gpt2: GPT-2 directories only
        raise RunError(
            f"{run_dir}: export-hf writes GPT-2 directories from GPT runs; this run "
            f"holds a model of type {model.model_type!r}"
        )
    family = exporter(model)
    if family is None:
        raise RunError(
            f"{run_dir}: export-hf writes GPT runs (as GPT-2) and encoder runs (as BERT); this "
            f"run holds a model of type {model.model_type!r}, which attnlab cannot write as a "
            "Hugging Face architecture"
        )
    hf, tensors, max_length = family.export(run)
    if tokenizer is not None and (
        isinstance(tokenizer, PairTokenizer) or not hasattr(tokenizer, "encode")
    ):
        raise RunError(f"{run_dir}: its tokenizer cannot be written for Hugging Face")
    files = tokenizer_files(tokenizer, max_length) if tokenizer is not None else {}
    hf["attnlab"] = {
        "exported_from": str(Path(run_dir).resolve()),
        "attnlab_version": ATTNLAB_VERSION,
        "model_type": model.model_type,
        "config": model.config.to_dict(),
    }
    out_dir = _fresh_output_dir(out_dir, "export-hf")
    out_dir.mkdir(parents=True, exist_ok=True)
    save_tensors(out_dir / "model.safetensors", tensors, metadata={"format": "pt"})
    for name, text in files.items():
        atomic_write_text(out_dir / name, text)
    if tokenizer is not None and not isinstance(tokenizer, HFTokenizer):
        atomic_write_text(out_dir / ATTNLAB_TOKENIZER, tokenizer.to_json())
    atomic_write_json(out_dir / "config.json", hf)  # last: a directory with config.json is complete
    return out_dir
