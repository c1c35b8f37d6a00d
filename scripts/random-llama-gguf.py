#!/usr/bin/env python3
"""Writes a random-weight Llama GGUF that reads as many weights per token as
`kvm-export synth --preset paper-120m`: 12 layers, d_model 768, 6 heads of 128 (no
grouped queries), SwiGLU FFN 2048, vocabulary 50304, untied output head, every matrix
q8_0 (or f32 / f16). It is llama.cpp's side of the long-context comparison in
docs/perf.md; it needs `pip install gguf numpy` (llama.cpp's own GGUF writer).

    scripts/random-llama-gguf.py -o /tmp/m/llama-q8_0.gguf --dtype q8_0
"""

import argparse

import gguf
import numpy as np

LAYERS, D_MODEL, HEADS, D_FF, VOCAB = 12, 768, 6, 2048, 50304
# Long enough for the deepest context llama-bench is asked for (its n_ctx is clamped to it).
CONTEXT = 1 << 17


def vocabulary():
    """A SentencePiece-style list: unk, bos, eos, the 256 byte tokens, then filler."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    rest = VOCAB - len(tokens)
    tokens += [f"t{i}" for i in range(rest)]
    types += [gguf.TokenType.NORMAL] * rest
    return tokens, [0.0] * VOCAB, types


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--dtype", choices=["q8_0", "f16", "f32"], default="q8_0")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    qtype = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "f16": gguf.GGMLQuantizationType.F16,
             "f32": gguf.GGMLQuantizationType.F32}[a.dtype]
    rng = np.random.default_rng(a.seed)

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(D_MODEL)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(D_FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_rope_dimension_count(D_MODEL // HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    tokens, scores, types = vocabulary()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def matrix(name, rows, cols):
        x = rng.standard_normal((rows, cols), dtype=np.float32) / np.float32(np.sqrt(cols))
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, x)
        else:
            w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)

    def norm(name):
        w.add_tensor(name, np.ones(D_MODEL, dtype=np.float32))

    matrix("token_embd.weight", VOCAB, D_MODEL)
    for i in range(LAYERS):
        b = f"blk.{i}."
        norm(b + "attn_norm.weight")
        for m in ("attn_q", "attn_k", "attn_v", "attn_output"):
            matrix(b + m + ".weight", D_MODEL, D_MODEL)
        norm(b + "ffn_norm.weight")
        matrix(b + "ffn_gate.weight", D_FF, D_MODEL)
        matrix(b + "ffn_up.weight", D_FF, D_MODEL)
        matrix(b + "ffn_down.weight", D_MODEL, D_FF)
    norm("output_norm.weight")
    matrix("output.weight", VOCAB, D_MODEL)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
