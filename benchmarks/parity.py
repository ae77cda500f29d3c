"""Parity of attnlab's GPT and Encoder with Hugging Face transformers, and the MiniLM check.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/parity.py [--png docs/x.png]

For each size, a randomly initialised GPT-2 / BERT (biases and LayerNorms perturbed so that every
tensor matters) is saved by transformers, imported by attnlab, and both run the same padded batch
(float32, eager attention). Printed: the max abs difference of logits / last hidden states and of
attention weights over real (unpadded) positions, and the export round trip (attnlab -> HF dir ->
transformers -> save_pretrained -> attnlab) max abs weight difference, which should be exactly 0.
Then all-MiniLM-L6-v2: attnlab's mean-pooled sentence embeddings against transformers.AutoModel's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

from attnlab.data.batches import pad_batch  # noqa: E402
from attnlab.embeddings import sentence_embeddings  # noqa: E402
from attnlab.interop import bert, gpt2, hf  # noqa: E402
from attnlab.rundir import save_model  # noqa: E402

transformers.logging.set_verbosity_error()

GPT2_SIZES = [(1, 1, 8, 50), (2, 4, 32, 101), (4, 6, 96, 1000), (6, 12, 192, 50257)]  # L, H, C, V
BERT_SIZES = [(1, 1, 8, 40), (2, 4, 32, 97), (4, 6, 96, 1000), (6, 12, 384, 30522)]
SENTENCES = [
    "The bank of the river",
    "A man is eating food.",
    "Attention is all you need, they said.",
]


def _perturb(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln" in name.lower():
                p.add_(0.1 * torch.randn_like(p))
    return model


def _batch(vocab: int, T: int):
    ids = torch.randint(vocab, (4, T))
    lengths = torch.tensor([T, T - 3, T // 2, 2])
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    return ids, mask


def gpt2_row(size, d: Path) -> list:
    L, H, C, V = size
    cfg = transformers.GPT2Config(
        vocab_size=V, n_layer=L, n_head=H, n_embd=C, n_positions=64, attn_implementation="eager"
    )
    ref = _perturb(transformers.GPT2LMHeadModel(cfg).eval())
    ref.save_pretrained(d / "ref")
    ours = gpt2.load_gpt2(d / "ref")
    ids, mask = _batch(V, 32)
    keep = mask.bool()
    with torch.no_grad():
        out = ref(input_ids=ids, attention_mask=mask, output_attentions=True)
        logits, acts = ours(ids, attention_mask=mask, record=True)
    d_logits = (out.logits - logits)[keep].abs().max().item()
    d_attn = max(
        (out.attentions[i] - acts[f"blocks.{i}.attn.weights"])
        .permute(0, 2, 1, 3)[keep]
        .abs()
        .max()
        .item()
        for i in range(L)
    )
    save_model(d / "run", ours)
    gpt2.export_gpt2(d / "run", d / "export")
    transformers.GPT2LMHeadModel.from_pretrained(d / "export").save_pretrained(d / "export2")
    back = gpt2.load_gpt2(d / "export2")
    d_trip = max(
        (a - b).abs().max().item()
        for a, b in zip(ours.state_dict().values(), back.state_dict().values())
    )
    n = sum(p.numel() for p in ours.parameters())
    return ["GPT-2", f"L{L} H{H} C{C} V{V}", f"{n:,}", "logits", d_logits, d_attn, d_trip]


def bert_row(size, d: Path) -> list:
    L, H, C, V = size
    cfg = transformers.BertConfig(
        vocab_size=V,
        num_hidden_layers=L,
        num_attention_heads=H,
        hidden_size=C,
        intermediate_size=4 * C,
        attn_implementation="eager",
    )
    ref = _perturb(transformers.BertForMaskedLM(cfg).eval())
    ref.save_pretrained(d / "bert")
    ours = bert.load_bert(d / "bert")
    ids, mask = _batch(V, 32)
    keep = mask.bool()
    with torch.no_grad():
        out = ref(
            input_ids=ids, attention_mask=mask, output_attentions=True, output_hidden_states=True
        )
        hidden, acts = ours(ids, attention_mask=mask, record=True)
        logits = ours.mlm(hidden)
    d_hidden = (out.hidden_states[-1] - hidden)[keep].abs().max().item()
    d_logits = (out.logits - logits)[keep].abs().max().item()
    d_attn = max(
        (out.attentions[i] - acts[f"blocks.{i}.attn.weights"]).abs().max().item() for i in range(L)
    )
    n = sum(p.numel() for p in ours.parameters())
    return [
        "BERT (MLM)",
        f"L{L} H{H} C{C} V{V}",
        f"{n:,}",
        "hidden / logits",
        max(d_hidden, d_logits),
        d_attn,
        None,
    ]


def minilm_check(png: str | None) -> None:
    from attnlab.interop.minilm import minilm_dir, plot_head, real_attention, strongest_head

    path = minilm_dir()
    with tempfile.TemporaryDirectory() as tmp:
        hf.import_hf(path, Path(tmp) / "minilm")
        from attnlab.run import load_run

        model, tok = load_run(Path(tmp) / "minilm")
    ref = transformers.AutoModel.from_pretrained(str(path)).eval()
    ours = sentence_embeddings(model, tok, SENTENCES)
    ids, mask = pad_batch([tok.encode(s) for s in SENTENCES], 0)
    with torch.no_grad():
        h = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask[..., None].float()
    want = (h * m).sum(1) / m.sum(1)
    cos = F.cosine_similarity(ours, want)
    print(
        "\nall-MiniLM-L6-v2 (6 layers, 12 heads, 384 wide), mean-pooled embeddings, "
        "attnlab vs AutoModel"
    )
    print(f"{'sentence':<42}{'cosine':>12}{'max abs diff':>16}")
    for s, c, a, b in zip(SENTENCES, cos, ours, want):
        print(f"{s:<42}{c.item():>12.7f}{(a - b).abs().max().item():>16.2e}")
    tokens, w = real_attention(model=model, tokenizer=tok)
    layer, head = strongest_head(tokens, w, "bank", "river")
    print(
        f"\n'The bank of the river': 'bank' attends most to 'river' in layer {layer} head {head} "
        f"(weight {w[layer, head, 2, 5].item():.2f})"
    )
    if png:
        title = f"all-MiniLM-L6-v2, layer {layer} head {head} (real pretrained weights)"
        plot_head(tokens, w[layer, head], png, title)
        print(f"wrote {png}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--png", help="also draw the MiniLM bank/river head into this PNG")
    p.add_argument("--quick", action="store_true", help="skip the largest size")
    args = p.parse_args()
    torch.manual_seed(0)
    rows = []
    gsizes, bsizes = (GPT2_SIZES[:-1], BERT_SIZES[:-1]) if args.quick else (GPT2_SIZES, BERT_SIZES)
    with tempfile.TemporaryDirectory() as tmp:
        for i, s in enumerate(gsizes):
            rows.append(gpt2_row(s, Path(tmp) / f"g{i}"))
        for i, s in enumerate(bsizes):
            rows.append(bert_row(s, Path(tmp) / f"b{i}"))
    head = [
        "model",
        "size",
        "params",
        "compared",
        "max|Δ| output",
        "max|Δ| attention",
        "export trip",
    ]
    print(
        "attnlab vs transformers",
        transformers.__version__,
        "float32, padded batch of 4 x 32, real positions",
    )
    widths = (-12, -24, 12, -19, 14, 18, 13)
    print("".join(f"{h:{'<' if w < 0 else '>'}{abs(w)}}" for h, w in zip(head, widths)))
    for r in rows:
        trip = "-" if r[6] is None else f"{r[6]:.1e}"
        cells = [r[0], r[1], r[2], "  " + r[3], f"{r[4]:.2e}", f"{r[5]:.2e}", trip]
        print("".join(f"{c:{'<' if w < 0 else '>'}{abs(w)}}" for c, w in zip(cells, widths)))
    minilm_check(args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
