//! The paper's padded vocabulary: a model of 50,304 ids with GPT-2's 50,257 tokens, whose
//! padding ids carry the largest logits. They have no text: nothing samples them (the
//! core's text logits, the C API's decode step, greedy or sampled), detokenizing them
//! gives nothing and never fails, and every buffer is sized by the model's vocabulary.
//!
//! Every `unsafe` block here is one C API call made as C makes it, with pointers to live
//! locals of the sizes the call asks for (as in `capi.rs`), so they carry no comment each.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::ptr::null_mut;

use kvm_core::sampler::{scratch_len, Candidate, Sampler, SamplerConfig};
use kvm_core::{Model, Session};
use kvm_runtime::capi::kvm_status::*;
use kvm_runtime::capi::*;

use crate::common::*;

const TEXT: u32 = 50_257;

fn blob() -> &'static [u8] {
    static BLOB: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BLOB.get_or_init(padded_gpt2_model)
}

#[test]
fn the_core_never_samples_a_padding_id() {
    let model = Model::from_bytes(blob()).unwrap();
    let tok = model.tokenizer();
    assert_eq!((tok.vocab_len(), tok.text_len()), (PADDED_VOCAB, TEXT));
    // Padding decodes to nothing and does not fail; past the vocabulary is an error.
    assert_eq!(tok.token_bytes(TEXT), Some(&b""[..]));
    assert_eq!(tok.token_bytes(PADDED_VOCAB - 1), Some(&b""[..]));
    assert_eq!(tok.token_bytes(PADDED_VOCAB), None);
    let mut text = [0u8; 64];
    let ids = [464, TEXT, 2068, PADDED_VOCAB - 1];
    let n = tok.decode_into(&ids, &mut text).unwrap();
    assert_eq!(&text[..n], b"The quick");

    let mut arena = Arena::new(model.arena_len());
    let mut session = Session::new(model, arena.bytes_mut()).unwrap();
    let mut prompt = [0u32; 16];
    let n = tok.encode("The quick brown fox", &mut prompt).unwrap();
    session.prefill(&prompt[..n]).unwrap();
    // The premise: the full logits' best is padding.
    assert!(kvm_core::kernels::argmax(session.logits()).unwrap() as u32 >= TEXT);
    assert_eq!(session.text_logits().len(), TEXT as usize);
    let mut scratch = vec![Candidate::EMPTY; scratch_len(PADDED_VOCAB as usize)];
    for cfg in [SamplerConfig::greedy(), SamplerConfig::DEFAULT] {
        let mut sampler = Sampler::new(cfg, 7);
        for _ in 0..16 {
            let id = sampler.sample(session.text_logits(), &[], &mut scratch).unwrap();
            assert!(id < TEXT, "{cfg:?}: sampled the padding id {id}");
            session.decode(id).unwrap();
        }
    }
}

#[test]
fn the_c_api_never_samples_a_padding_id_and_detokenizes_it_to_nothing() {
    let mut model = Box::new(kvm_model::new());
    let blob = blob();
    assert_eq!(unsafe { kvm_model_load(blob.as_ptr(), blob.len(), 0, &mut *model) }, KVM_OK);
    let mut info = kvm_model_desc::default();
    assert_eq!(unsafe { kvm_model_info(&*model, &mut info) }, KVM_OK);
    assert_eq!((info.vocab_len, info.text_len), (PADDED_VOCAB, TEXT));

    let ids = [464u32, TEXT, PADDED_VOCAB - 1, 2068];
    let mut text = [0u8; 64];
    let mut n = 0;
    let code =
        unsafe { kvm_detokenize(&*model, ids.as_ptr(), ids.len(), text.as_mut_ptr().cast(), text.len(), &mut n) };
    assert_eq!(code, KVM_OK);
    assert_eq!(&text[..n], b"The quick");
    let past = [PADDED_VOCAB];
    let code = unsafe { kvm_detokenize(&*model, past.as_ptr(), 1, text.as_mut_ptr().cast(), text.len(), &mut n) };
    assert_eq!(code, KVM_ERR_TOKEN_OUT_OF_RANGE);

    let arena_len = unsafe { kvm_arena_size(&*model) };
    let mut arena = Arena::new(arena_len);
    let mut s = null_mut();
    let bytes = arena.bytes_mut();
    assert_eq!(unsafe { kvm_session_init(&*model, bytes.as_mut_ptr().cast(), bytes.len(), &mut s) }, KVM_OK);
    for (cfg, seed) in [(kvm_sampler_greedy(), 0), (kvm_sampler_default(), 3)] {
        assert_eq!(unsafe { kvm_session_reset(s) }, KVM_OK);
        assert_eq!(unsafe { kvm_sampler_set(s, &cfg) }, KVM_OK);
        assert_eq!(unsafe { kvm_sampler_seed(s, seed) }, KVM_OK);
        let prompt = [464u32, 2068, 7586, 21831];
        assert_eq!(unsafe { kvm_prefill(s, prompt.as_ptr(), prompt.len()) }, KVM_OK);
        let (mut logits, mut len) = (std::ptr::null(), 0);
        assert_eq!(unsafe { kvm_logits(s, &mut logits, &mut len) }, KVM_OK);
        assert_eq!(len, PADDED_VOCAB as usize, "kvm_logits gives every id's");
        for _ in 0..16 {
            let mut t = u32::MAX;
            assert_eq!(unsafe { kvm_decode_step(s, &mut t) }, KVM_OK);
            assert!(t < TEXT, "sampled the padding id {t}");
        }
    }
    assert_eq!(unsafe { kvm_session_release(s) }, KVM_OK);
}
