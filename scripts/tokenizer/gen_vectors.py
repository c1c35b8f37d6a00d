#!/usr/bin/env python3
"""Writes tests/data/tokenizers/gpt2/random_vectors.json: what Hugging Face `tokenizers`
gives for thousands of generated strings with the GPT-2 tokenizer.json beside it, for the
parity tests in tests/tokenizer/.

Deterministic (fixed seed); needs `pip install tokenizers` (0.22 and 0.23 agree) and,
for the character-class probes, `pip install unicodedata2==16.0.0`.

    python3 scripts/tokenizer/gen_vectors.py
    python3 scripts/tokenizer/gen_vectors.py --count 100000 --seed 7 --out /tmp/v.json
    KVM_TOKENIZER_VECTORS=/tmp/v.json cargo test --test suite tokenizer::parity

The first writes the committed file; the second a larger one the parity test also
checks when KVM_TOKENIZER_VECTORS names it.

Output: {"generator", "tokenizers_version", "encode": [{"kind", "text", "ids"}],
"decode": [{"ids", "text"}]}; decode texts use skip_special_tokens=False.
"""
import argparse
import json
import os
import random
import sys

import tokenizers
import unicodedata2 as ucd

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "tests", "data", "tokenizers", "gpt2")
SEED = 20240611

FRAGMENTS = [
    # ASCII words, cases, digits, punctuation, white space
    "the", "The", "THE", "hello", "World", "camelCase", "snake_case", "x", "I",
    "0", "7", "42", "2024", "3.14", "1,000", "0x1F", "1e-9",
    ".", ",", "!", "?", "...", "--", "->", "=>", "==", "(", ")", "[", "]", "{", "}", "<", ">",
    "#", "@", "$", "%", "^", "&", "*", "/", "\\", "|", "~", "`", "\"", ";", ":", "_", "+", "-",
    " ", " ", " ", "  ", "   ", "    ", "\t", "\n", "\n\n", "\r\n", "\r", "\x0b", "\x0c",
    # contractions and apostrophes
    "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D",
    "'", "''", "don't", "IT'S", "we'll", "O'Neil", "'quoted'", "’s",
    # Latin with diacritics, composed and decomposed
    "café", "naïve", "Ünïcödé", "façade", "e\u0301", "a\u0308", "n\u0303o", "\u0301", "\u0345",
    "ß", "Æ", "ŉ", "ǅ", "ﬁ",
    # other scripts
    "日本語", "の", "テキスト", "中文字符", "한국어", "Привет", "мир", "Ελληνικά", "עברית", "العربية",
    "हिन्दी", "ไทย", "ქართული", "ᚠᛇᚻ", "𐍈", "𝐀𝐁𝐂", "ℕ", "Ⅻ", "½", "²", "٣", "१२", "１２３", "〇",
    # emoji: plain, ZWJ sequences, modifiers, flags, keycaps
    "🚀", "🔥", "😀", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "1\ufe0f\u20e3", "❤️", "🫠",
    # white space and invisible characters beyond ASCII
    "\u00a0", "\u3000", "\u2028", "\u2029", "\u0085", "\u1680", "\u2009", "\u202f", "\u200b",
    "\u200d", "\ufeff", "\u00ad", "\ue000", "\U0010fffd",
    # special token, whole and broken
    "<|endoftext|>", "<|endoftext|><|endoftext|>", "<|endoftext", "endoftext|>", "<|", "|>",
    "<|endoftext|>!", " <|endoftext|> ",
]


def random_mix(rng, n):
    return "".join(rng.choice(FRAGMENTS) for _ in range(n))


def random_codepoints(rng, n):
    out = []
    for _ in range(n):
        while True:
            cp = rng.choice([rng.randrange(0x80), rng.randrange(0x800), rng.randrange(0x10000),
                             rng.randrange(0x110000)])
            if not 0xD800 <= cp <= 0xDFFF:
                break
        out.append(chr(cp))
    return "".join(out)


def class_of(cp):
    cat = ucd.category(chr(cp))
    return cat[0] if cat[0] in "LN" else ("S" if chr(cp).isspace() else "O")


def class_probes():
    """Strings around every boundary of the \\p{L} and \\p{N} classes: a character joins
    the letters, digits or punctuation beside it exactly when it shares their class."""
    assert ucd.unidata_version == "16.0.0", ucd.unidata_version
    edges = set()
    prev = class_of(0)
    for cp in range(1, 0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = class_of(cp)
        if c != prev:
            edges.update((cp - 1, cp))
        prev = c
    for cp in sorted(edges):
        if 0xD800 <= cp <= 0xDFFF or cp < 0x80:
            continue
        ch = chr(cp)
        yield f"a{ch}b 1{ch}2 !{ch}? {ch}x"


def long_strings(rng):
    yield "a" * 3000
    yield " " * 3000
    yield " " * 2999 + "x"
    yield "\n" * 1000 + "end"
    yield "1234567890" * 300
    yield "=" * 1000
    yield "ab" * 1500
    yield "日本語のテキスト" * 250
    yield "中" * 1200
    yield "🚀" * 600
    yield "\u00e9" * 2000
    yield "".join(chr(0x4E00 + rng.randrange(0x5000)) for _ in range(2000))
    yield "x" + "\u0301" * 1000
    yield random_mix(rng, 2000)
    yield random_codepoints(rng, 3000)
    yield "<|endoftext|>" * 200


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=3000, help="mixed-fragment strings")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--out", default=os.path.join(DATA, "random_vectors.json"))
    args = ap.parse_args()
    tok = tokenizers.Tokenizer.from_file(os.path.join(DATA, "tokenizer.json"))
    rng = random.Random(args.seed)
    encode = []

    def add(kind, text):
        encode.append({"kind": kind, "text": text, "ids": tok.encode(text).ids})

    for _ in range(args.count):
        add("mix", random_mix(rng, rng.randrange(1, 30)))
    for _ in range(args.count // 5):
        add("codepoints", random_codepoints(rng, rng.randrange(1, 40)))
    for text in class_probes():
        add("class", text)
    for text in long_strings(rng):
        add("long", text)

    decode = []
    vocab = tok.get_vocab_size()
    for _ in range(400):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))]
        # Mostly single-byte tokens, whose bytes are UTF-8 fragments half the time.
        ids = [rng.randrange(256) if rng.random() < 0.7 else i for i in ids]
        decode.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False)})

    out = {
        "generator": "scripts/tokenizer/gen_vectors.py",
        "tokenizers_version": tokenizers.__version__,
        "seed": args.seed,
        "encode": encode,
        "decode": decode,
    }
    path = args.out
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"{len(encode)} encode and {len(decode)} decode vectors -> {os.path.normpath(path)}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
