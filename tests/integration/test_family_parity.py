"""Parity with transformers for the decoder families attnlab imports (issue 22).

Each case builds the transformers model from a tiny random config (fixed seed, float32, eager
attention), saves it, imports the directory with attnlab, and compares: logits and every
layer's hidden states within 1e-5 (max abs), attention weights within 1e-6, on a left-padded
batch with an attention mask; then greedy decoding with the KV cache gives the same 32 tokens
as transformers' ``generate``. The shapes cover GQA groups of 1, 2 and all heads, tied and
untied embeddings, head widths other than d_model / n_head, and inputs longer than a sliding
window. No download, no network.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnlab.generation import SamplingConfig, generate_ids  # noqa: E402
from attnlab.interop.decoders import decoder_config, load_decoder  # noqa: E402
from attnlab.interop.hf import load_hf  # noqa: E402

SIZE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=64, bos_token_id=None,
            eos_token_id=None, pad_token_id=None, initializer_range=0.2)  # fmt: skip
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip

# name -> (transformers config class, its fields beyond SIZE); heads are 4 unless said
CASES = {
    "llama-gqa2-untied-llama3": ("LlamaConfig", dict(num_key_value_heads=2, rope_parameters=LLAMA3)),
    "llama-mqa-tied-biases": ("LlamaConfig", dict(num_key_value_heads=1, tie_word_embeddings=True,
                                                  attention_bias=True, mlp_bias=True)),
    "mistral-mha-window": ("MistralConfig", dict(num_key_value_heads=4, sliding_window=5)),
    "qwen2-gqa2-tied": ("Qwen2Config", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    # Qwen2's code reads no attention_bias (q/k/v biases always, o_proj none): neither may we
    "qwen2-attention-bias-ignored": ("Qwen2Config", dict(num_key_value_heads=2,
                                                         attention_bias=True, mlp_bias=True)),
    "qwen2-windowed-layer": ("Qwen2Config", dict(num_key_value_heads=1, use_sliding_window=True,
                                                 sliding_window=4, max_window_layers=1)),
    "qwen3-qknorm-headdim": ("Qwen3Config", dict(num_key_value_heads=2, head_dim=12,
                                                 rope_parameters={"rope_type": "default",
                                                                  "rope_theta": 1e6})),
    "gemma-mqa-headdim": ("GemmaConfig", dict(num_key_value_heads=1, head_dim=16)),
    "gemma2-softcap-windows": ("Gemma2Config", dict(num_key_value_heads=2, head_dim=8,
                                                    sliding_window=5, query_pre_attn_scalar=6,
                                                    attn_logit_softcapping=2.0,
                                                    final_logit_softcapping=3.0)),
    "gemma3-local-rope": ("Gemma3TextConfig", dict(
        num_hidden_layers=3, num_key_value_heads=2, head_dim=8, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        query_pre_attn_scalar=8,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                            "rope_theta": 1e4},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})),
    "pythia-parallel-partial": ("GPTNeoXConfig", dict(rotary_pct=0.25, hidden_act="gelu")),
    "neox-sequential-tied": ("GPTNeoXConfig", dict(use_parallel_residual=False,
                                                   tie_word_embeddings=True, rotary_pct=0.5,
                                                   hidden_act="gelu_new", attention_bias=False)),
}  # fmt: skip

AUTO = {"GPTNeoXConfig": "GPTNeoXForCausalLM", "Gemma3TextConfig": "Gemma3ForCausalLM"}


def _hf_model(name: str):
    cls_name, fields = CASES[name]
    cfg_cls = getattr(transformers, cls_name)
    config = cfg_cls(**{**SIZE, **fields}, attn_implementation="eager")
    model_cls = getattr(transformers, AUTO.get(cls_name, cls_name.replace("Config", "ForCausalLM")))
    torch.manual_seed(0)
    model = model_cls(config).eval()
    with torch.no_grad():  # norms start at 1 (or 0); move them so a wrong norm shows
        for n, p in model.named_parameters():
            if "norm" in n or "layernorm" in n:
                p.add_(torch.randn_like(p) * 0.2)
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    hf = _hf_model(request.param)
    d = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(d)
    return request.param, hf, load_decoder(d), d


def test_logits_hidden_states_and_attention_match_on_a_padded_batch(pair):
    name, hf, ours, _ = pair
    torch.manual_seed(1)
    ids = torch.randint(0, SIZE["vocab_size"], (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0  # row 1 is left-padded by three tokens
    with torch.no_grad():
        want = hf(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        logits, acts = ours(ids, attention_mask=mask, record=True)
    real = mask.bool()  # compare real positions (a padded query row attends to nothing)
    err = (logits - want.logits)[real].abs().max().item()
    assert err < 1e-5, f"{name}: logits differ by {err:.2e}"
    n = ours.config.n_layer
    mine = [acts["embed"]] + [acts[f"blocks.{i}.resid_post"] for i in range(n - 1)]
    mine.append(acts["ln_f"])  # transformers' last hidden state is after the final norm
    assert len(want.hidden_states) == n + 1
    for i, (a, b) in enumerate(zip(mine, want.hidden_states, strict=True)):
        err = (a - b)[real].abs().max().item()
        assert err < 1e-5, f"{name}: hidden state {i} differs by {err:.2e}"
    for i in range(n):
        a, b = acts[f"blocks.{i}.attn.weights"], want.attentions[i]  # (B, H, T, S)
        err = (a - b).permute(0, 2, 1, 3)[real].abs().max().item()
        assert err < 1e-6, f"{name}: layer {i} attention weights differ by {err:.2e}"


def test_greedy_decoding_with_the_cache_gives_transformers_tokens(pair):
    name, hf, ours, _ = pair
    torch.manual_seed(2)
    prompt = torch.randint(0, SIZE["vocab_size"], (1, 7))
    with torch.no_grad():
        want = hf.generate(prompt, max_new_tokens=32, do_sample=False, min_new_tokens=0)
    got = generate_ids(ours, prompt, SamplingConfig(32, temperature=0.0))
    assert got[0].tolist() == want[0, 7:].tolist(), name


def test_the_older_config_spelling_reads_the_same(pair):
    """Checkpoints on disk carry rope_theta / rope_scaling / rotary_pct, not rope_parameters."""
    name, _, ours, d = pair
    hf = json.loads((d / "config.json").read_text())
    params = hf.pop("rope_parameters", None) or {}
    if "full_attention" in params:  # Gemma 3: the global rope, and the local base
        glob, local = params["full_attention"], params["sliding_attention"]
        hf["rope_theta"], hf["rope_local_base_freq"] = glob["rope_theta"], local["rope_theta"]
        if glob.get("rope_type", "default") != "default":
            hf["rope_scaling"] = {k: v for k, v in glob.items() if k != "rope_theta"}
    elif params:
        key = "rotary_emb_base" if hf["model_type"] == "gpt_neox" else "rope_theta"
        hf[key] = params["rope_theta"]
        if "partial_rotary_factor" in params:
            hf["rotary_pct"] = params["partial_rotary_factor"]
        if params.get("rope_type", "default") != "default":
            hf["rope_scaling"] = {("type" if k == "rope_type" else k): v for k, v in params.items()
                                  if k not in ("rope_theta", "partial_rotary_factor")}  # fmt: skip
    assert decoder_config(hf) == ours.config, name


def test_an_import_directory_gives_a_run_with_the_same_logits(pair, tmp_path):
    name, hf, ours, d = pair
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(SIZE["vocab_size"])}
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(d / "tokenizer.json"))
    model, _, provenance = load_hf(d)
    ids = torch.randint(0, SIZE["vocab_size"], (1, 9))
    with torch.no_grad():
        assert torch.equal(model(ids), ours(ids))
    assert provenance["source"]["hf_model_type"] == hf.config.model_type
