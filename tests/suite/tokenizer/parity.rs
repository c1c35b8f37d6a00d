//! Encoding and decoding agree with Hugging Face `tokenizers` on every golden vector.

use kvm_core::tokenizer::{Tokenizer, WORD_SCRATCH_LEN};
use kvm_core::Error;

use super::{decode, encode, gpt2, read_json};

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn shared_vectors_encode_exactly_and_round_trip() {
    let t = gpt2();
    for v in read_json("gpt2/encode_vectors.json").as_array().unwrap() {
        let text = v["text"].as_str().unwrap();
        let ids = encode(&t, text);
        assert_eq!(ids, ids_of(&v["ids"]), "{text:?}");
        assert_eq!(decode(&t, &ids), text);
    }
}

/// The committed vectors, and those of `KVM_TOKENIZER_VECTORS` (a file that
/// `scripts/tokenizer/gen_vectors.py --count N --seed S --out PATH` wrote) if set.
#[test]
fn generated_vectors_encode_exactly_and_round_trip() {
    check_encode_vectors(&read_json("gpt2/random_vectors.json"));
    if let Some(path) = std::env::var_os("KVM_TOKENIZER_VECTORS") {
        check_encode_vectors(&serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap());
    }
}

fn check_encode_vectors(vectors: &serde_json::Value) {
    let t = gpt2();
    let encode_vectors = vectors["encode"].as_array().unwrap();
    assert!(encode_vectors.len() > 1000);
    let mut failures = Vec::new();
    for v in encode_vectors {
        let text = v["text"].as_str().unwrap();
        let ids = encode(&t, text);
        if ids != ids_of(&v["ids"]) {
            failures.push(format!("{}: {text:?}\n  got  {ids:?}\n  want {:?}", v["kind"], ids_of(&v["ids"])));
        }
        assert_eq!(decode(&t, &ids), text);
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures[..failures.len().min(10)].join("\n"));
}

#[test]
fn generated_vectors_decode_exactly() {
    let t = gpt2();
    let vectors = read_json("gpt2/random_vectors.json");
    for v in vectors["decode"].as_array().unwrap() {
        assert_eq!(decode(&t, &ids_of(&v["ids"])), v["text"].as_str().unwrap(), "{}", v["ids"]);
    }
}

#[test]
fn tricky_strings_round_trip() {
    let t = gpt2();
    let ten_kb: String = "The naïve café's 日本語 text, 12345 🚀🔥!\r\n\t  ".repeat(200);
    assert!(ten_kb.len() > 10_000);
    let cases = [
        "👨‍👩‍👧 🇫🇷 👍🏽",
        "中文字符和日本語のテキスト",
        "e\u{301}\u{302}\u{303} a\u{308}",
        "many          spaces          here          ",
        "line\r\nbreaks\r\n\r\n",
        "IT'S HE'LL WE'VE I'M YOU'D 'S 's",
        "abc123def456 7x8y9z",
        "\u{a0}\u{3000}\u{2028}\u{85} mixed white space",
        "<|endoftext|>before<|endoftext|><|endoftext|>after<|endoftext",
        &ten_kb,
    ];
    for text in cases {
        assert_eq!(decode(&t, &encode(&t, text)), text);
    }
}

#[test]
fn eos_and_lookups() {
    let t = gpt2();
    assert_eq!(t.vocab_len(), 50257);
    assert_eq!(t.eos(), Some(50256));
    assert_eq!(t.token_bytes(50256), Some(&b"<|endoftext|>"[..]));
    assert_eq!(t.token_bytes(50257), None);
    assert_eq!(t.token_id(b" the"), Some(262));
    assert_eq!(t.token_id(b"\xe6"), Some(162));
    assert_eq!(t.token_id(b"not a token!"), None);
    assert_eq!(t.max_token_len(), 128);
    for id in 0..t.vocab_len() {
        assert_eq!(t.token_id(t.token_bytes(id).unwrap()), Some(id));
    }
}

/// A buffer that holds the ids exactly is enough while pieces fit the stack scratch;
/// one id short reports the exact count.
#[test]
fn exact_buffers() {
    let t = gpt2();
    let text = "Hello world! It's 2024 <|endoftext|> 日本語";
    let ids = encode(&t, text);
    let mut out = vec![0; ids.len()];
    assert_eq!(t.encode(text, &mut out), Ok(ids.len()));
    assert_eq!(out, ids);
    assert_eq!(t.encode(text, &mut out[..ids.len() - 1]), Err(Error::BufferTooSmall { needed: ids.len() }));
    assert_eq!(t.encode(text, &mut []), Err(Error::BufferTooSmall { needed: ids.len() }));
}

/// A piece longer than the stack scratch needs its length in `out`; `needed` says so, and
/// retrying with `needed` succeeds.
#[test]
fn long_pieces_report_a_length_that_works() {
    let t = gpt2();
    for text in [
        "中".repeat(2 * WORD_SCRATCH_LEN),
        format!("a b {}", " ".repeat(3 * WORD_SCRATCH_LEN)),
        format!("x {} y {}", "7".repeat(WORD_SCRATCH_LEN + 1), "z".repeat(5 * WORD_SCRATCH_LEN)),
    ] {
        let want = encode(&t, &text);
        for len in [0, 1, want.len() - 1, want.len(), want.len() + 7] {
            let mut out = vec![0; len];
            match t.encode(&text, &mut out) {
                Ok(n) => assert_eq!(&out[..n], want),
                Err(Error::BufferTooSmall { needed }) => {
                    assert!(needed >= want.len() && needed <= text.len(), "{needed}");
                    let mut out = vec![0; needed];
                    let n = t.encode(&text, &mut out).unwrap();
                    assert_eq!(&out[..n], want);
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
}

#[test]
fn decode_into_reports_exact_length_and_range() {
    let t = gpt2();
    let ids = encode(&t, "日本語 text");
    let text = decode(&t, &ids);
    let mut out = vec![0; text.len() - 1];
    assert_eq!(t.decode_into(&ids, &mut out), Err(Error::BufferTooSmall { needed: text.len() }));
    assert_eq!(t.decode_into(&[50257], &mut [0; 8]), Err(Error::TokenOutOfRange { token: 50257, vocab_len: 50257 }));
    // A character cut off at the end is one U+FFFD, as from_utf8_lossy does.
    let mut out = [0; 8];
    let n = t.decode_into(&ids[..1], &mut out).unwrap();
    assert_eq!(std::str::from_utf8(&out[..n]).unwrap(), String::from_utf8_lossy(t.token_bytes(ids[0]).unwrap()));
}

#[test]
fn byte_level_tokenizer() {
    let t = Tokenizer::bytes(260).unwrap();
    assert_eq!(t.vocab_len(), 260);
    assert_eq!(t.eos(), None);
    assert_eq!(encode(&t, "aé"), vec![0x61, 0xc3, 0xa9]);
    assert_eq!(decode(&t, &[0x61, 0xc3, 0xa9, 257]), "aé");
    assert_eq!(t.token_bytes(257), Some(&[][..]));
    assert_eq!(t.token_bytes(260), None);
    assert_eq!(t.token_id(b"a"), Some(0x61));
    let ascii = Tokenizer::bytes(128).unwrap();
    assert_eq!(ascii.encode("é", &mut [0; 4]), Err(Error::TokenOutOfRange { token: 0xc3, vocab_len: 128 }));
    assert_eq!(t.encode("abc", &mut [0; 2]), Err(Error::BufferTooSmall { needed: 3 }));
    assert!(Tokenizer::bytes(0).is_err());
}

#[test]
fn from_section_checks_kind_and_vocab() {
    use kvm_core::format::TokenizerKind;
    let s = super::gpt2_section();
    assert!(Tokenizer::from_section(TokenizerKind::Bpe, s, 50304).is_ok());
    assert_eq!(Tokenizer::from_section(TokenizerKind::Bpe, s, 50000).unwrap_err(), Error::BadTokenizer);
    assert_eq!(Tokenizer::from_section(TokenizerKind::Bytes, s, 256).unwrap_err(), Error::BadTokenizer);
    assert_eq!(Tokenizer::from_section(TokenizerKind::Bytes, &[], 256).unwrap().vocab_len(), 256);
}
