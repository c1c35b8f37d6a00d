//! Sessions under Miri, which checks the arena's unsafe views (one byte buffer cut into
//! state, window, carries and scratch) for undefined behaviour: out-of-bounds or
//! misaligned access, aliasing, use of uninitialised memory. Too slow for a plain test
//! run (a token of the smallest golden model takes about a minute under Miri), so it is
//! ignored there; `scripts/miri.sh` writes the models and runs it.

use kvm_core::cache::CacheDtype;
use kvm_core::state::Phase;
use kvm_core::{Model, Session};
use kvm_runtime::arena::Arena;
use kvm_runtime::pool::Pool;

/// A model file written by `scripts/miri.sh`.
fn model_file(name: &str) -> Vec<u8> {
    let dir = std::env::var("KVM_MIRI_MODELS").expect("KVM_MIRI_MODELS: run scripts/miri.sh");
    std::fs::read(format!("{dir}/{name}.kvm")).unwrap()
}

/// Prefill of `prompt_len` tokens, a snapshot, a step, the snapshot restored and the same
/// step again (the same logits), then one more step.
fn run(blob: &[u8], cache: CacheDtype, prompt_len: u32) {
    let model = Model::from_bytes_trusted(blob).unwrap().with_cache(cache).unwrap();
    let vocab = model.config().vocab_len;
    let mut arena = Arena::new(model.arena_len());
    let mut session = Session::new(model, arena.bytes_mut()).unwrap();
    let prompt: Vec<u32> = (0..prompt_len).map(|i| i * 7 % vocab).collect();
    session.prefill(&prompt).unwrap();
    let mut snap = vec![0u8; session.snapshot_len()];
    session.snapshot(&mut snap).unwrap();
    let first = session.decode(5).unwrap().to_vec();
    session.restore(&snap).unwrap();
    assert_eq!(session.decode(5).unwrap(), &first[..]);
    session.decode(1).unwrap();
}

#[test]
#[ignore = "run under Miri by scripts/miri.sh"]
fn every_dtype_and_cache() {
    for (dtype, cache) in [
        ("f32", CacheDtype::F32),
        ("f32p", CacheDtype::F32),
        ("f16", CacheDtype::F32),
        ("q8_0", CacheDtype::F16),
        ("q4_0", CacheDtype::Q8),
    ] {
        run(&model_file(&format!("fixed_basic-{dtype}")), cache, 2);
    }
}

#[test]
#[ignore = "run under Miri by scripts/miri.sh"]
fn a_prompt_that_folds() {
    // fixed_basic: chunk 8, window 16; token 24 folds the second chunk into the state.
    run(&model_file("fixed_basic-q8_0"), CacheDtype::F32, 26);
}

#[test]
#[ignore = "run under Miri by scripts/miri.sh"]
fn a_batch_on_two_threads() {
    // Batches of a prompt that folds on a two-thread pool, whose heads' jobs update and
    // read their own rows of the state in parallel: the same logits as single steps.
    let blob = model_file("fixed_basic-q8_0");
    let model = Model::from_bytes_trusted(&blob).unwrap().with_cache(CacheDtype::F16).unwrap();
    let prompt: Vec<u32> = (0..26).map(|i| i * 7 % model.config().vocab_len).collect();
    let (mut a, mut b) = (Arena::new(model.arena_len()), Arena::new(model.arena_len()));
    let mut steps = Session::new(model, a.bytes_mut()).unwrap();
    let want = steps.prefill(&prompt).unwrap().to_vec();
    let mut batches = Session::new(model, b.bytes_mut()).unwrap();
    kvm_runtime::prefill::prefill(&mut batches, &prompt, Phase::Prefill, &Pool::new(2).unwrap()).unwrap();
    assert_eq!(batches.logits(), &want[..]);
}
