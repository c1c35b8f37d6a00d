//! `Model::from_bytes` on arbitrary bytes: never panics; whatever it accepts decodes
//! tokens without panicking either. Each input is also tried *resealed*: its header,
//! table and tokenizer checksums recomputed and loaded without the data checksums, so
//! that mutations reach the structure and config checks behind the CRCs, and the forward
//! pass of whatever passes them.
#![no_main]

use kvm_core::format::{crc32, HEADER_LEN};
use kvm_core::{Model, Session};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(model) = Model::from_bytes(data) {
        decode_some(model);
    }
    if let Some(sealed) = reseal(data) {
        if let Ok(model) = Model::from_bytes_trusted(&sealed) {
            decode_some(model);
        }
    }
});

/// Runs a short prompt and a few decode steps when the arena is small enough to allocate.
fn decode_some(model: Model<'_>) {
    let len = model.arena_len();
    if len > 1 << 24 {
        return;
    }
    let mut buf = vec![0u128; len / 16 + 4];
    // SAFETY: u128 storage viewed as bytes; any bytes are valid u8.
    let bytes = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u8, buf.len() * 16) };
    let off = bytes.as_ptr().align_offset(64);
    if let Ok(mut s) = Session::new(model, &mut bytes[off..off + len]) {
        let vocab = model.config().vocab_len;
        let prompt = [0, 1, vocab.saturating_sub(1)];
        let _ = s.prefill(&prompt);
        for t in 0..20 {
            let _ = s.decode(t % vocab.max(1));
        }
    }
}

/// `data` with the table, tokenizer and header CRCs (FORMAT.md offsets 64, 88 and 16)
/// made to match, or `None` when a section lies outside it.
fn reseal(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() < HEADER_LEN {
        return None;
    }
    let mut out = data.to_vec();
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let section = |b: &[u8], off: usize, len: usize| {
        let (o, l) = (usize::try_from(u64_at(b, off)).ok()?, usize::try_from(u64_at(b, len)).ok()?);
        b.get(o..o.checked_add(l)?).map(crc32)
    };
    let table = section(&out, 48, 56)?;
    let tokenizer = section(&out, 72, 80)?;
    out[64..68].copy_from_slice(&table.to_le_bytes());
    out[88..92].copy_from_slice(&tokenizer.to_le_bytes());
    out[16..20].fill(0);
    let header = crc32(&out[..HEADER_LEN]);
    out[16..20].copy_from_slice(&header.to_le_bytes());
    Some(out)
}
