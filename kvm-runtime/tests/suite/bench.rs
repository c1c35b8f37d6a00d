//! `kvm bench` on a random-weight tiny model: the JSON report carries the keys that
//! later tooling parses, and the long-run mode reports every checkpoint.

use std::path::PathBuf;
use std::process::Command;

use kvm_core::quant::DType;
use kvm_export::synth::{growable, synth, Preset, SQRT16};
use kvm_write::policy::Policy;

fn tiny_model(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("kvm-bench-test-{}-{name}.kvm", std::process::id()));
    synth(&path, &Preset::Tiny.config(), &Policy::uniform(DType::Q8_0), 5, &mut |_| {}).unwrap();
    path
}

fn bench_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_kvm")).arg("bench").args(args).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "one JSON object on one line: {text}");
    serde_json::from_str(&text).unwrap()
}

/// Without `--bw-mib` the probe reads the step's own weight bytes (whole MiB, at least one)
/// and reports how many; `--bw-mib 0` skips it.
#[test]
fn the_probe_reads_the_steps_weight_bytes_by_default() {
    let model = tiny_model("probe");
    let path = model.to_str().unwrap();
    let r = bench_json(&["--model", path, "--prompt-len", "8", "--gen", "4", "--threads", "1"]);
    let step = r["weight_bytes_per_token"].as_u64().unwrap();
    assert_eq!(r["bw_mib"].as_u64(), Some(step.div_ceil(1 << 20).max(1)), "{r}");
    assert!(r["bw_fraction"].as_f64().is_some_and(|x| x > 0.0), "{r}");
    let r = bench_json(&["--model", path, "--prompt-len", "8", "--gen", "4", "--threads", "1", "--bw-mib", "0"]);
    assert!(r.get("bw_mib").is_none() && r.get("mem_bw_gb_s").is_none(), "{r}");
    std::fs::remove_file(model).ok();
}

#[test]
fn json_report_has_the_agreed_keys() {
    let model = tiny_model("keys");
    let r = bench_json(&[
        "--model",
        model.to_str().unwrap(),
        "--prompt-len",
        "40",
        "--gen",
        "8",
        "--threads",
        "2",
        "--bw-mib",
        "8",
    ]);
    for key in ["prefill_tok_s", "decode_tok_s", "mem_bw_gb_s", "bw_fraction"] {
        assert!(r[key].as_f64().is_some_and(|x| x > 0.0), "{key} in {r}");
    }
    for key in ["weight_bytes_per_token", "peak_rss_bytes", "decode_state_bytes_per_token"] {
        assert!(r[key].as_u64().is_some_and(|x| x > 0), "{key} in {r}");
    }
    assert!(kvm_core::kernels::Tier::from_name(r["kernel_tier"].as_str().unwrap()).is_some(), "{r}");
    assert!(r["model_pages"] == "huge" || r["model_pages"] == "mapped", "{r}");
    // Every tensor but the embedding, plus one embedding row.
    let file = kvm_runtime::file::ModelFile::open(&model, kvm_runtime::file::Pages::Mapped).unwrap();
    let m = file.model().unwrap();
    let all: u64 = m.tensors().map(|e| e.len).sum();
    let embed = m.tensors().find(|e| e.role == kvm_core::format::Role::TokEmbed).unwrap();
    assert_eq!(r["weight_bytes_per_token"].as_u64().unwrap(), all - embed.len + embed.len / embed.rows as u64);
    drop(file);
    // Decode from an empty context by default; after the timed prompt, or after a context
    // of its own, when asked.
    assert_eq!(r["context"], 0, "{r}");
    let first = r;
    for context in ["40", "70"] {
        let path = model.to_str().unwrap();
        let args =
            ["--model", path, "--mmap", "--prompt-len", "40", "--gen", "8", "--context", context, "--bw-mib", "0"];
        let r = bench_json(&args);
        assert_eq!(r["context"].to_string(), context, "{r}");
        assert_eq!(r["model_pages"], "mapped", "{r}");
        assert!(r["decode_tok_s"].as_f64().is_some_and(|x| x > 0.0), "{r}");
        // Decoding after a context reads more of the state than from an empty one.
        assert!(r["decode_state_bytes_per_token"].as_u64() > first["decode_state_bytes_per_token"].as_u64(), "{r}");
    }
    std::fs::remove_file(&model).ok();
}

/// The compute roofline: the FLOPs of a prefill token's matrices (counted here by hand for
/// the tiny preset), the FMA probe's peaks, and the fraction of the peak prefill used, each
/// finite and sane; and where prefill's time went.
#[test]
fn the_compute_roofline_counts_a_tokens_flops_and_the_fma_peak() {
    let model = tiny_model("fma");
    let r = bench_json(&["--model", model.to_str().unwrap(), "--prompt-len", "64", "--gen", "2", "--bw-mib", "0"]);
    std::fs::remove_file(&model).ok();
    // Tiny: d_model 64, 2 heads of 32 (q, k, v: 64 wide), d_vgate 32, d_ff 256, 2 layers,
    // every gate on. Per layer: q, k, v and the output projection 64 x 64 each, the value
    // gate's 32 x 64 and 64 x 32, the merge gate's 2 x 64, up 256 x 64 and down 64 x 256.
    let per_layer = 4 * 64 * 64 + 2 * 32 * 64 + 2 * 64 + 2 * 256 * 64;
    assert_eq!(r["flops_per_token"].as_u64(), Some(2 * 2 * per_layer), "{r}");
    let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
    for key in ["fma_peak_1t_gflops", "fma_peak_gflops"] {
        // A core runs at least a GFLOP/s and no vector unit yet does 10 TFLOP/s.
        assert!(f(key).is_finite() && f(key) > 1.0 && f(key) < 1e4, "{key} in {r}");
    }
    let gflops = f("prefill_tok_s") * f("flops_per_token") / 1e9;
    assert!((f("prefill_gflops") - gflops).abs() <= 1e-9 * gflops, "{r}");
    assert!((f("fma_fraction") - gflops / f("fma_peak_gflops")).abs() <= 1e-9, "{r}");
    // A model this small runs far below the FMA units' rate.
    assert!(f("fma_fraction") > 0.0 && f("fma_fraction") < 1.0, "{r}");
    let (products, attention) = (f("prefill_matmul_fraction"), f("prefill_attention_fraction"));
    assert!(products > 0.0 && attention > 0.0 && products + attention <= 1.0, "{r}");
}

#[test]
fn long_run_reports_each_checkpoint() {
    let model = tiny_model("long");
    let r = bench_json(&[
        "--model",
        model.to_str().unwrap(),
        "--gen",
        "300",
        "--checkpoints",
        "100,300",
        "--window",
        "32",
        "--threads",
        "1",
        "--bw-mib",
        "0",
    ]);
    std::fs::remove_file(&model).ok();
    let rows = r["checkpoints"].as_array().unwrap();
    assert_eq!(rows.iter().map(|c| c["pos"].as_u64().unwrap()).collect::<Vec<_>>(), [100, 300]);
    for c in rows {
        assert_eq!(c["window"], 32);
        assert!(c["ms_per_tok"].as_f64().unwrap() > 0.0 && c["rss_bytes"].as_u64().unwrap() > 0);
    }
    assert!(r["rss_spread"].as_f64().unwrap() < 0.05, "{r}");
}

#[test]
fn long_run_round_trips_snapshots_bit_exactly() {
    // A growable (power-law) model, so the state changes shape along the run.
    let mut cfg = Preset::Tiny.config();
    cfg.budget = kvm_core::config::StateBudget::PowerLaw { factor: 1.0, exponent: 0.5 };
    cfg.validate().unwrap();
    let path = std::env::temp_dir().join(format!("kvm-bench-test-{}-soak.kvm", std::process::id()));
    synth(&path, &cfg, &Policy::uniform(DType::F32), 7, &mut |_| {}).unwrap();
    let m = path.to_str().unwrap();
    let args = ["--model", m, "--gen", "600", "--checkpoints", "64,200,600", "--window", "32", "--bw-mib", "0"];
    let r = bench_json(&[&args[..], &["--threads", "1", "--round-trip", "16"]].concat());
    assert_eq!(r["round_trips"], 3, "{r}");
    assert!(r["rss_spread"].as_f64().unwrap() < 0.05, "{r}");
    // The round trips leave the run as it was: the same state at every checkpoint.
    let plain = bench_json(&[&args[..], &["--threads", "1"]].concat());
    let slots = |r: &serde_json::Value| -> Vec<u64> {
        r["checkpoints"].as_array().unwrap().iter().map(|c| c["state_slots"].as_u64().unwrap()).collect()
    };
    assert_eq!(slots(&r), slots(&plain));
    assert_eq!(plain["round_trips"], 0);
    std::fs::remove_file(&path).ok();
}

#[test]
fn context_sweep_on_the_bundled_model_keeps_memory_flat() {
    let model = kvm_test_support::repo().join("models/tiny-kjv-q8_0.kvm");
    let m = model.to_str().unwrap();
    // Depths past the 64-token window, each a whole number of 32-token chunks, so every
    // one of them decodes with the same window fill and a full state.
    let depths = [0u64, 320, 1280, 2560];
    let args = ["bench", "--model", m, "--prompt-len", "16,256", "--gen", "8", "--context", "0,320,1280,2560"];
    let out = Command::new(env!("CARGO_BIN_EXE_kvm"))
        .args(args)
        .args(["--threads", "1", "--bw-mib", "0", "--output", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runs: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let combos: Vec<(u64, u64)> =
        runs.iter().map(|r| (r["prompt_len"].as_u64().unwrap(), r["context"].as_u64().unwrap())).collect();
    let expected: Vec<(u64, u64)> = [16, 256].iter().flat_map(|&p| depths.map(|d| (p, d))).collect();
    assert_eq!(combos, expected);
    for r in &runs {
        for key in ["prefill_tok_s", "decode_tok_s", "decode_ms_per_tok"] {
            assert!(r[key].as_f64().is_some_and(|x| x > 0.0), "{key} in {r}");
        }
        assert_eq!(r["state_len"], 32, "{r}");
    }
    // A fixed state: past the window every step reads the same bytes, however deep.
    let state_bytes = |r: &serde_json::Value| r["decode_state_bytes_per_token"].as_u64().unwrap();
    assert!(state_bytes(&runs[1]) > state_bytes(&runs[0]), "{:?}", runs[..2].to_vec());
    assert!(runs[1..4].iter().all(|r| state_bytes(r) == state_bytes(&runs[1])));
    // Each run's own peak: a KV cache for 2,560 tokens would add 10 MiB (4 layers, keys and
    // values of 128 f32s each) to this model's 7 MiB; the fixed state adds nothing. Runs
    // that prefilled a whole batch (a context, or the 256-token prompt) hold its buffers:
    // within 10% of each other at any depth, and every run within 3 MiB of the lightest.
    let peaks: Vec<u64> = runs.iter().map(|r| r["peak_rss_bytes"].as_u64().unwrap()).collect();
    let batched: Vec<u64> =
        runs.iter().zip(&peaks).filter(|(r, _)| r["context"] != 0 || r["prompt_len"] == 256).map(|(_, &p)| p).collect();
    let (lo, hi) = (*batched.iter().min().unwrap(), *batched.iter().max().unwrap());
    assert!(lo > 0 && (hi as f64) < lo as f64 * 1.1, "{peaks:?}");
    let lightest = *peaks.iter().min().unwrap();
    assert!(peaks.iter().all(|&p| p < lightest + (3 << 20)), "{peaks:?}");
}

#[test]
fn context_sweep_on_a_growable_model_reports_its_state_at_each_depth() {
    // The paper's sqrt budget on tiny (chunks of 16, a window of 32), room for 1024 tokens
    // of context: 16 * 1024^0.5 = 512 slots.
    let cfg = growable(Preset::Tiny.config(), SQRT16, 1024).unwrap();
    let path = std::env::temp_dir().join(format!("kvm-bench-test-{}-sqrt.kvm", std::process::id()));
    synth(&path, &cfg, &Policy::uniform(DType::Q8_0), 5, &mut |_| {}).unwrap();
    let m = path.to_str().unwrap();
    let info = Command::new(env!("CARGO_BIN_EXE_kvm")).args(["info", "--model", m]).output().unwrap();
    let info = String::from_utf8(info.stdout).unwrap();
    assert!(info.contains("power_law 16 * ctx^0.5; 512 slots (--state-slots 16..=512)"), "{info}");
    let args = ["bench", "--model", m, "--prompt-len", "16", "--gen", "8", "--context", "0,64,288,512,1024,1100"];
    let out = Command::new(env!("CARGO_BIN_EXE_kvm")).args(args).args(["--threads", "1", "--bw-mib", "0"]).output();
    let out = out.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runs: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let key = |k: &str| -> Vec<u64> { runs.iter().map(|r| r[k].as_u64().unwrap()).collect() };
    // The slots the last of the 8 decoded tokens read (spec §3, folds at tokens b + 33):
    // from empty, 8 initial ones; at 64, the chunks [16, 48) in whole (ctx 64 asks for
    // 128); then the root, floor(16 * ctx^0.5): 271 at 288, 362 at 512, 512 at 1024, and
    // no more past the room.
    assert_eq!(key("decode_state_slots"), [8, 48, 271, 362, 512, 512]);
    // Each run's arena holds what it reaches (never below one chunk), as llama-bench
    // sizes its cache to each test.
    assert_eq!(key("state_len"), [16, 48, 271, 362, 512, 512]);
    let arena = key("arena_bytes");
    assert!(arena.windows(2).take(4).all(|w| w[0] < w[1]) && arena[4] == arena[5], "{arena:?}");
    // A step reads more state bytes the deeper it is, up to the room.
    let bytes = key("decode_state_bytes_per_token");
    assert!(bytes.windows(2).take(4).all(|w| w[0] < w[1]), "{bytes:?}");
    // 2 layers x 2 heads x f32 key and value rows of 32: 1 KiB a position. The steps at
    // 1025..=1032 read 512 slots and windows of 17..=24 tokens: 532.5 positions a step.
    assert_eq!(bytes[4], 1024 * 4260 / 8);
    assert!(runs.iter().all(|r| r["peak_rss_bytes"].as_u64().unwrap() > 0));
    // The table shows the slots of each test.
    let md = Command::new(env!("CARGO_BIN_EXE_kvm"))
        .args(["bench", "--model", m, "--prompt-len", "300", "--gen", "4", "--context", "1024"])
        .args(["--threads", "1", "--bw-mib", "0", "--output", "md"])
        .output()
        .unwrap();
    let md = String::from_utf8(md.stdout).unwrap();
    let cells: Vec<Vec<&str>> = md.lines().map(|l| l.split('|').map(str::trim).collect()).collect();
    let slots: Vec<(&str, &str)> = cells[2..].iter().map(|r| (r[6], r[8])).collect();
    assert_eq!(slots, [("pp300", "271"), ("tg4 @ d1024", "512")], "{md}");
    std::fs::remove_file(&path).ok();
}
