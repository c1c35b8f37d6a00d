//! No section, however damaged, makes the tokenizer panic or misbehave: validation either
//! refuses it or the tokenizer still works (and round-trips, since merges must spell
//! their parts).

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
    kvm_export::tokenizer::build_section(&v.to_string()).unwrap()
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
        for &i in &hits {
            bad[i] = good[i];
        }
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
