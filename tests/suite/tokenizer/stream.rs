//! The streaming decoder never shows a broken character and adds up to `decode_into`.

use kvm_core::tokenizer::StreamDecoder;

use super::{decode, encode, gpt2, Rng};

#[test]
fn characters_spanning_tokens_are_held_until_complete() {
    let t = gpt2();
    // "🚀" is 3 tokens in GPT-2 (the vector in encode_vectors.json), "日" 2.
    for text in ["emoji 🚀🔥 mixed", "日本語のテキスト", "Ünïcödé café"] {
        let ids = encode(&t, text);
        let mut d = StreamDecoder::new();
        let mut shown = String::new();
        let mut buf = vec![0u8; 3 * (t.max_token_len() + 3)];
        let mut held = 0;
        for &id in &ids {
            let piece = d.push(&t, id, &mut buf).unwrap();
            if piece.is_empty() {
                held += 1;
            }
            shown.push_str(piece);
            assert!(text.starts_with(&shown), "{shown:?} is not a prefix of {text:?}");
        }
        shown.push_str(d.finish());
        assert_eq!(shown, text);
        if text.contains('🚀') || text.contains('日') {
            assert!(held > 0);
        }
    }
}

#[test]
fn random_ids_stream_like_from_utf8_lossy() {
    let t = gpt2();
    let mut rng = Rng(0x5EED);
    let mut buf = vec![0u8; 3 * (t.max_token_len() + 3)];
    for _ in 0..2000 {
        let ids: Vec<u32> = (0..rng.below(10))
            .map(|_| if rng.below(3) == 0 { rng.below(50257) as u32 } else { rng.below(256) as u32 })
            .collect();
        let mut d = StreamDecoder::new();
        let mut shown = String::new();
        for &id in &ids {
            shown.push_str(d.push(&t, id, &mut buf).unwrap());
        }
        shown.push_str(d.finish());
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| t.token_bytes(id).unwrap().to_vec()).collect();
        assert_eq!(shown, String::from_utf8_lossy(&bytes), "{ids:?}");
        assert_eq!(decode(&t, &ids), shown);
    }
}
