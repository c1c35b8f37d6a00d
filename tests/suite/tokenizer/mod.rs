//! Tokenizer tests against Hugging Face `tokenizers` (golden vectors in
//! `tests/data/tokenizers/`), round trips, streaming, and corrupted sections; below, the
//! fixtures they share: the GPT-2 section (built once) and a tiny deterministic RNG.

mod corrupt;
mod parity;
mod stream;

use std::path::PathBuf;
use std::sync::OnceLock;

use kvm_core::tokenizer::Tokenizer;
use serde_json::Value;

pub fn data_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizers").join(name)
}

pub fn read_json(name: &str) -> Value {
    let text = std::fs::read_to_string(data_path(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The GPT-2 tokenizer section, as the exporter writes it.
pub fn gpt2_section() -> &'static [u8] {
    static SECTION: OnceLock<Vec<u8>> = OnceLock::new();
    SECTION.get_or_init(|| {
        let json = std::fs::read_to_string(data_path("gpt2/tokenizer.json")).unwrap();
        kvm_write::tokenizer::build_section(&json).unwrap()
    })
}

pub fn gpt2() -> Tokenizer<'static> {
    Tokenizer::from_bytes(gpt2_section()).unwrap()
}

pub fn encode(t: &Tokenizer<'_>, text: &str) -> Vec<u32> {
    let mut ids = vec![0; text.len()];
    let n = t.encode(text, &mut ids).unwrap();
    ids.truncate(n);
    ids
}

pub fn decode(t: &Tokenizer<'_>, ids: &[u32]) -> String {
    let mut out = vec![0; ids.iter().map(|&id| 3 * t.token_bytes(id).unwrap().len()).sum()];
    let n = t.decode_into(ids, &mut out).unwrap();
    out.truncate(n);
    String::from_utf8(out).unwrap()
}

/// xorshift64*: deterministic data without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
