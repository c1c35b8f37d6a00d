//! The `kvm-export` binary as a user runs it on bad input: it never loses a file, never
//! leaves a partial one, never writes one the runtime refuses, and names what is wrong.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A fresh directory holding a copy of checkpoint `from` (a repo path), its config
/// patched by `patch`.
fn checkpoint(from: &str, what: &str, patch: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let src = repo().join(from);
    let dir = std::env::temp_dir().join(format!("kvm-export-test-{}-{what}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    patch(&mut cfg);
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    dir
}

fn export(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvm-export")).args(args).output().unwrap()
}

/// Runs `args`, which must fail with one line on stderr containing every one of `needles`.
fn fails_saying(args: &[&str], needles: &[&str]) {
    let o = export(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{args:?} succeeded");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: `{n}` not in: {err}");
    }
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn an_output_that_is_an_input_is_refused_and_the_checkpoint_survives() {
    let dir = checkpoint("tests/data/golden/fixed_basic", "same", |_| {});
    let weights = dir.join("model.safetensors");
    let before = std::fs::read(&weights).unwrap();
    let link = dir.join("link.kvm");
    let hard = dir.join("hard.kvm");
    std::os::unix::fs::symlink(&weights, &link).unwrap();
    std::fs::hard_link(&weights, &hard).unwrap();
    for out in [&weights, &link, &hard, &dir.join("config.json")] {
        fails_saying(&["convert", s(&dir), "-o", s(out), "-q"], &["is the input", "model somewhere else"]);
    }
    assert_eq!(std::fs::read(&weights).unwrap(), before);
    assert_eq!(names(&dir), ["config.json", "hard.kvm", "link.kvm", "model.safetensors"]);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_failed_export_leaves_no_file_and_keeps_an_existing_one() {
    let dir = checkpoint("tests/data/golden/fixed_basic", "nan", |_| {});
    // A NaN in the first f32 tensor's data.
    let weights = dir.join("model.safetensors");
    let mut st = std::fs::read(&weights).unwrap();
    let header_len = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&st[8..8 + header_len]).unwrap();
    let (name, t) = header.as_object().unwrap().iter().find(|(_, t)| t["dtype"] == "F32").unwrap();
    let at = 8 + header_len + t["data_offsets"][0].as_u64().unwrap() as usize;
    st[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&weights, &st).unwrap();

    let out_dir = std::env::temp_dir().join(format!("kvm-export-test-{}-nan-out", std::process::id()));
    std::fs::remove_dir_all(&out_dir).ok();
    std::fs::create_dir_all(&out_dir).unwrap();
    let existing = out_dir.join("model.kvm");
    std::fs::write(&existing, b"the user's previous model").unwrap();
    fails_saying(&["convert", s(&dir), "-o", s(&existing), "-q"], &[name.as_str(), "not finite"]);
    assert_eq!(std::fs::read(&existing).unwrap(), b"the user's previous model");
    let fresh = out_dir.join("fresh.kvm");
    fails_saying(&["convert", s(&dir), "-o", s(&fresh), "-q"], &["not finite"]);
    assert_eq!(names(&out_dir), ["model.kvm"], "no partial or temporary file");
    for d in [dir, out_dir] {
        std::fs::remove_dir_all(d).ok();
    }
}

#[test]
fn another_models_tokenizer_is_refused() {
    let out = std::env::temp_dir().join(format!("kvm-export-test-{}-gpt2.kvm", std::process::id()));
    let gpt2 = repo().join("tests/data/tokenizers/gpt2/tokenizer.json");
    let kjv = repo().join("models/tiny-kjv");
    fails_saying(
        &["convert", s(&kjv), "-o", s(&out), "--tokenizer", s(&gpt2), "-q"],
        &["has 50257 tokens", "vocab_size is 256"],
    );
    assert!(!out.exists());
}

#[test]
fn config_errors_name_the_json_key_and_the_problem() {
    let base = "tests/data/golden/fixed_basic";
    let out = std::env::temp_dir().join(format!("kvm-export-test-{}-cfg.kvm", std::process::id()));
    let dir = checkpoint(base, "window", |c| c["n_bswa_chunks"] = 0.into());
    fails_saying(&["convert", s(&dir), "-o", s(&out), "-q"], &["`n_bswa_chunks` is 0"]);
    let dir = checkpoint(base, "chunk", |c| c["chunk_len"] = (1u64 << 40).into());
    fails_saying(&["convert", s(&dir), "-o", s(&out), "-q"], &["`chunk_len` is 1099511627776", "largest"]);
    let dir = checkpoint(base, "dtypes", |_| {});
    let args = ["convert", s(&dir), "-o", s(&out), "-q", "--tensor-dtype", "lm_head=q8_0", "--tensor-dtype"];
    fails_saying(&[&args[..], &["lm_head=f16"]].concat(), &["`lm_head` twice"]);
    assert!(!out.exists());
    for what in ["window", "chunk", "dtypes"] {
        std::fs::remove_dir_all(std::env::temp_dir().join(format!("kvm-export-test-{}-{what}", std::process::id())))
            .ok();
    }
}

#[test]
fn a_good_export_replaces_the_old_file_and_loads() {
    let dir = checkpoint("tests/data/golden/fixed_basic", "good", |_| {});
    let out = dir.join("model.kvm");
    std::fs::write(&out, b"old").unwrap();
    let o = export(&["convert", s(&dir), "-o", s(&out), "-q"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bytes = std::fs::read(&out).unwrap();
    let model = kvm_core::Model::from_bytes(&bytes).unwrap();
    assert_eq!(model.config().vocab_len, 96);
    assert_eq!(names(&dir), ["config.json", "model.kvm", "model.safetensors"]);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn synth_writes_the_growable_states_asked_for_and_refuses_bad_ones() {
    let dir = std::env::temp_dir().join(format!("kvm-export-test-{}-synth", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("m.kvm");
    let budget = |args: &[&str]| {
        let o = export(&[&["synth", "--preset", "tiny", "-q", "-o", s(&out)], args].concat());
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        let bytes = std::fs::read(&out).unwrap();
        let model = kvm_core::Model::from_bytes(&bytes).unwrap();
        let c = *model.config();
        (c.budget, c.state_min_len, model.header().state_capacity)
    };
    use kvm_core::config::StateBudget::{Fixed, PowerLaw, Saturation};
    assert_eq!(budget(&[]), (Fixed, 16, 16));
    // 16 * 65536^0.5 = 4096 slots by default; 16 * 1024^0.5 = 512 with a shorter context.
    assert_eq!(budget(&["--state", "sqrt"]), (PowerLaw { factor: 16.0, exponent: 0.5 }, 16, 4096));
    assert_eq!(budget(&["--state", "sqrt", "--max-context", "1024"]).2, 512);
    // floor(1024 * 65536 / 66560) = 1008 slots, in whole chunks of 16: 1008.
    assert_eq!(budget(&["--state", "saturation"]), (Saturation { n: 1024.0 }, 1, 1008));
    assert_eq!(budget(&["--state", "power-law:2:0.5", "--max-context", "4096"]).2, 128);
    assert_eq!(budget(&["--state", "saturation:100"]).0, Saturation { n: 100.0 });
    let o = s(&out);
    fails_saying(&["synth", "--preset", "tiny", "-o", o, "--state", "cubic"], &["unknown --state `cubic`", "sqrt"]);
    fails_saying(&["synth", "--preset", "tiny", "-o", o, "--state", "power-law:2"], &["power-law:F:E"]);
    fails_saying(&["synth", "--preset", "tiny", "-o", o, "--max-context", "8"], &["--max-context", "--state"]);
    fails_saying(
        &["synth", "--preset", "tiny", "-o", o, "--state", "power-law:1:1", "--max-context", "99999"],
        &["grows past 16384 slots"],
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn hybrid_configs_kvm_cannot_run_are_refused_by_field_and_leave_no_file() {
    // fixed_basic made a hybrid: the config is refused before any tensor is read.
    let base = "tests/data/golden/fixed_basic";
    let out = std::env::temp_dir().join(format!("kvm-export-test-{}-hybrid.kvm", std::process::id()));
    for (what, field, value) in [
        ("mixer", "alt_token_mixer", serde_json::json!("rwkv7")),
        ("every1", "alt_layer_every", serde_json::json!(1)),
        ("vres", "swa_value_residual_mode", serde_json::json!("linear")),
        ("shift", "swa_token_shift_mode", serde_json::json!("none")),
        ("rope", "alt_rope_partial_dim", serde_json::json!(33)),
    ] {
        let dir = checkpoint(base, what, |c| {
            c["alt_layer_every"] = 2.into();
            c[field] = value.clone();
        });
        fails_saying(&["convert", s(&dir), "-o", s(&out), "-q"], &[&format!("`{field}` is {value}")]);
        assert!(!out.exists(), "{field}: an output was left");
        assert_eq!(names(&dir), ["config.json", "model.safetensors"], "{field}: a temporary file was left");
        std::fs::remove_dir_all(dir).ok();
    }
}
