//! The paper's own configurations (`tests/data/paper/<case>`): checkpoints built from the
//! reference's `configs/prolong/{120M,350M}/*.yaml` at small width (chunk 256, window
//! 512, the budgets, gates and scales as trained), bf16 weights saved as released, and the
//! reference's logits over a prompt that runs past the first fold (token 769). Each
//! converts as its config stands (growable states with room for the default context)
//! and matches at f32, prefill then decode, in single steps and in chunked batches; its
//! q8_0 export runs.

use std::path::{Path, PathBuf};

use kvm_core::exec::Serial;
use kvm_core::forward::Logits;
use kvm_core::quant::DType;
use kvm_core::state::Phase;
use kvm_core::{Model, Session};
use safetensors::tensor::TensorView;
use safetensors::SafeTensors;

use crate::common::*;

const TOL: f32 = 1e-3;

/// Every case under `tests/data/paper`.
fn cases() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo().join("tests/data/paper"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("golden.safetensors").exists())
        .collect();
    v.sort();
    v
}

/// Every token's logits (`[ids.len() * vocab_len]`): the first `prompt` in batches of
/// `batch`, the rest one token at a time.
fn logits(model: Model<'_>, ids: &[u32], prompt: usize, batch: usize) -> Vec<f32> {
    let mut arena = Arena::new(model.arena_len());
    let mut session = Session::new(model, arena.bytes_mut()).unwrap();
    let vocab = model.config().vocab_len as usize;
    let mut out = vec![0f32; ids.len() * vocab];
    let mut acts = vec![0f32; session.layout().acts_len(batch).unwrap()];
    for (chunk, out) in ids[..prompt].chunks(batch).zip(out.chunks_mut(batch * vocab)) {
        let out = &mut out[..chunk.len() * vocab];
        session.step_batch(chunk, Phase::Prefill, &mut acts, &Serial, Logits::All(out)).unwrap();
    }
    for (t, &id) in ids.iter().enumerate().skip(prompt) {
        out[t * vocab..(t + 1) * vocab].copy_from_slice(session.decode(id).unwrap());
    }
    out
}

/// `(input_ids, prompt_len, logits_prefill ++ logits_decode)` of a case.
fn golden(dir: &Path) -> (Vec<u32>, usize, Vec<f32>) {
    let g = read_safetensors(&dir.join("golden.safetensors"));
    let ids = g["input_ids"].i32.iter().map(|&i| i as u32).collect();
    let want = g["logits_prefill"].f32.iter().chain(&g["logits_decode"].f32).copied().collect();
    (ids, g["prompt_len"].i32[0] as usize, want)
}

#[test]
fn every_paper_config_matches_the_reference() {
    let cases = cases();
    assert!(!cases.is_empty(), "no cases under tests/data/paper");
    for dir in cases {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let (ids, prompt, want) = golden(&dir);
        assert!(ids.len() > 769, "{name}: the prompt must run past the first fold");
        let blob = convert_to_bytes(&dir, DType::F32);
        let model = Model::from_bytes(&blob).unwrap();
        // The chunk length of the paper (256) as the prefill batch, and a batch that
        // straddles its chunks.
        for batch in [256, 100] {
            let got = logits(model, &ids, prompt, batch);
            let err = max_abs_diff(&got, &want);
            eprintln!("{name}: batches of {batch}: max abs logit error {err:.2e}");
            assert!(err <= TOL, "{name}: batches of {batch}: max abs logit error {err}");
        }
        let q8 = convert_to_bytes(&dir, DType::Q8_0);
        let q8 = Model::from_bytes(&q8).unwrap();
        let got = logits(q8, &ids, prompt, 256);
        assert!(got.iter().all(|z| z.is_finite()), "{name}: q8_0 logits not finite");
    }
}

/// `dir`'s checkpoint without the tensors whose names contain `drop`, in a fresh
/// directory, its `config.json` patched.
fn without(dir: &Path, what: &str, drop: &str, patch: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let to = checkpoint_copy(dir, what, patch);
    let bytes = std::fs::read(to.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, TensorView<'_>)> = st.tensors().into_iter().filter(|(n, _)| !n.contains(drop)).collect();
    let out = safetensors::serialize(kept, None).unwrap();
    std::fs::write(to.join("model.safetensors"), out).unwrap();
    to
}

/// The paper's `ablation_kvm_no_merge_gate` (both merge gates off, head temperatures and
/// value lengths on) in its released bf16 layout, stored as f32: its layers have no
/// `key_weighting`, whose lookup once read tensor data as a table entry (an index past
/// the file). It runs, and computes what the same weights compute with a merge gate of
/// one everywhere (`key_weighting` 0: `1 + elu(0)`).
#[test]
fn the_no_merge_gate_ablation_runs_at_f32() {
    let base = repo().join("tests/data/paper/paper_120M_kvm_sqrt16_wd");
    let fixed = |c: &mut serde_json::Value| {
        c["state_budget_mode"] = "fixed".into();
        c["n_max_d_chunks"] = 1.into();
        c["state_growth_factor"] = 1.0.into();
    };
    let ablation = without(&base, "no-merge-gate", "key_weighting", |c| {
        fixed(c);
        c["kvm_use_merge_gate_keys"] = 0.into();
        c["kvm_use_merge_gate_values"] = 0.into();
    });
    let gate_of_one = checkpoint_copy(&base, "gate-of-one", fixed);
    {
        let bytes = std::fs::read(gate_of_one.join("model.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let zeros: Vec<(String, Vec<u8>, Vec<usize>, safetensors::Dtype)> = st
            .tensors()
            .into_iter()
            .map(|(n, t)| {
                let data = if n.contains("key_weighting") { vec![0; t.data().len()] } else { t.data().to_vec() };
                (n, data, t.shape().to_vec(), t.dtype())
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> =
            zeros.iter().map(|(n, d, s, dt)| (n.clone(), TensorView::new(*dt, s.clone(), d).unwrap())).collect();
        std::fs::write(gate_of_one.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    }
    let (ids, prompt, _) = golden(&base);
    for dtype in [DType::F32, DType::F32P, DType::Q8_0] {
        let a = convert_to_bytes(&ablation, dtype);
        let b = convert_to_bytes(&gate_of_one, dtype);
        let got = logits(Model::from_bytes(&a).unwrap(), &ids, prompt, 256);
        let want = logits(Model::from_bytes(&b).unwrap(), &ids, prompt, 256);
        assert!(got.iter().all(|z| z.is_finite()), "{dtype:?}: non-finite logits");
        assert_eq!(max_abs_diff(&got, &want), 0.0, "{dtype:?}: no merge gate differs from a gate of one");
    }
    std::fs::remove_dir_all(ablation).ok();
    std::fs::remove_dir_all(gate_of_one).ok();
}
