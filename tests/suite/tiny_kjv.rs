//! The trained byte-level checkpoint: bf16 weights converted to f32 reproduce the
//! reference's greedy continuations and its bits per byte.

use crate::common::*;
use kvm_core::quant::DType;
use kvm_core::state::Phase;
use kvm_core::{Model, Session};

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
    let greedy: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("models/tiny-kjv/reference/greedy.json")).unwrap())
            .unwrap();
    let cases = greedy.as_array().unwrap();
    assert!(cases.len() >= 2);
    for case in cases {
        let ids =
            |k: &str| -> Vec<u32> { case[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect() };
        let (prompt, want) = (ids("prompt_ids"), ids("greedy_ids"));
        let mut arena = Arena::new(model.arena_len());
        let mut session = Session::new(model, arena.bytes()).unwrap();
        // Teacher-forced: after the prompt and each reference token, the argmax is the next one.
        let mut next = argmax(session.prefill(&prompt).unwrap());
        for (i, &w) in want.iter().enumerate() {
            assert_eq!(next, w, "prompt {:?}: greedy token {i}", case["prompt"]);
            next = argmax(session.decode(w).unwrap());
        }
    }
}

#[test]
fn bits_per_byte_match_the_reference() {
    let blob = convert_to_bytes(&repo().join("models/tiny-kjv"), DType::F32);
    let model = Model::from_bytes(&blob).unwrap();
    let nll: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("models/tiny-kjv/reference/nll.json")).unwrap())
            .unwrap();
    let file = "dev_train_6k.txt";
    let text = std::fs::read(repo().join("models/tiny-kjv/reference").join(file)).unwrap();
    let mut arena = Arena::new(model.arena_len());
    let mut session = Session::new(model, arena.bytes()).unwrap();
    let mut nats = 0f64;
    for w in text.windows(2) {
        session.step(w[0] as u32, Phase::Prefill, true).unwrap();
        let z = session.logits();
        let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = z.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
        nats += lse - z[w[1] as usize] as f64;
    }
    let got = nats / (text.len() - 1) as f64;
    let want = nll[file]["nats_per_byte"].as_f64().unwrap();
    assert!((got - want).abs() < 1e-4, "nats/byte {got} vs reference {want}");
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
