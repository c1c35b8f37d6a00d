#!/usr/bin/env python3
"""Writes a random-weight Llama GGUF that reads as many weights per token as
`kvm-export synth --preset P` does (every matrix but the embedding, plus one embedding
row, with the untied output head): llama.cpp's side of the comparisons in docs/perf.md.
Heads of 128 (no grouped queries), vocabulary 50304, untied output head, every matrix
stored as --dtype (as `llama-quantize --pure` would). Needs `pip install gguf numpy`
(llama.cpp's own GGUF writer and its reference quantizers).

    scripts/random-llama-gguf.py --preset paper-350m --dtype q4_0 -o /tmp/m/llama350-q4_0.gguf

Weights read per token, kvm's from `kvm bench`'s params (less the embedding but a row):

| preset     | kvm         | Llama                                           | Llama / kvm |
|------------|-------------|-------------------------------------------------|-------------|
| paper-120m | 124,309,392 | 123,588,096: 12 layers, d_model 768, SwiGLU 2048  | 0.9942      |
| paper-350m | 355,515,776 | 355,125,248: 24 layers, d_model 1024, SwiGLU 2752 | 0.9989      |

kvm's layers hold more than a Llama's (the value residual's gate, the merge gate, norms
and token-shift mixes); the Llama's FFN width makes up the difference, a multiple of 64
(paper-350m: 2757.3 would match exactly). `tiny` (2 layers, d_model 64, 2 heads of 32,
SwiGLU 256, 512 tokens) is not matched to anything: it is for quick checks of the scripts.
If a gguf package's quantizer lacks a type, write f32 and convert it with llama.cpp's
`llama-quantize --pure in.gguf out.gguf q4_0`.
"""

import argparse
import os
import sys

import gguf
import numpy as np

# layers, d_model, heads, SwiGLU width, vocabulary
PRESETS = {
    "paper-120m": (12, 768, 6, 2048, 50304),
    "paper-350m": (24, 1024, 8, 2752, 50304),
    "tiny": (2, 64, 2, 256, 512),
}
# Long enough for the deepest context llama-bench is asked for (its n_ctx is clamped to it).
CONTEXT = 1 << 17


def vocabulary(vocab):
    """A SentencePiece-style list: unk, bos, eos, the 256 byte tokens, then filler."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    rest = vocab - len(tokens)
    tokens += [f"t{i}" for i in range(rest)]
    types += [gguf.TokenType.NORMAL] * rest
    return tokens, [0.0] * vocab, types


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--preset", choices=list(PRESETS), default="paper-120m")
    ap.add_argument("--dtype", choices=["q4_0", "q8_0", "f16", "f32"], default="q8_0")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    layers, d_model, heads, d_ff, vocab = PRESETS[a.preset]
    qtype = getattr(gguf.GGMLQuantizationType, a.dtype.upper())
    rng = np.random.default_rng(a.seed)

    # Written beside the output and renamed over it when complete: never a partial file.
    w = gguf.GGUFWriter(a.out + ".partial", "llama")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(d_model)
    w.add_block_count(layers)
    w.add_feed_forward_length(d_ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(d_model // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    tokens, scores, types = vocabulary(vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    per_token = 0

    def matrix(name, rows, cols):
        nonlocal per_token
        per_token += cols if name == "token_embd.weight" else rows * cols
        x = rng.standard_normal((rows, cols), dtype=np.float32) / np.float32(np.sqrt(cols))
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, x)
        else:
            w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)

    def norm(name):
        nonlocal per_token
        per_token += d_model
        w.add_tensor(name, np.ones(d_model, dtype=np.float32))

    matrix("token_embd.weight", vocab, d_model)
    for i in range(layers):
        b = f"blk.{i}."
        norm(b + "attn_norm.weight")
        for m in ("attn_q", "attn_k", "attn_v", "attn_output"):
            matrix(b + m + ".weight", d_model, d_model)
        norm(b + "ffn_norm.weight")
        matrix(b + "ffn_gate.weight", d_ff, d_model)
        matrix(b + "ffn_up.weight", d_ff, d_model)
        matrix(b + "ffn_down.weight", d_model, d_ff)
    norm("output_norm.weight")
    matrix("output.weight", vocab, d_model)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(a.out + ".partial", a.out)
    print(f"wrote {a.out}: {a.preset}, {a.dtype}, {per_token:,} weights read per token", file=sys.stderr)


if __name__ == "__main__":
    main()
