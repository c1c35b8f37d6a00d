//! The `kvm-export` binary as a user runs it on bad input: it never loses a file, never
//! leaves a partial one, never writes one the runtime refuses, and names what is wrong.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kvm_test_support::{default_signals, is_special, special_files};

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

/// Runs `kvm-export args`, killed if it takes longer than a minute (a read of a FIFO
/// that never ends).
fn export(args: &[&str]) -> Output {
    use std::process::Stdio;
    use std::sync::mpsc::{channel, RecvTimeoutError};
    let child = Command::new(env!("CARGO_BIN_EXE_kvm-export"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (done, pid) = (channel::<()>(), child.id().to_string());
    let watchdog = std::thread::spawn(move || {
        let fired = done.1.recv_timeout(std::time::Duration::from_secs(60)) == Err(RecvTimeoutError::Timeout);
        if fired {
            Command::new("kill").args(["-9", &pid]).status().ok();
        }
        fired
    });
    let out = child.wait_with_output().unwrap();
    drop(done.0);
    assert!(!watchdog.join().unwrap(), "{args:?} did not end");
    out
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
        fails_saying(&["convert", s(&dir), "-o", s(out), "-q"], &["is the input", "write the output somewhere else"]);
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
        (c.budget, c.state_min_len, model.header().state_capacity, c.alt_layer_every)
    };
    use kvm_core::config::StateBudget::{Fixed, PowerLaw, Saturation};
    assert_eq!(budget(&[]), (Fixed, 16, 16, 0));
    // 16 * 65536^0.5 = 4096 slots by default; 16 * 1024^0.5 = 512 with a shorter context.
    assert_eq!(budget(&["--state", "sqrt"]), (PowerLaw { factor: 16.0, exponent: 0.5 }, 16, 4096, 0));
    assert_eq!(budget(&["--state", "sqrt", "--max-context", "1024"]).2, 512);
    // floor(1024 * 65536 / 66560) = 1008 slots, in whole chunks of 16: 1008; the paper's
    // hybrid stack (every other layer sliding-window), or that budget in every layer.
    assert_eq!(budget(&["--state", "saturation"]), (Saturation { n: 1024.0 }, 1, 1008, 2));
    assert_eq!(budget(&["--state", "saturation-all-kvm"]), (Saturation { n: 1024.0 }, 1, 1008, 0));
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
    // A context of none, or one too long to follow (4294967296 once hung), before any work.
    std::fs::remove_file(&out).ok();
    for ctx in ["0", "4294967296", "67108865"] {
        let t0 = std::time::Instant::now();
        fails_saying(
            &["synth", "--preset", "tiny", "-o", o, "--state", "sqrt", "--max-context", ctx],
            &[&format!("--max-context {ctx}"), "[1, 67108864]"],
        );
        assert!(t0.elapsed().as_secs() < 10, "--max-context {ctx} took {:?}", t0.elapsed());
    }
    assert!(!out.exists());
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_growable_checkpoint_gets_room_for_the_context_asked_for() {
    // The paper's sqrt16 model: `n_max_d_chunks` 10000, chunk 256, 16 * ctx^0.5 slots.
    let dir = checkpoint("tests/data/paper/paper_120M_kvm_sqrt16_wd", "room", |_| {});
    let out = dir.join("m.kvm");
    let capacity = |args: &[&str]| {
        let o = export(&[&["convert", s(&dir), "-q", "-o", s(&out)], args].concat());
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        let bytes = std::fs::read(&out).unwrap();
        kvm_core::Model::from_bytes(&bytes).unwrap().header().state_capacity
    };
    // 16 * 65536^0.5 = 4096 slots by default; 16 * 4096^0.5 = 1024 (four chunks).
    assert_eq!(capacity(&[]), 4096);
    assert_eq!(capacity(&["--max-context", "4096"]), 1024);
    for bad in ["0", "67108865"] {
        fails_saying(
            &["convert", s(&dir), "-q", "-o", s(&dir.join("x.kvm")), "--max-context", bad],
            &["--max-context"],
        );
    }
    assert!(!dir.join("x.kvm").exists());
    std::fs::remove_dir_all(dir).ok();
}

/// A fresh, empty directory for test `what`.
fn fresh_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvm-export-test-{}-{what}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn special_files_as_outputs_are_refused_and_stay_as_they_are() {
    let dir = fresh_dir("special");
    let nodes = special_files(&dir);
    let ck = repo().join("tests/data/golden/fixed_basic");
    let json = repo().join("tests/data/tokenizers/gpt2/tokenizer.json");
    for node in &nodes {
        let link = dir.join("link");
        std::fs::remove_file(&link).ok();
        std::os::unix::fs::symlink(node, &link).unwrap();
        for out in [node, &link] {
            fails_saying(&["convert", s(&ck), "-o", s(out), "-q"], &[s(node), "not a regular file"]);
            fails_saying(&["synth", "--preset", "tiny", "-o", s(out), "-q"], &[s(node), "not a regular file"]);
            fails_saying(&["tokenizer", s(&json), "-o", s(out)], &[s(node), "not a regular file"]);
        }
        assert!(is_special(node), "{} was replaced", node.display());
    }
    let mut want = vec!["fifo", "link"];
    if nodes.len() > 1 {
        want.push("zero");
    }
    assert_eq!(names(&dir), want, "no temporary file");
    std::fs::remove_dir_all(dir).ok();
}

/// A checkpoint's files and a tokenizer are read only from regular files: a FIFO (with no
/// writer: opening it would wait forever) is an error naming it, at once.
#[test]
fn inputs_that_are_not_regular_files_are_refused_naming_them() {
    let base = "tests/data/golden/fixed_basic";
    let out = fresh_dir("fifo-inputs").join("m.kvm");
    for file in ["model.safetensors", "config.json", "tokenizer.json"] {
        let dir = checkpoint(base, &format!("fifo-{file}"), |_| {});
        std::fs::remove_file(dir.join(file)).ok();
        let fifo = special_files(&dir).remove(0);
        std::fs::rename(&fifo, dir.join(file)).unwrap();
        fails_saying(&["convert", s(&dir), "-o", s(&out), "-q"], &[file, "not a regular file"]);
        if file == "tokenizer.json" {
            fails_saying(&["tokenizer", s(&dir.join(file)), "-o", s(&out)], &[file, "not a regular file"]);
        }
        assert!(!out.exists());
        std::fs::remove_dir_all(dir).ok();
    }
    std::fs::remove_dir_all(out.parent().unwrap()).ok();
}

#[test]
fn the_tokenizer_section_never_overwrites_its_json() {
    let dir = fresh_dir("tokenizer-same");
    let json = dir.join("tokenizer.json");
    std::fs::copy(repo().join("tests/data/tokenizers/gpt2/tokenizer.json"), &json).unwrap();
    let before = std::fs::read(&json).unwrap();
    let link = dir.join("link.bin");
    std::os::unix::fs::symlink(&json, &link).unwrap();
    for out in [&json, &link] {
        fails_saying(&["tokenizer", s(&json), "-o", s(out)], &["is the input", "write the output somewhere else"]);
    }
    assert_eq!(std::fs::read(&json).unwrap(), before);
    assert_eq!(names(&dir), ["link.bin", "tokenizer.json"]);
    std::fs::remove_dir_all(dir).ok();
}

/// SIGINT, SIGTERM and SIGHUP in the middle of a long write end `kvm-export` as the
/// signal does, with the old output as it was and no temporary file left.
#[test]
fn a_signal_during_a_write_leaves_no_temporary_file() {
    use std::os::unix::process::ExitStatusExt;
    let dir = fresh_dir("signal");
    let out = dir.join("m.kvm");
    std::fs::write(&out, b"the old model").unwrap();
    for (sig, name) in [(2, "INT"), (15, "TERM"), (1, "HUP")] {
        let mut child = default_signals(&mut Command::new(env!("CARGO_BIN_EXE_kvm-export")))
            .args(["synth", "--preset", "paper-120m", "-o", s(&out), "-q"])
            .spawn()
            .unwrap();
        // Signalled once its temporary file holds something: in the middle of the write.
        let started = std::time::Instant::now();
        while !names(&dir).iter().any(|n| n.ends_with(".tmp"))
            || std::fs::read_dir(&dir).unwrap().any(|e| e.unwrap().metadata().unwrap().len() == 0)
        {
            assert!(child.try_wait().unwrap().is_none(), "synth ended before it was signalled");
            assert!(started.elapsed().as_secs() < 120, "no temporary file appeared");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(Command::new("kill").args(["-s", name, &child.id().to_string()]).status().unwrap().success());
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(sig), "SIG{name}: {status:?}");
        assert_eq!(names(&dir), ["m.kvm"], "SIG{name}: a temporary file was left");
        assert_eq!(std::fs::read(&out).unwrap(), b"the old model");
    }
    std::fs::remove_dir_all(dir).ok();
}

/// Rewrites the safetensors header of `dir`'s checkpoint: `edit` gets its JSON text.
fn edit_header(dir: &Path, edit: impl FnOnce(&str) -> String) {
    let path = dir.join("model.safetensors");
    let st = std::fs::read(&path).unwrap();
    let len = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let header = edit(std::str::from_utf8(&st[8..8 + len]).unwrap());
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&st[8 + len..]);
    std::fs::write(&path, out).unwrap();
}

/// Every config value is checked as the file stores it: an f64 that an f32 holds as 0 or
/// infinity, or a size past u32, is refused by name, not stored as another setting.
#[test]
fn values_that_change_as_the_file_stores_them_are_refused() {
    let base = "tests/data/golden/fixed_basic";
    let out = std::env::temp_dir().join(format!("kvm-export-test-{}-narrow.kvm", std::process::id()));
    for (what, key, value, needles) in [
        ("residual-tiny", "residual_scale", serde_json::json!(1e-46), &["`residual_scale` is 1e-46", "f32"][..]),
        ("residual-huge", "residual_scale", serde_json::json!(1e39), &["`residual_scale` is 1e39", "f32"]),
        ("softcap-tiny", "logit_softcap", serde_json::json!(1e-46), &["`logit_softcap` is 1e-46", "f32"]),
        ("softcap-huge", "logit_softcap", serde_json::json!(1e39), &["`logit_softcap` is 1e39", "f32"]),
        // 64 * 67108868 = 2^32 + 256: d_ff would wrap to 256.
        ("ffn-wrap", "ffn_expansion", serde_json::json!(67108868), &["`ffn_expansion` is 67108868", "4294967552"]),
    ] {
        let dir = checkpoint(base, what, |c| c[key] = value);
        fails_saying(&["convert", s(&dir), "-o", s(&out), "-q"], needles);
        assert!(!out.exists(), "{what}: {} written", out.display());
        std::fs::remove_dir_all(dir).ok();
    }
    // The smallest normal f32s are values like any other.
    let dir = checkpoint(base, "small", |c| {
        c["residual_scale"] = serde_json::json!(1.2e-38);
        c["logit_softcap"] = serde_json::json!(1.2e-38);
    });
    let o = export(&["convert", s(&dir), "-o", s(&out), "-q"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::remove_file(&out).ok();
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn what_the_converter_would_misread_is_refused_by_name() {
    let base = "tests/data/golden/fixed_basic";
    let out = std::env::temp_dir().join(format!("kvm-export-test-{}-misread.kvm", std::process::id()));
    let refused = |what: &str, patch: fn(&mut serde_json::Value), needles: &[&str]| {
        let dir = checkpoint(base, what, patch);
        fails_saying(&["convert", s(&dir), "-o", s(&out), "-q"], needles);
        assert!(!out.exists(), "{what}: {} left behind", out.display());
        dir
    };
    let mut dirs = vec![
        refused("switch", |c| c["use_tokenshift_att"] = 2.into(), &["`use_tokenshift_att` is 2", "0 or 1"]),
        refused("half", |c| c["kvm_use_vlens"] = 0.5.into(), &["`kvm_use_vlens` is 0.5", "0 or 1"]),
        refused("string", |c| c["use_skip_connections"] = "no".into(), &["`use_skip_connections`"]),
        refused("softcap", |c| c["logit_softcap"] = (-3).into(), &["`logit_softcap` is -3", "> 0"]),
        refused("residual", |c| c["residual_scale"] = 0.into(), &["`residual_scale` is 0", "> 0"]),
        refused("tokenizer", |c| c["tokenizer"] = "gpt2".into(), &["`tokenizer` is \"gpt2\"", "no tokenizer.json"]),
    ];
    // A matrix stored flat, with the right element count.
    let flat = checkpoint(base, "flat", |_| {});
    edit_header(&flat, |h| {
        let mut v: serde_json::Value = serde_json::from_str(h).unwrap();
        v["transformer.h.0.attn.c_q.weight"]["shape"] = serde_json::json!([64 * 64]);
        v.to_string()
    });
    fails_saying(&["convert", s(&flat), "-o", s(&out), "-q"], &["`transformer.h.0.attn.c_q.weight`", "[4096]"]);
    // A name listed twice (the parser keeps one of them).
    let twice = checkpoint(base, "twice", |_| {});
    edit_header(&twice, |h| {
        let v: serde_json::Value = serde_json::from_str(h).unwrap();
        let name = "transformer.h.0.attn.c_q.weight";
        format!("{{\"{name}\":{},{}", v[name], &h[1..])
    });
    fails_saying(&["convert", s(&twice), "-o", s(&out), "-q"], &["`transformer.h.0.attn.c_q.weight` is listed twice"]);
    assert!(!out.exists());
    // A byte-level declaration needs no file.
    dirs.push(checkpoint(base, "bytes", |c| c["tokenizer"] = "bytes".into()));
    let o = export(&["convert", s(dirs.last().unwrap()), "-o", s(&out), "-q"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::remove_file(&out).ok();
    for d in dirs.into_iter().chain([flat, twice]) {
        std::fs::remove_dir_all(d).ok();
    }
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

/// A hybrid checkpoint's `swa_window_size` of 0 (or less) means `chunk_len` (spec §5);
/// the KVM-only tensors (`key_weighting`, `ln_s_k`, head temperatures) on an alternate
/// layer are refused by name, leaving no file.
#[test]
fn a_hybrid_window_of_0_is_a_chunk_and_kvm_only_tensors_on_an_alternate_layer_are_refused() {
    use safetensors::tensor::TensorView;
    let base = "tests/data/golden/hybrid_swa_saturation";
    for window in [0, -1] {
        let dir = checkpoint(base, &format!("window{window}"), |c| c["swa_window_size"] = window.into());
        let out = dir.join("m.kvm");
        let o = export(&["convert", s(&dir), "-q", "-o", s(&out)]);
        assert!(o.status.success(), "{window}: {}", String::from_utf8_lossy(&o.stderr));
        let bytes = std::fs::read(&out).unwrap();
        let c = *kvm_core::Model::from_bytes(&bytes).unwrap().config();
        assert_eq!((c.alt_window, c.chunk_len), (8, 8), "swa_window_size {window}");
        std::fs::remove_dir_all(dir).ok();
    }
    for name in ["key_weighting.weight", "ln_s_k.weight", "state_head_temp"] {
        let dir = checkpoint(base, name, |_| {});
        let path = dir.join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut tensors: Vec<(String, TensorView<'_>)> = st.tensors();
        // Layer 1's (a KVM layer's) copied onto alternate layer 0.
        let from = tensors.iter().find(|(n, _)| *n == format!("transformer.h.1.attn.{name}")).unwrap().1.clone();
        let onto = format!("transformer.h.0.attn.{name}");
        tensors.push((onto.clone(), from));
        std::fs::write(&path, safetensors::serialize(tensors, None).unwrap()).unwrap();
        let out = dir.join("m.kvm");
        fails_saying(&["convert", s(&dir), "-q", "-o", s(&out)], &[&format!("unexpected tensor `{onto}`")]);
        assert_eq!(names(&dir), ["config.json", "model.safetensors"], "{name}: a file was left");
        std::fs::remove_dir_all(dir).ok();
    }
}

/// `--numerics int` takes `--cache f32|q8` and `--slot-reads`, and refuses a weight dtype,
/// an f16 cache and --no-repack by name, leaving no file.
#[test]
fn integer_exports_take_their_row_width_and_slot_reads() {
    let dir = checkpoint("tests/data/golden/fixed_basic", "int", |_| {});
    let out = dir.join("int.kvm");
    let o = export(&[
        "convert",
        s(&dir),
        "-o",
        s(&out),
        "-q",
        "--numerics",
        "int",
        "--cache",
        "q8",
        "--slot-reads",
        "recomputed",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bytes = std::fs::read(&out).unwrap();
    let model = kvm_core::Model::from_bytes(&bytes).unwrap();
    assert!(model.config().has(kvm_core::config::flags::INT_NUMERICS));
    assert_eq!(model.cache(), kvm_core::cache::CacheDtype::Q8);
    assert_eq!(model.slot_reads(), kvm_core::cache::SlotReads::Recomputed);
    std::fs::remove_file(&out).unwrap();
    let int = ["convert", s(&dir), "-o", s(&out), "-q", "--numerics", "int"];
    fails_saying(&[&int[..], &["--cache", "f16"]].concat(), &["--cache q8", "f16"]);
    fails_saying(&[&int[..], &["--dtype", "q8_0"]].concat(), &["--dtype"]);
    fails_saying(&[&int[..], &["--no-repack"]].concat(), &["--no-repack"]);
    assert_eq!(names(&dir), ["config.json", "model.safetensors"]);
    std::fs::remove_dir_all(dir).ok();
}

/// Usage errors are the one line every other error is (`kvm-export: error: ...`), with
/// clap's exit code for them, 2.
#[test]
fn usage_errors_are_one_line() {
    for (args, needle) in [
        (&["convert"][..], "the following required arguments were not provided: --out <OUT> <DIR>"),
        (&["synth", "--preset", "tiny", "-o", "x.kvm", "--seed", "x"], "invalid value 'x' for '--seed <SEED>'"),
        (&["nonsense"], "unrecognized subcommand 'nonsense'"),
    ] {
        let o = export(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.starts_with("kvm-export: error: ") && err.lines().count() == 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let o = export(&["--help"]);
    assert!(o.status.success() && !o.stdout.is_empty());
}
