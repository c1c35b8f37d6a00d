//! The trained byte-level checkpoint: bf16 weights converted to f32 reproduce the
//! reference's greedy continuations and its bits per byte; quantized weights (row-major or
//! interleaved) and the compact attention caches stay within the accuracy bars.

use crate::common::*;
use kvm_core::cache::CacheDtype;
use kvm_core::format::Role;
use kvm_core::quant::DType;
use kvm_core::state::Phase;
use kvm_core::{Model, Session};
use kvm_write::policy::Policy;

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn greedy_continuations_match_the_reference() {
    let blob = convert_to_bytes(&repo().join("models/tiny-kjv"), DType::F32);
    let model = Model::from_bytes(&blob).unwrap();
    let greedy = reference_json("greedy.json");
    let cases = greedy.as_array().unwrap();
    assert!(cases.len() >= 2);
    for case in cases {
        let ids =
            |k: &str| -> Vec<u32> { case[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect() };
        let (prompt, want) = (ids("prompt_ids"), ids("greedy_ids"));
        let mut arena = Arena::new(model.arena_len());
        let mut session = Session::new(model, arena.bytes_mut()).unwrap();
        // Teacher-forced: after the prompt and each reference token, the argmax is the next one.
        let mut next = argmax(session.prefill(&prompt).unwrap());
        for (i, &w) in want.iter().enumerate() {
            assert_eq!(next, w, "prompt {:?}: greedy token {i}", case["prompt"]);
            next = argmax(session.decode(w).unwrap());
        }
    }
}

/// Nats per byte of `text` (byte tokens), every byte after the first predicted from all
/// before it with the session's own state.
pub(crate) fn nats_per_byte(model: Model<'_>, text: &[u8]) -> f64 {
    let mut arena = Arena::new(model.arena_len());
    let mut session = Session::new(model, arena.bytes_mut()).unwrap();
    let mut nats = 0f64;
    for w in text.windows(2) {
        session.step(w[0] as u32, Phase::Prefill, true).unwrap();
        let z = session.logits();
        let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = z.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
        nats += lse - z[w[1] as usize] as f64;
    }
    nats / (text.len() - 1) as f64
}

/// A file of the checkpoint's reference outputs.
fn reference_file(file: &str) -> std::path::PathBuf {
    repo().join("models/tiny-kjv/reference").join(file)
}

fn dev_text(file: &str) -> Vec<u8> {
    std::fs::read(reference_file(file)).unwrap()
}

fn reference_json(file: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(reference_file(file)).unwrap()).unwrap()
}

#[test]
fn bits_per_byte_match_the_reference() {
    let blob = convert_to_bytes(&repo().join("models/tiny-kjv"), DType::F32);
    let model = Model::from_bytes(&blob).unwrap();
    let nll = reference_json("nll.json");
    let file = "dev_train_6k.txt";
    let got = nats_per_byte(model, &dev_text(file));
    let want = nll[file]["nats_per_byte"].as_f64().unwrap();
    assert!((got - want).abs() < 1e-4, "nats/byte {got} vs reference {want}");
}

/// The accuracy bars, on text the model was trained on and text it was not: bits per byte
/// of q8_0 weights within 1.005x f32's, of q4_0 (the default policy) within 1.06x, of the
/// f16 attention cache within 1.001x the f32 cache's and of the q8 cache within 1.005x
/// (same q8_0 weights).
#[test]
fn quantized_weights_and_the_compact_caches_meet_the_accuracy_bars() {
    let dir = repo().join("models/tiny-kjv");
    let blobs = [DType::F32, DType::Q8_0, DType::Q4_0].map(|d| convert_to_bytes(&dir, d));
    let [f32m, q8, q4] = [0, 1, 2].map(|i| Model::from_bytes(&blobs[i]).unwrap());
    let q8_f16 = q8.with_cache(CacheDtype::F16).unwrap();
    let q8_q8 = q8.with_cache(CacheDtype::Q8).unwrap();
    for file in ["dev_train_6k.txt", "dev_unseen_12k.txt"] {
        let text = dev_text(file);
        let base = nats_per_byte(f32m, &text);
        let q8_base = nats_per_byte(q8, &text);
        let q8_ratio = q8_base / base;
        let q4_ratio = nats_per_byte(q4, &text) / base;
        let f16_cache = nats_per_byte(q8_f16, &text) / q8_base;
        let q8_cache = nats_per_byte(q8_q8, &text) / q8_base;
        eprintln!(
            "{file}: q8_0 {q8_ratio:.5}x f32, q4_0 {q4_ratio:.5}x, f16 cache {f16_cache:.6}x f32 cache, q8 cache \
             {q8_cache:.6}x"
        );
        assert!(q8_ratio <= 1.005, "{file}: q8_0 bits per byte {q8_ratio}x f32");
        assert!(q4_ratio <= 1.06, "{file}: q4_0 bits per byte {q4_ratio}x f32");
        assert!(f16_cache <= 1.001, "{file}: f16 cache bits per byte {f16_cache}x f32 cache");
        assert!(q8_cache <= 1.005, "{file}: q8 cache bits per byte {q8_cache}x f32 cache");
    }
}

/// q4_0 and q8_0 matrices interleaved for the SIMD kernels (the default) give the
/// row-major layout's logits bit for bit, token after token.
#[test]
fn repacked_matrices_decode_as_row_major_ones() {
    let dir = repo().join("models/tiny-kjv");
    let text = dev_text("dev_unseen_12k.txt");
    let prompt: Vec<u32> = text[..200].iter().map(|&c| c as u32).collect();
    let bits = |z: &[f32]| z.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for (dtype, x16) in [(DType::Q4_0, DType::Q4_0x16), (DType::Q8_0, DType::Q8_0x16)] {
        let repacked = convert_with(&dir, &Policy::uniform(dtype));
        let plain = convert_with(&dir, &Policy { repack: false, ..Policy::uniform(dtype) });
        let [a, b] = [&repacked, &plain].map(|blob| Model::from_bytes(blob).unwrap());
        assert_eq!(a.matrix(Role::Wq, 0).dtype, x16);
        assert_eq!(b.matrix(Role::Wq, 0).dtype, dtype);
        let (mut arena_a, mut arena_b) = (Arena::new(a.arena_len()), Arena::new(b.arena_len()));
        let mut sa = Session::new(a, arena_a.bytes_mut()).unwrap();
        let mut sb = Session::new(b, arena_b.bytes_mut()).unwrap();
        assert_eq!(bits(sa.prefill(&prompt).unwrap()), bits(sb.prefill(&prompt).unwrap()), "{dtype:?} prefill");
        for (i, &c) in text[200..400].iter().enumerate() {
            assert_eq!(bits(sa.decode(c as u32).unwrap()), bits(sb.decode(c as u32).unwrap()), "{dtype:?} token {i}");
        }
    }
}

#[test]
fn the_bundled_model_is_what_its_rebuild_command_writes() {
    // scripts/build-bundled-model.sh: `convert models/tiny-kjv --dtype q8_0`.
    let fresh = convert_to_bytes(&repo().join("models/tiny-kjv"), DType::Q8_0);
    let shipped = std::fs::read(repo().join("models/tiny-kjv-q8_0.kvm")).unwrap();
    assert!(fresh == shipped, "models/tiny-kjv-q8_0.kvm is stale: run scripts/build-bundled-model.sh");
    let model = Model::from_bytes(&shipped).unwrap();
    assert_eq!(model.header().arena_len as usize, model.arena_len(), "the file states this build's arena size");
}
