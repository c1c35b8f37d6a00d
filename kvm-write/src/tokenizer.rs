//! Hugging Face `tokenizer.json` -> the kvm BPE tokenizer section
//! (layout: `kvm_core::tokenizer`).
//!
//! Takes GPT-2 style byte-level BPE: a `BPE` model without dropout, affixes, byte
//! fallback or `ignore_merges`; a `ByteLevel` pre-tokenizer with `use_regex` and without
//! `add_prefix_space`; a `ByteLevel` decoder; no normalizer; and a post-processor that adds
//! nothing. Anything else is refused with the reason, rather than exported to a section
//! that would encode differently from `tokenizers`.

use std::collections::HashMap;

use anyhow::{anyhow, bail, ensure, Context, Result};
use kvm_core::tokenizer::section::{SectionHeader, FLAG_BYTE_LEVEL, HEADER_LEN, MAX_COUNT, MERGE_LEN, NO_EOS};
use kvm_core::tokenizer::Tokenizer;
use serde_json::Value;

/// Contents of added tokens taken as end-of-text, in order of preference.
const EOS_NAMES: &[&str] = &["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>"];

/// Builds the tokenizer section from the text of a `tokenizer.json`, and checks it with
/// the core's validator. The end-of-text token is the special added token named
/// `<|endoftext|>`, `<|end_of_text|>`, `</s>`, `<eos>` or `<|eos|>` (the first of these
/// present), if any.
///
/// # Errors
/// If the JSON is malformed, the tokenizer is not GPT-2 style byte-level BPE (the message
/// names the component), or its vocabulary is inconsistent (holes in the ids, a merge
/// naming a missing token, two tokens with the same bytes).
pub fn build_section(tokenizer_json: &str) -> Result<Vec<u8>> {
    let json: Value = serde_json::from_str(tokenizer_json).context("tokenizer.json is not valid JSON")?;
    check_pipeline(&json)?;
    let model = &json["model"];
    let unmap = byte_level_decoding();

    // Vocabulary: id -> raw bytes, from the model's printable spellings.
    let vocab = model["vocab"].as_object().context("model.vocab is not an object")?;
    let mut tokens: HashMap<u32, Vec<u8>> = HashMap::with_capacity(vocab.len());
    for (spelling, id) in vocab {
        let id = as_id(id).with_context(|| format!("vocab entry {spelling:?} has no valid id"))?;
        let bytes = spelling
            .chars()
            .map(|c| unmap.get(&c).copied())
            .collect::<Option<Vec<u8>>>()
            .with_context(|| format!("vocab entry {spelling:?} is not in the byte-level alphabet"))?;
        ensure!(tokens.insert(id, bytes).is_none(), "two vocab entries have id {id}");
    }

    // Added tokens are matched and decoded as their text.
    let mut added = Vec::new();
    let mut eos = None;
    for t in json["added_tokens"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let id = as_id(&t["id"]).context("added token without a valid id")?;
        let content = t["content"].as_str().context("added token without content")?;
        for flag in ["single_word", "lstrip", "rstrip"] {
            ensure!(!t[flag].as_bool().unwrap_or(false), "added token {content:?} sets {flag}, which is not supported");
        }
        ensure!(!content.is_empty(), "added token {id} is empty");
        if let Some(bytes) = tokens.get(&id) {
            ensure!(
                bytes == content.as_bytes(),
                "added token {content:?} (id {id}) differs from the vocab entry with its id"
            );
        }
        tokens.insert(id, content.as_bytes().to_vec());
        added.push(id);
        let special = t["special"].as_bool().unwrap_or(false);
        if let Some(rank) = EOS_NAMES.iter().position(|&n| n == content).filter(|_| special) {
            if eos.is_none_or(|(r, _)| rank < r) {
                eos = Some((rank, id));
            }
        }
    }
    added.sort_unstable();
    added.dedup();

    let vocab_len = u32::try_from(tokens.len()).context("vocabulary too large")?;
    ensure!((256..MAX_COUNT).contains(&vocab_len), "vocabulary of {vocab_len} tokens is out of range");
    let mut ids_of_bytes: HashMap<&[u8], u32> = HashMap::with_capacity(tokens.len());
    let mut by_id = Vec::with_capacity(tokens.len());
    for id in 0..vocab_len {
        let bytes = tokens.get(&id).with_context(|| format!("token ids are not dense: {id} is missing"))?;
        if let Some(other) = ids_of_bytes.insert(bytes, id) {
            bail!("tokens {other} and {id} have the same bytes {bytes:?}");
        }
        by_id.push(bytes.as_slice());
    }
    let byte_ids = (0..=255u8)
        .map(|b| ids_of_bytes.get(&[b][..]).copied().with_context(|| format!("no token for byte {b:#04x}")))
        .collect::<Result<Vec<u32>>>()?;

    // Merges: rank = position in the list; a repeated pair keeps its last rank, as
    // `tokenizers` does.
    let spelled_id = |s: &str| -> Result<u32> {
        vocab.get(s).and_then(as_id).with_context(|| format!("merge names {s:?}, not in the vocab"))
    };
    let mut merges: HashMap<(u32, u32), (u32, u32)> = HashMap::new();
    let list = model["merges"].as_array().context("model.merges is not an array")?;
    for (rank, m) in list.iter().enumerate() {
        let (a, b) = match m {
            Value::String(s) => s.split_once(' ').with_context(|| format!("merge {s:?} is not \"left right\""))?,
            Value::Array(p) if p.len() == 2 => (
                p[0].as_str().context("merge part is not a string")?,
                p[1].as_str().context("merge part is not a string")?,
            ),
            other => bail!("merge {other} is neither \"left right\" nor [left, right]"),
        };
        let merged = spelled_id(&format!("{a}{b}"))?;
        merges.insert((spelled_id(a)?, spelled_id(b)?), (u32::try_from(rank)?, merged));
    }
    let mut merges: Vec<_> = merges.into_iter().collect();
    merges.sort_unstable();

    // Layout: header, u32 arrays (4-aligned as they follow 64 bytes and each other), pool.
    let mut sorted: Vec<u32> = (0..vocab_len).collect();
    sorted.sort_unstable_by_key(|&id| by_id[id as usize]);
    let bytes_len: usize = by_id.iter().map(|b| b.len()).sum();
    let n = vocab_len as usize;
    let offsets_at = HEADER_LEN;
    let sorted_at = offsets_at + 4 * (n + 1);
    let byte_ids_at = sorted_at + 4 * n;
    let merges_at = byte_ids_at + 4 * 256;
    let added_at = merges_at + MERGE_LEN * merges.len();
    let bytes_at = added_at + 4 * added.len();
    let end = bytes_at + bytes_len;
    let at = |x: usize| u32::try_from(x).context("tokenizer section exceeds 4 GiB");
    let header = SectionHeader {
        flags: FLAG_BYTE_LEVEL,
        vocab_len,
        n_merges: u32::try_from(merges.len())?,
        n_added: u32::try_from(added.len())?,
        eos: eos.map_or(NO_EOS, |(_, id)| id),
        max_token_len: at(by_id.iter().map(|b| b.len()).max().unwrap_or(0))?,
        offsets_at: at(offsets_at)?,
        sorted_at: at(sorted_at)?,
        byte_ids_at: at(byte_ids_at)?,
        merges_at: at(merges_at)?,
        added_at: at(added_at)?,
        bytes_at: at(bytes_at)?,
        bytes_len: at(bytes_len)?,
    };
    at(end)?;

    let mut out = Vec::with_capacity(end);
    out.extend_from_slice(&header.encode());
    let mut offset = 0u32;
    out.extend_from_slice(&offset.to_le_bytes());
    for b in &by_id {
        offset += b.len() as u32;
        out.extend_from_slice(&offset.to_le_bytes());
    }
    let words = sorted.iter().chain(&byte_ids);
    let merge_words = merges.iter().flat_map(|&((l, r), (rank, m))| [l, r, rank, m]);
    for w in words.copied().chain(merge_words).chain(added.iter().copied()) {
        out.extend_from_slice(&w.to_le_bytes());
    }
    for b in &by_id {
        out.extend_from_slice(b);
    }
    debug_assert_eq!(out.len(), end);
    Tokenizer::from_bytes(&out).map_err(|e| anyhow!("the section built does not validate: {e}"))?;
    Ok(out)
}

/// Refuses every pipeline component that would make `tokenizers` encode or decode
/// differently from the core.
fn check_pipeline(json: &Value) -> Result<()> {
    let kind = |v: &Value| v["type"].as_str().map(str::to_owned);
    let model = &json["model"];
    match kind(model).as_deref() {
        Some("BPE") => {}
        None if model.get("merges").is_some() => {}
        Some(other) => bail!("tokenizer model is {other}; only byte-level BPE is supported"),
        None => bail!("tokenizer.json has no model type"),
    }
    ensure!(model["dropout"].is_null(), "BPE dropout is not supported");
    for affix in ["continuing_subword_prefix", "end_of_word_suffix"] {
        let v = &model[affix];
        ensure!(v.is_null() || v.as_str() == Some(""), "BPE {affix} {v} is not supported");
    }
    for flag in ["byte_fallback", "ignore_merges"] {
        ensure!(!model[flag].as_bool().unwrap_or(false), "BPE {flag} is not supported");
    }
    ensure!(json["normalizer"].is_null(), "normalizer {} is not supported", json["normalizer"]["type"]);

    let pre = &json["pre_tokenizer"];
    ensure!(
        kind(pre).as_deref() == Some("ByteLevel"),
        "pre-tokenizer {} is not supported; only GPT-2's ByteLevel is",
        if pre.is_null() { "null".to_owned() } else { pre["type"].to_string() }
    );
    ensure!(!pre["add_prefix_space"].as_bool().unwrap_or(false), "ByteLevel add_prefix_space is not supported");
    ensure!(pre["use_regex"].as_bool().unwrap_or(true), "ByteLevel without use_regex is not supported");

    let dec = &json["decoder"];
    ensure!(kind(dec).as_deref() == Some("ByteLevel"), "decoder {} is not supported; only ByteLevel is", dec["type"]);
    let post = &json["post_processor"];
    ensure!(
        post.is_null() || kind(post).as_deref() == Some("ByteLevel"),
        "post-processor {} adds tokens, which is not supported",
        post["type"]
    );
    Ok(())
}

/// GPT-2's printable spelling of bytes, inverted: printable Latin-1 stands for itself,
/// the other 68 bytes for U+0100 onwards in byte order.
fn byte_level_decoding() -> HashMap<char, u8> {
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
            let c = if printable {
                char::from(b)
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap_or_default()
            };
            (c, b)
        })
        .collect()
}

fn as_id(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|id| u32::try_from(id).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny byte-level BPE in `tokenizer.json` form: 256 bytes, `ab`, `abc`, `<|eot|>`.
    pub(crate) fn tiny_json(patch: impl FnOnce(&mut Value)) -> String {
        let unmap = byte_level_decoding();
        let mut vocab = serde_json::Map::new();
        for (&c, &b) in &unmap {
            vocab.insert(c.to_string(), Value::from(b));
        }
        vocab.insert("ab".into(), 256.into());
        vocab.insert("abc".into(), 257.into());
        vocab.insert("<|endoftext|>".into(), 258.into());
        let mut json = serde_json::json!({
            "added_tokens": [{"id": 258, "content": "<|endoftext|>", "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": [["a", "b"], "ab c"]}
        });
        patch(&mut json);
        json.to_string()
    }

    #[test]
    fn builds_a_tiny_tokenizer() {
        let section = build_section(&tiny_json(|_| {})).unwrap();
        let t = Tokenizer::from_bytes(&section).unwrap();
        assert_eq!(t.vocab_len(), 259);
        assert_eq!(t.eos(), Some(258));
        // The tiny vocab gives byte b the id b; ' ' is spelled U+0120 in the JSON.
        assert_eq!(t.token_bytes(32), Some(&b" "[..]));
        assert_eq!(t.token_id(b"abc"), Some(257));
        let mut ids = [0u32; 16];
        let n = t.encode("abc ab<|endoftext|>", &mut ids).unwrap();
        assert_eq!(&ids[..n], &[257, 32, 256, 258]);
    }

    /// An edit that makes the tiny tokenizer unsupported.
    type Patch = fn(&mut Value);

    #[test]
    fn refuses_what_it_cannot_reproduce() {
        let cases: &[(Patch, &str)] = &[
            (|j| j["model"]["type"] = "WordPiece".into(), "WordPiece"),
            (|j| j["pre_tokenizer"]["add_prefix_space"] = true.into(), "add_prefix_space"),
            (|j| j["pre_tokenizer"] = serde_json::json!({"type": "Metaspace"}), "pre-tokenizer"),
            (|j| j["normalizer"] = serde_json::json!({"type": "NFC"}), "normalizer"),
            (|j| j["decoder"] = serde_json::json!({"type": "WordPiece"}), "decoder"),
            (|j| j["post_processor"] = serde_json::json!({"type": "TemplateProcessing"}), "post-processor"),
            (|j| j["model"]["byte_fallback"] = true.into(), "byte_fallback"),
            (|j| j["model"]["ignore_merges"] = true.into(), "ignore_merges"),
            (|j| j["model"]["dropout"] = 0.1.into(), "dropout"),
            (|j| j["added_tokens"][0]["lstrip"] = true.into(), "lstrip"),
            (|j| j["model"]["merges"] = serde_json::json!(["a q"]), "\"aq\""),
            (|j| j["model"]["vocab"]["zz"] = 999.into(), "not dense"),
            (|j| j["model"]["vocab"]["ab"] = 257.into(), "id 257"),
        ];
        for &(patch, needle) in cases {
            let err = build_section(&tiny_json(patch)).unwrap_err();
            assert!(format!("{err:#}").contains(needle), "{err:#} lacks {needle:?}");
        }
        assert!(build_section("{").is_err());
    }
}
