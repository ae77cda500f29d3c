"""The run directory's files: their names and the format version, written down once.

A run directory looks like a Hugging Face model directory, plus what training keeps:

    config.json              {"attnlab_format": 1, "model_type": "gpt", "config": {...}, ...}:
                             the model, and what the run is (task, its options, train config,
                             where imported weights came from, the final figures)
    model.safetensors        the weights (tied copies stored once)
    tokenizer.json           the tokenizer (``attnlab.tokenizers``); an encoder-decoder's
    target_tokenizer.json    target side has its own
    optimizer.safetensors    AdamW moments of the same step as model.safetensors
    trainer_state.json       step, train config, RNG states, data position, best metric so far
    metrics.jsonl, loss.png  one JSON line per log or evaluation; the loss curve
    best/                    config.json, tokenizer.json, model.safetensors of the best evaluation
    snapshots/               step-NNNNNNNN.safetensors: attention and head scores over training
    tuned_lens.safetensors   the tuned lens's probes (``attnlab lens --train-tuned``) and
    tuned_lens.json          what they were fitted on (the weights' sha256 among it)
    explorer.html            ``attnlab explore``'s page, where no --html names another
    ckpt-tmp/, ckpt-ready/   a checkpoint being written (``RunDir.save_checkpoint``)

A task may keep its data beside them (a language model's token shards in tokens/): its
``data_files``, written and read by ``attnlab.data``.
"""

FORMAT_VERSION = 1  # config.json's "attnlab_format"

CONFIG_FILE = "config.json"
MODEL_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
TARGET_TOKENIZER_FILE = "target_tokenizer.json"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "loss.png"
BEST_DIR = "best"
SNAPSHOT_DIR, SNAPSHOT_PREFIX = "snapshots", "step-"  # snapshots/step-00000250.safetensors
LENS_FILE, LENS_META = "tuned_lens.safetensors", "tuned_lens.json"
EXPLORER_FILE = "explorer.html"
STAGING, READY = "ckpt-tmp", "ckpt-ready"

CHECKPOINT_FILES = (OPTIMIZER_FILE, MODEL_FILE, STATE_FILE)  # install order: state last
# what makes a directory a run (one of these, and starting a new run there is refused)
RUN_FILES = (CONFIG_FILE, MODEL_FILE, STATE_FILE, TOKENIZER_FILE, METRICS_FILE)
