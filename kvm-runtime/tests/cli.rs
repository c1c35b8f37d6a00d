//! The `kvm` binary as a user runs it: converted golden cases through `kvm logits`
//! match the reference; errors are one line and never a panic.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{golden_dir, max_abs_diff, read_safetensors, repo, Tensor};
use kvm_core::quant::DType;
use kvm_export::convert::{convert, Policy, TokenizerSource};

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kvm-cli-{}-{name}", std::process::id()))
}

fn kvm(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvm")).args(args).output().unwrap()
}

fn convert_case(case: &str, dtype: DType) -> PathBuf {
    let out = tmp(&format!("{case}-{}.kvm", dtype.name()));
    let policy = Policy::uniform(dtype);
    convert(&golden_dir(case), &out, &policy, &TokenizerSource::Auto, &mut |_| {}).unwrap();
    out
}

/// Reads a float32 .npy written by `kvm logits`: (shape, data).
fn read_npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..8], b"\x93NUMPY\x01\x00");
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = std::str::from_utf8(&b[10..10 + hlen]).unwrap();
    assert!(header.contains("'descr': '<f4'"));
    let shape_text = header.split("'shape': (").nth(1).unwrap().split(')').next().unwrap();
    let shape = shape_text.split(',').filter(|s| !s.trim().is_empty()).map(|s| s.trim().parse().unwrap()).collect();
    let data = b[10 + hlen..].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    (shape, data)
}

/// The golden tensors of a case.
fn golden(case: &str) -> HashMap<String, Tensor> {
    read_safetensors(&golden_dir(case).join("golden.safetensors"))
}

#[test]
fn logits_match_golden_vectors() {
    for case in ["fixed_basic", "growable_saturation", "softcap_fullrope_3layers", "short_prompt_decode"] {
        let model = convert_case(case, DType::F32);
        let g = golden(case);
        let ids: Vec<String> = g["input_ids"].i32.iter().map(|i| i.to_string()).collect();
        let p = g["prompt_len"].i32[0] as usize;
        let (shape, got) = kvm_logits(&model, &ids, p, &[], case);
        let want: Vec<f32> = g["logits_prefill"].f32.iter().chain(&g["logits_decode"].f32).copied().collect();
        assert_eq!(shape, vec![ids.len(), want.len() / ids.len()]);
        let worst = max_abs_diff(&got, &want);
        assert!(worst <= 1e-3, "{case}: max abs logit error {worst}");
        std::fs::remove_file(model).ok();
    }
}

/// `kvm logits --model M --tokens IDS --prompt-len P EXTRA...`: the `.npy` it writes (shape,
/// values), which must succeed (`what` names the run).
fn kvm_logits(model: &Path, ids: &[String], prompt_len: usize, extra: &[&str], what: &str) -> (Vec<usize>, Vec<f32>) {
    let out = tmp(&format!("{}.npy", what.replace(' ', "-")));
    let (tokens, prompt_len) = (ids.join(","), prompt_len.to_string());
    let mut args = vec!["logits", "--model", model.to_str().unwrap(), "--tokens", &tokens, "--prompt-len", &prompt_len];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--out", out.to_str().unwrap()]);
    let o = kvm(&args);
    assert!(o.status.success(), "{what}: {}", String::from_utf8_lossy(&o.stderr));
    let npy = read_npy(&out);
    std::fs::remove_file(out).ok();
    npy
}

#[test]
fn tokens_file_and_info() {
    let model = convert_case("fixed_basic", DType::F16);
    let ids = tmp("ids.txt");
    std::fs::write(&ids, "[1, 2, 3,\n 4 5]").unwrap();
    let out = tmp("ids.npy");
    let o = kvm(&[
        "logits",
        "--model",
        model.to_str().unwrap(),
        "--tokens-file",
        ids.to_str().unwrap(),
        "--prompt-len",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(read_npy(&out).0, vec![5, 96]);
    let o = kvm(&["info", "--model", model.to_str().unwrap()]);
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(o.status.success());
    for needle in ["vocab_len      96", "n_layers       2", "f16", "arena", "kernel tier"] {
        assert!(text.contains(needle), "info lacks `{needle}`:\n{text}");
    }
    for f in [model, out, ids] {
        std::fs::remove_file(f).ok();
    }
}

#[test]
fn errors_are_one_line_and_never_panics() {
    let model = convert_case("fixed_basic", DType::F32);
    let m = model.to_str().unwrap();
    let mut corrupt = std::fs::read(&model).unwrap();
    corrupt[1000] ^= 4;
    let bad = tmp("corrupt.kvm");
    std::fs::write(&bad, &corrupt).unwrap();
    let out = tmp("never.npy");
    let o = out.to_str().unwrap();
    for args in [
        vec!["info", "--model", "/nonexistent.kvm"],
        vec!["info", "--model", bad.to_str().unwrap()],
        vec!["logits", "--model", m, "--tokens", "1,2,999", "--prompt-len", "1", "--out", o],
        vec!["logits", "--model", m, "--tokens", "1,x", "--prompt-len", "1", "--out", o],
        vec!["logits", "--model", m, "--tokens", "1,2", "--prompt-len", "3", "--out", o],
        vec!["logits", "--model", m, "--tokens", "1,2", "--prompt-len", "1", "--out", "/nonexistent/dir/x.npy"],
    ] {
        let r = kvm(&args);
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(!r.status.success(), "{args:?} succeeded");
        assert!(!err.contains("panicked") && !err.contains("internal error"), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("kvm: error: "), "{args:?}: {err}");
    }
    for f in [model, bad] {
        std::fs::remove_file(f).ok();
    }
}

#[test]
fn logits_match_with_any_thread_count_and_every_cache() {
    let model = convert_case("growable_power_law", DType::F32);
    let g = golden("growable_power_law");
    let ids: Vec<String> = g["input_ids"].i32.iter().map(|i| i.to_string()).collect();
    let want: Vec<f32> = g["logits_full"].f32.clone();
    // The compact caches' bars are the golden test's (tests/suite/golden.rs).
    for (cache, tol) in [("f32", 1e-3), ("f16", 1e-2), ("q8", 0.75)] {
        for threads in ["1", "2", "3"] {
            let what = format!("threads {threads} cache {cache}");
            let (_, got) = kvm_logits(&model, &ids, ids.len(), &["--threads", threads, "--cache", cache], &what);
            let worst = max_abs_diff(&got, &want);
            assert!(worst <= tol, "--threads {threads} --cache {cache}: max abs logit error {worst}");
        }
    }
    std::fs::remove_file(model).ok();
}

#[test]
fn greedy_generation_reproduces_the_reference() {
    let out = tmp("tiny-kjv-f32.kvm");
    let policy = Policy::uniform(DType::F32);
    convert(&repo().join("models/tiny-kjv"), &out, &policy, &TokenizerSource::Auto, &mut |_| {}).unwrap();
    let greedy: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("models/tiny-kjv/reference/greedy.json")).unwrap())
            .unwrap();
    for (case, threads) in greedy.as_array().unwrap().iter().zip(["1", "2"].iter().cycle()) {
        let prompt = case["prompt"].as_str().unwrap();
        let want: Vec<u64> = case["greedy_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        let n = want.len().to_string();
        let o = kvm(&[
            "generate",
            "--model",
            out.to_str().unwrap(),
            "--prompt",
            prompt,
            "-n",
            &n,
            "--temperature",
            "0",
            "--threads",
            threads,
            "--json",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let got: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let ids: Vec<u64> = got["generated_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(ids, want, "prompt {prompt:?}");
        assert_eq!(got["text"].as_str().unwrap(), case["text"].as_str().unwrap());
        for key in ["prompt_tok_s", "decode_tok_s", "peak_rss_bytes"] {
            assert!(got["stats"][key].as_f64().unwrap() > 0.0, "stats.{key}");
        }
        // Streaming mode prints the prompt, then the continuation (here from the mapped
        // file rather than the huge-page copy).
        let model = out.to_str().unwrap();
        let o = kvm(&["generate", "--model", model, "--mmap", "--prompt", prompt, "-n", &n, "--temperature", "0"]);
        assert_eq!(
            String::from_utf8(o.stdout).unwrap().trim_end_matches('\n'),
            format!("{prompt}{}", case["text"].as_str().unwrap())
        );
    }
    std::fs::remove_file(out).ok();
}

#[test]
fn tokenize_matches_the_reference_tokenizer() {
    let tj = repo().join("tests/data/tokenizers/gpt2/tokenizer.json");
    let vectors: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("tests/data/tokenizers/gpt2/encode_vectors.json")).unwrap(),
    )
    .unwrap();
    for v in vectors.as_array().unwrap().iter().take(4) {
        let o = kvm(&["tokenize", "--tokenizer", tj.to_str().unwrap(), "--json", v["text"].as_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let got: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(got["ids"], v["ids"]);
    }
}
