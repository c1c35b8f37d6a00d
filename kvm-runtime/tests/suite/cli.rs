//! The `kvm` binary as a user runs it: converted golden cases through `kvm logits`
//! match the reference; errors are one line and never a panic.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use kvm_core::quant::DType;
use kvm_export::convert::{convert, TokenizerSource};
use kvm_test_support::{golden_dir, max_abs_diff, read_safetensors, repo, Tensor};
use kvm_write::policy::Policy;

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
fn info_prints_each_layers_kind() {
    for (case, layers, swa) in [
        ("fixed_basic", "layers         kvm kvm\n", None),
        ("hybrid_swa_saturation", "layers         swa kvm swa kvm\n", Some("window 12 tokens, rope 32 dims")),
        ("hybrid_swa_share_v0", "layers         swa kvm kvm\n", Some("theta 500, KVM layers share its v_first")),
    ] {
        let model = convert_case(case, DType::F32);
        let o = kvm(&["info", "--model", model.to_str().unwrap()]);
        let text = String::from_utf8(o.stdout).unwrap();
        assert!(o.status.success(), "{case}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(text.contains(layers), "{case}: info lacks `{layers}`:\n{text}");
        match swa {
            Some(needle) => assert!(text.contains(needle), "{case}: info lacks `{needle}`:\n{text}"),
            None => assert!(!text.contains("\nswa "), "{case}: an all-KVM model has no swa line:\n{text}"),
        }
        std::fs::remove_file(model).ok();
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

/// tiny-kjv (byte-level, 256 tokens) as an f32 file, converted for the test `what`.
fn tiny_kjv(what: &str) -> PathBuf {
    let out = tmp(&format!("kjv-{what}.kvm"));
    convert(&repo().join("models/tiny-kjv"), &out, &Policy::uniform(DType::F32), &TokenizerSource::Auto, &mut |_| {})
        .unwrap();
    out
}

/// Runs `args`, which must fail with one line on stderr containing each of `needles`.
fn fails_saying(args: &[&str], needles: &[&str]) -> String {
    let o = kvm(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{args:?} succeeded: {}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: `{n}` not in: {err}");
    }
    err
}

/// Runs `args`, which the argument parser must refuse (exit 2) saying each of `needles`.
fn parser_refuses(args: &[&str], needles: &[&str]) -> String {
    let o = kvm(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: `{n}` not in: {err}");
    }
    err
}

#[test]
fn non_finite_logits_are_an_error_naming_the_position() {
    let model = tmp("overflow.kvm");
    std::fs::write(&model, kvm_test_support::model_with(256, f32::MAX)).unwrap();
    let text = tmp("overflow.txt");
    std::fs::write(&text, "abc").unwrap();
    let out = tmp("overflow.npy");
    let (m, t, o) = (model.to_str().unwrap(), text.to_str().unwrap(), out.to_str().unwrap());
    let not_finite = "are not finite (NaN or infinity)";
    fails_saying(&["perplexity", "--model", m, "--text", t], &[not_finite, "position 0", "in the output head"]);
    fails_saying(&["perplexity", "--model", m, "--text", t, "--json"], &[not_finite, "position 0"]);
    fails_saying(
        &["generate", "--model", m, "--prompt", "ab", "-n", "3", "--temperature", "0"],
        &[not_finite, "position 1"],
    );
    fails_saying(
        &["logits", "--model", m, "--tokens", "1,2,3", "--prompt-len", "2", "--out", o],
        &[not_finite, "position 0"],
    );
    fails_saying(
        &["logits", "--model", m, "--tokens", "1,2,3", "--prompt-len", "0", "--out", o],
        &[not_finite, "position 0"],
    );
    assert!(!out.exists(), "no partial .npy");
    for f in [model, text] {
        std::fs::remove_file(f).ok();
    }
}

#[test]
fn broken_pipes_end_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let model = tiny_kjv("pipe");
    let m = model.to_str().unwrap();
    for args in [
        vec!["info", "--model", m],
        vec!["generate", "--model", m, "--prompt", "In the", "-n", "40", "--temperature", "0"],
        vec!["tokenize", "--model", m, "In the beginning"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvm"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before the first line, as `head` does once it has its lines.
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.is_empty(), "{args:?}: {err}");
        assert!(o.status.success() || o.status.signal() == Some(libc::SIGPIPE), "{args:?}: {:?}", o.status);
    }
    std::fs::remove_file(model).ok();
}

#[test]
fn model_files_of_the_wrong_size_are_refused_before_they_are_read() {
    let model = tiny_kjv("size");
    let bytes = std::fs::read(&model).unwrap();
    let len = bytes.len();
    let padded = tmp("padded.kvm");
    std::fs::write(&padded, &bytes).unwrap();
    // A gigabyte of holes: refused from the header and the size alone, in no time.
    std::fs::OpenOptions::new().write(true).open(&padded).unwrap().set_len(1 << 30).unwrap();
    let p = padded.to_str().unwrap();
    let longer = format!("is 1073741824 bytes, longer than the {len} its header states");
    for args in [vec!["info", "--model", p], vec!["generate", "--model", p, "--prompt", "In", "-n", "1"]] {
        let t0 = std::time::Instant::now();
        fails_saying(&args, &[&longer]);
        assert!(t0.elapsed().as_secs_f64() < 5.0, "{args:?} took {:?}", t0.elapsed());
    }
    std::fs::write(&padded, [&bytes[..], &[0]].concat()).unwrap();
    fails_saying(&["info", "--model", p], &[&format!("is {} bytes, longer than the {len}", len + 1)]);
    std::fs::write(&padded, &bytes[..len - 1]).unwrap();
    fails_saying(
        &["info", "--model", p],
        &[&format!("is {} bytes but its header says {len}: it is cut short", len - 1)],
    );
    let dir = std::env::temp_dir();
    fails_saying(&["info", "--model", dir.to_str().unwrap()], &["is a directory, not a model file"]);
    for f in [model, padded] {
        std::fs::remove_file(f).ok();
    }
}

#[test]
fn errors_name_the_flag_the_range_and_the_position() {
    let model = tiny_kjv("flags");
    let m = model.to_str().unwrap();
    let gen = |extra: &[&'static str]| [&["generate", "--model", m, "--prompt", "In", "-n", "2"][..], extra].concat();
    parser_refuses(&gen(&["--top-p", "2"]), &["'2'", "--top-p", "(0, 1]"]);
    parser_refuses(&gen(&["--temperature=-1"]), &["'-1'", "--temperature", "[0, 100]"]);
    parser_refuses(&gen(&["--temperature", "-1"]), &["'-1'", "--temperature", "[0, 100]"]);
    parser_refuses(&gen(&["--min-p", "1.5"]), &["'1.5'", "--min-p", "[0, 1]"]);
    parser_refuses(&gen(&["--repeat-penalty", "0"]), &["'0'", "--repeat-penalty", "(0, 100]"]);
    parser_refuses(&gen(&["--repeat-window", "4294967295"]), &["'4294967295'", "--repeat-window", "[0, 256]"]);
    let err = parser_refuses(&gen(&["--seed", "-1"]), &["'-1'", "--seed"]);
    assert!(!err.contains("unexpected argument"), "{err}");
    parser_refuses(&["bench", "--model", m, "--runs", "0"], &["'0'", "--runs"]);

    // A prompt may start with a hyphen; no decode step, no rate.
    let o = kvm(&["generate", "--model", m, "--prompt", "-Hi", "-n", "1", "--temperature", "0", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(got["prompt_ids"], serde_json::json!([45, 72, 105]));
    assert!(got["stats"]["decode_tok_s"].is_null(), "{got}");
    let o = kvm(&["generate", "--model", m, "--prompt", "In", "-n", "0"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("decode: 0 tokens, no steps"), "{o:?}");

    let out = tmp("flags.npy");
    let o = out.to_str().unwrap();
    let logits =
        |ids: &'static str| vec!["logits", "--model", m, "--tokens", ids, "--prompt-len", "1", "--out", o].into_iter();
    fails_saying(&logits("1,2,256").collect::<Vec<_>>(), &["token at position 2, 256, is out of range", "256 tokens"]);
    fails_saying(&logits("1,,2").collect::<Vec<_>>(), &["--tokens", "no token id after comma 1"]);
    fails_saying(&logits("1,2,").collect::<Vec<_>>(), &["no token id after comma 2"]);
    assert!(!out.exists());
    std::fs::remove_file(model).ok();
}

/// Peak resident memory of `kvm ARGS`, which must succeed, as its `VmHWM` last read before
/// it exits. (Not `wait4`'s `ru_maxrss`: a spawned child's counts this test process's own
/// peak, recorded when the child execs.)
pub(crate) fn peak_rss(args: &[&str]) -> u64 {
    use std::process::Stdio;
    let mut child =
        Command::new(env!("CARGO_BIN_EXE_kvm")).args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{args:?}: {status:?}");
            return peak;
        }
        let status = std::fs::read_to_string(&status_file).unwrap_or_default();
        let hwm = status.lines().find_map(|l| l.strip_prefix("VmHWM:"));
        if let Some(kb) = hwm.and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()) {
            peak = peak.max(kb * 1024);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

#[test]
fn logits_stream_to_the_file_in_constant_memory() {
    let model = tmp("vocab8k.kvm");
    std::fs::write(&model, kvm_test_support::model_with(8192, 0.01)).unwrap();
    let m = model.to_str().unwrap();
    let ids: Vec<String> = (0..1024).map(|i| (i * 37 % 8192).to_string()).collect();
    let (short, long) = (tmp("short.npy"), tmp("long.npy"));
    let run = |n: usize, out: &Path| {
        let (tokens, prompt_len) = (ids[..n].join(","), (n / 2).to_string());
        let args = ["logits", "--model", m, "--mmap", "--tokens", &tokens, "--prompt-len", &prompt_len, "--out"];
        peak_rss(&[&args[..], &[out.to_str().unwrap()]].concat())
    };
    let (rss_short, rss_long) = (run(64, &short), run(1024, &long));
    // The long run.s logits are 32 MiB; held in memory they would show here.
    assert!(rss_long < rss_short + (8 << 20), "peak memory {rss_short} for 64 tokens, {rss_long} for 1024");
    let (shape, a) = read_npy(&short);
    let (long_shape, b) = read_npy(&long);
    assert_eq!((shape, long_shape), (vec![64, 8192], vec![1024, 8192]));
    // The first 32 rows are prefill in both runs, the next 32 decoded in one, prefilled in the other.
    let worst = max_abs_diff(&a, &b[..a.len()]);
    assert!(worst < 1e-4, "max abs difference {worst}");
    for f in [model, short, long] {
        std::fs::remove_file(f).ok();
    }
}

#[test]
fn info_and_perplexity_agree_with_the_c_api() {
    use kvm_runtime::capi::*;
    let model = tiny_kjv("capi");
    let m = model.to_str().unwrap();
    let o = kvm(&["info", "--model", m]);
    assert!(o.status.success());
    let info = String::from_utf8(o.stdout).unwrap();
    let blob = std::fs::read(&model).unwrap();
    let mut cm = kvm_model::new();
    // SAFETY: the blob and the model handle are live locals; the blob outlives `cm`.
    assert_eq!(unsafe { kvm_model_load(blob.as_ptr(), blob.len(), 0, &mut cm) }, kvm_status::KVM_OK);
    for (name, code) in [("f32", KVM_CACHE_F32), ("f16", KVM_CACHE_F16), ("q8", KVM_CACHE_Q8)] {
        // SAFETY: `cm` is a loaded model handle.
        assert_eq!(unsafe { kvm_model_set_cache(&mut cm, code) }, kvm_status::KVM_OK);
        // SAFETY: as above.
        let c_size = unsafe { kvm_arena_size(&cm) };
        let line = info.lines().find(|l| l.starts_with(&format!("arena ({name})"))).unwrap_or_else(|| panic!("{info}"));
        assert!(line.contains(&format!(", {c_size} through the C API")), "{line}");
    }

    // Any bytes are text to a byte-level model, on any number of threads.
    let text = tmp("bytes.txt");
    std::fs::write(&text, b"In the beginning \xff\xfe\x00 God created").unwrap();
    let t = text.to_str().unwrap();
    let score = |threads: &str| {
        let o = kvm(&["perplexity", "--model", m, "--text", t, "--threads", threads, "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let (one, two) = (score("1"), score("2"));
    assert_eq!((one["tokens"].as_u64(), one["bytes"].as_u64()), (Some(31), Some(31)));
    let (a, b) = (one["bits_per_byte"].as_f64().unwrap(), two["bits_per_byte"].as_f64().unwrap());
    assert!(a.is_finite() && a > 0.0 && (a - b).abs() < 1e-6, "{a} vs {b}");
    for f in [model, text] {
        std::fs::remove_file(f).ok();
    }
}

/// The paper's padded vocabulary (GPT-2's tokenizer, 50,304 ids) whose padding ids carry
/// the largest logits: `kvm generate` samples only ids with text, greedy or not, with or
/// without `--ignore-eos`, in JSON or as text.
#[test]
fn generate_never_samples_a_padding_id() {
    let model = tmp("padded.kvm");
    std::fs::write(&model, kvm_test_support::padded_gpt2_model()).unwrap();
    let m = model.to_str().unwrap();
    let base = ["generate", "--model", m, "--prompt", "The quick brown fox", "-n", "12"];
    for extra in
        [&["--temperature", "0"][..], &["--temperature", "0.8", "--seed", "1"], &["--ignore-eos", "--seed", "2"]]
    {
        let o = kvm(&[&base[..], extra, &["--json"]].concat());
        assert!(o.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let ids: Vec<u64> = v["generated_ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap()).collect();
        assert!(!ids.is_empty(), "{extra:?}: {v}");
        assert!(ids.iter().all(|&i| i < 50_257), "{extra:?}: a padding id in {ids:?}");
        let o = kvm(&[&base[..], extra].concat());
        assert!(o.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stdout).starts_with("The quick brown fox"));
    }
    std::fs::remove_file(model).ok();
}
