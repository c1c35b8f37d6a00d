//! `Session::restore` on untrusted snapshots: never panics, and whatever it accepts
//! decodes without panicking. The input's first byte picks a model (the bundled one, or
//! a small hybrid stack whose sliding-window rings the prompts wrap) and a prompt; a real
//! snapshot of that session is then damaged as the rest of the input says (a run of
//! `(offset, xor)` pairs, so mutations reach the counters and the state behind the
//! length check), and the input itself is tried as a snapshot too. Each is tried as it is
//! (the CRC refuses any change) and *resealed*, its CRC made that of its bytes, so
//! mutations get past the CRC to the counters' checks.
#![no_main]

use std::sync::OnceLock;

use kvm_core::cache::{CacheDtype, SlotReads};
use kvm_core::config::Config;
use kvm_core::format::{crc32, crc32_update, TokenizerKind};
use kvm_core::quant::DType;
use kvm_core::{Model, Session};
use kvm_export::synth::{growable, paper_hybrid, tensor, Preset, SATURATE1024};
use kvm_write::policy::Policy;
use kvm_write::writer::write_model_to;
use libfuzzer_sys::fuzz_target;

static BLOB: &[u8] = include_bytes!("../../models/tiny-kjv-q8_0.kvm");

/// A model as `kvm-export synth --preset tiny --dtype q8_0 --state saturation
/// --max-context 256` makes it (layer 0 sliding-window, layer 1 KVM with the saturating
/// state), its window cut to 24 tokens so that prompts of up to 80 wrap the ring.
fn hybrid() -> &'static [u8] {
    static FILE: OnceLock<Vec<u8>> = OnceLock::new();
    FILE.get_or_init(|| {
        let cfg = paper_hybrid(growable(Preset::Tiny.config(), SATURATE1024, 256).unwrap());
        let cfg = Config { alt_window: 24, ..cfg };
        let policy = Policy::uniform(DType::Q8_0);
        let dtype_for = |role, rows, cols| policy.dtype_for(role, rows, cols);
        let source = &mut |role, layer, rows, cols| Ok(tensor(1, role, layer, rows, cols));
        let (tokenizer, sessions) = ((TokenizerKind::Bytes, &[][..]), (CacheDtype::F32, SlotReads::Stored));
        let mut out = std::io::Cursor::new(Vec::new());
        write_model_to(&mut out, &cfg, tokenizer, sessions, &dtype_for, source, &mut |_| {}).unwrap();
        out.into_inner()
    })
}

fuzz_target!(|data: &[u8]| {
    let blob = if data.first().is_some_and(|&n| n >= 0x80) { hybrid() } else { BLOB };
    let Ok(model) = Model::from_bytes_trusted(blob) else { return };
    let len = model.arena_len();
    let mut buf = vec![0u128; len / 16 + 4];
    // SAFETY: u128 storage viewed as bytes; any bytes are valid u8.
    let bytes = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u8, buf.len() * 16) };
    let off = bytes.as_ptr().align_offset(64);
    let Ok(mut s) = Session::new(model, &mut bytes[off..off + len]) else { return };
    let (prompt_len, rest) = match data.split_first() {
        Some((&n, rest)) => (usize::from(n & 0x7f) % 80 + 1, rest),
        None => (1, data),
    };
    let prompt: Vec<u32> = (0..prompt_len).map(|i| (i as u32 * 31 + 7) % 256).collect();
    let _ = s.prefill(&prompt);
    // With the prompt's logits when the prefill left them (either length restores).
    let mut snap = vec![0u8; s.snapshot_len_with_logits()];
    let written = match s.has_logits() {
        true => s.snapshot_with_logits(&mut snap),
        false => s.snapshot(&mut snap),
    };
    let Ok(n) = written else { return };
    snap.truncate(n);
    // Offsets land in the counters block half the time, anywhere the other half.
    for pair in rest.chunks_exact(4) {
        let raw = u32::from(pair[0]) << 16 | u32::from(pair[1]) << 8 | u32::from(pair[2]);
        let at = if raw & 1 == 0 { (raw as usize >> 1) % 64 } else { (raw as usize >> 1) % snap.len() };
        snap[at] ^= pair[3];
    }
    let mut again = vec![0u8; s.snapshot_len_with_logits()];
    let (sealed, rest_sealed) = (resealed(&snap), resealed(rest));
    for candidate in [&snap[..], &sealed[..], rest, &rest_sealed[..]] {
        if s.restore(candidate).is_ok() {
            for t in 0..4 {
                let _ = s.decode(t * 67 % 256);
            }
            let _ = s.snapshot_with_logits(&mut again);
        }
    }
});

/// `snap` with the CRC a snapshot keeps in its counter word 7 made that of its other
/// bytes (as it is when too short to hold one).
fn resealed(snap: &[u8]) -> Vec<u8> {
    let mut v = snap.to_vec();
    if v.len() >= 64 {
        let crc = crc32_update(crc32(&v[..28]), &v[32..]);
        v[28..32].copy_from_slice(&crc.to_le_bytes());
    }
    v
}
