//! No section, however damaged, makes the tokenizer panic or misbehave: validation either
//! refuses it or the tokenizer still works (and round-trips, since merges must spell
//! their parts). Loaded without validation (`from_section_trusted`), a damaged section
//! may give wrong results but still must not panic or hang.

use kvm_core::format::TokenizerKind;
use kvm_core::tokenizer::section::{SectionHeader, HEADER_LEN};
use kvm_core::tokenizer::{StreamDecoder, Tokenizer};
use kvm_core::Error;

use super::{gpt2_section, Rng};

const TEXTS: &[&str] = &["Hello world! it's 12 <|endoftext|> 日本 🚀", "  \r\n", "aaaaaaaaaaaaaaab"];

/// Exercises a tokenizer that validated: everything must work without panicking.
fn exercise(t: &Tokenizer<'_>) {
    let mut ids = [0u32; 128];
    let mut text = [0u8; 4096];
    for s in TEXTS {
        let n = t.encode(s, &mut ids).unwrap();
        let m = t.decode_into(&ids[..n], &mut text).unwrap();
        assert_eq!(&text[..m], s.as_bytes());
    }
    let mut d = StreamDecoder::new();
    for id in [0, 1, t.vocab_len() - 1, t.vocab_len()] {
        let _ = d.push(t, id, &mut text);
    }
    let _ = t.token_id(b"abc");
}

/// Runs everything on a section loaded without validation; any result but a panic will do.
fn exercise_trusted(section: &[u8]) {
    let Ok(t) = Tokenizer::from_section_trusted(TokenizerKind::Bpe, section, u32::MAX) else { return };
    let mut ids = [0u32; 512];
    let mut text = [0u8; 4096];
    for s in TEXTS {
        let n = t.encode(s, &mut ids).unwrap_or(0);
        let _ = t.decode_into(&ids[..n], &mut text);
        let _ = t.encode(s, &mut ids[..2]);
    }
    let _ = t.decode_into(&[0, 1, 2, 255, t.vocab_len() - 1], &mut text);
    let mut d = StreamDecoder::new();
    for id in [0, 1, 200, t.vocab_len() - 1] {
        let _ = d.push(&t, id, &mut text);
    }
    let _ = t.token_id(b"abc");
}

fn tiny_section() -> Vec<u8> {
    // Every byte, a few merges, an added token: small enough to corrupt byte by byte.
    let json = std::fs::read_to_string(super::data_path("gpt2/tokenizer.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let keep: Vec<serde_json::Value> = v["model"]["merges"].as_array().unwrap()[..40].to_vec();
    let merged: Vec<String> =
        keep.iter().map(|m| format!("{}{}", m[0].as_str().unwrap(), m[1].as_str().unwrap())).collect();
    let vocab = v["model"]["vocab"].as_object().unwrap().clone();
    let mut small = serde_json::Map::new();
    for (k, id) in &vocab {
        if id.as_u64().unwrap() < 256 {
            small.insert(k.clone(), id.clone());
        }
    }
    for (i, m) in merged.iter().enumerate() {
        small.insert(m.clone(), (256 + i).into());
    }
    small.insert("<|endoftext|>".into(), (256 + merged.len()).into());
    v["added_tokens"][0]["id"] = (256 + merged.len()).into();
    v["model"]["vocab"] = small.into();
    v["model"]["merges"] = keep.into();
    kvm_write::tokenizer::build_section(&v.to_string()).unwrap()
}

#[test]
fn truncations_are_refused() {
    for section in [tiny_section(), gpt2_section().to_vec()] {
        let h = SectionHeader::parse(&section).unwrap();
        let mut cuts: Vec<usize> = (0..HEADER_LEN + 64).collect();
        for at in [h.offsets_at, h.sorted_at, h.byte_ids_at, h.merges_at, h.added_at, h.bytes_at] {
            cuts.extend((at as usize).saturating_sub(3)..at as usize + 3);
        }
        cuts.extend(section.len() - 5..section.len());
        for cut in cuts {
            assert_eq!(Tokenizer::from_bytes(&section[..cut]).unwrap_err(), Error::BadTokenizer, "cut at {cut}");
            assert!(Tokenizer::from_section_trusted(TokenizerKind::Bpe, &section[..cut], u32::MAX).is_err());
        }
        exercise(&Tokenizer::from_bytes(&section).unwrap());
    }
}

/// Every byte of the tiny section set to several values.
#[test]
fn every_single_byte_corruption_is_refused_or_harmless() {
    let section = tiny_section();
    let mut accepted = 0;
    for i in 0..section.len() {
        for v in [0x00, 0x01, 0x7f, 0x80, 0xff, section[i] ^ 0x01, section[i] ^ 0x10] {
            if v == section[i] {
                continue;
            }
            let mut bad = section.clone();
            bad[i] = v;
            if let Ok(t) = Tokenizer::from_bytes(&bad) {
                accepted += 1;
                exercise(&t);
            }
            exercise_trusted(&bad);
        }
    }
    // Some changes are legitimately harmless (e.g. a merge rank or the eos id).
    assert!(accepted > 0);
}

#[test]
fn random_corruption_of_gpt2_is_refused_or_harmless() {
    let good = gpt2_section();
    let mut rng = Rng(0xC0FFEE);
    let mut bad = good.to_vec();
    for _ in 0..300 {
        let n = 1 + rng.below(8);
        let hits: Vec<usize> = (0..n).map(|_| rng.below(good.len())).collect();
        for &i in &hits {
            bad[i] = rng.next() as u8;
        }
        if let Ok(t) = Tokenizer::from_bytes(&bad) {
            exercise(&t);
        }
        exercise_trusted(&bad);
        for &i in &hits {
            bad[i] = good[i];
        }
    }
}

/// Ids with the top bit set, where the BPE scratch keeps its tag, in every table a
/// trusted load does not check.
#[test]
fn out_of_range_ids_in_a_trusted_section_are_harmless() {
    let good = tiny_section();
    let h = SectionHeader::parse(&good).unwrap();
    // (offset, whether validation must refuse the change): any rank is valid.
    let mut words: Vec<(usize, bool)> = (0..256).map(|b| (h.byte_ids_at as usize + 4 * b, true)).collect();
    words.extend((0..4 * h.n_merges as usize).map(|w| (h.merges_at as usize + 4 * w, w % 4 != 2)));
    words.extend((0..h.n_added as usize).map(|w| (h.added_at as usize + 4 * w, true)));
    for (at, refused) in words {
        let old = u32::from_le_bytes(good[at..at + 4].try_into().unwrap());
        for v in [old | 1 << 31, u32::MAX, h.vocab_len] {
            let mut bad = good.clone();
            bad[at..at + 4].copy_from_slice(&v.to_le_bytes());
            assert_eq!(Tokenizer::from_bytes(&bad).is_err(), refused && v != old, "word at {at} = {v:#x}");
            exercise_trusted(&bad);
        }
    }
    // A merge whose result reads as a tagged index of itself, applied to its own pair.
    let t = Tokenizer::from_bytes(&good).unwrap();
    for m in 0..h.n_merges as usize {
        let at = h.merges_at as usize + 16 * m;
        let word = |k: usize| u32::from_le_bytes(good[at + 4 * k..at + 4 * k + 4].try_into().unwrap());
        let pair = [t.token_bytes(word(0)).unwrap(), t.token_bytes(word(1)).unwrap()].concat();
        let mut bad = good.clone();
        bad[at + 12..at + 16].copy_from_slice(&(1u32 << 31 | m as u32).to_le_bytes());
        let bad = Tokenizer::from_section_trusted(TokenizerKind::Bpe, &bad, u32::MAX).unwrap();
        let _ = bad.encode(std::str::from_utf8(&pair).unwrap(), &mut [0; 8]);
    }
}

#[test]
fn header_fields_are_checked() {
    let good = tiny_section();
    let h = SectionHeader::parse(&good).unwrap();
    let with = |f: &dyn Fn(&mut SectionHeader)| {
        let mut h = h;
        f(&mut h);
        let mut s = good.clone();
        s[..HEADER_LEN].copy_from_slice(&h.encode());
        Tokenizer::from_bytes(&s).map(|_| ())
    };
    assert_eq!(with(&|_| {}), Ok(()));
    let bad: &[&dyn Fn(&mut SectionHeader)] = &[
        &|h| h.flags = 0,
        &|h| h.flags = 3,
        &|h| h.vocab_len += 1,
        &|h| h.vocab_len = u32::MAX,
        &|h| h.n_merges += 1,
        &|h| h.n_merges = u32::MAX,
        &|h| h.n_added = u32::MAX,
        &|h| h.eos = h.vocab_len,
        &|h| h.max_token_len += 1,
        &|h| h.offsets_at += 1,
        &|h| h.offsets_at = u32::MAX - 3,
        &|h| h.sorted_at += 4,
        &|h| h.byte_ids_at = h.sorted_at,
        &|h| h.merges_at += 16,
        &|h| h.added_at = !3,
        &|h| h.bytes_at += 1,
        &|h| h.bytes_len -= 1,
    ];
    for (i, f) in bad.iter().enumerate() {
        assert_eq!(with(f), Err(Error::BadTokenizer), "case {i}");
    }
    let mut s = good.clone();
    s[0] = b'X';
    assert!(Tokenizer::from_bytes(&s).is_err());
    let mut s = good.clone();
    s[4] = 2;
    assert!(Tokenizer::from_bytes(&s).is_err());
    let mut s = good;
    s[60] = 1;
    assert!(Tokenizer::from_bytes(&s).is_err());
}
