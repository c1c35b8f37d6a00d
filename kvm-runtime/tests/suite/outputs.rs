//! What `kvm` writes and reads back: no output path may be one of the run's inputs or a
//! special file, a signal leaves no temporary file, and a state file is read only at its
//! size and restored only if every byte is the one saved.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kvm_test_support::{default_signals, is_special, repo, special_files};

use crate::kvm_in;

/// A fresh, empty directory for test `what`.
fn fresh_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvm-outputs-{}-{what}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

/// Runs `args`, which must fail with one line on stderr containing each of `needles`.
fn fails_saying(args: &[&str], needles: &[&str]) {
    let o = kvm_in(args, b"");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{args:?} succeeded");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: `{n}` not in: {err}");
    }
}

/// The bundled model, copied into `dir`.
fn model_in(dir: &Path) -> PathBuf {
    let m = dir.join("m.kvm");
    std::fs::copy(repo().join("models/tiny-kjv-q8_0.kvm"), &m).unwrap();
    m
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn an_output_that_is_an_input_is_refused_and_the_input_survives() {
    let dir = fresh_dir("inputs");
    let m = model_in(&dir);
    let before = std::fs::read(&m).unwrap();
    let (link, hard) = (dir.join("link.kvm"), dir.join("hard.kvm"));
    std::os::unix::fs::symlink("m.kvm", &link).unwrap();
    std::fs::hard_link(&m, &hard).unwrap();
    let (prompt, ids, state) = (dir.join("p.txt"), dir.join("ids.txt"), dir.join("s.state"));
    std::fs::write(&prompt, "In the beginning").unwrap();
    std::fs::write(&ids, "1, 2, 3").unwrap();
    let o = kvm_in(&["generate", "--model", s(&m), "--prompt", "In", "-n", "0", "--save-state", s(&state)], b"");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let saved = std::fs::read(&state).unwrap();
    let refused = ["is the input", "write the output somewhere else"];
    for out in [&m, &link, &hard] {
        fails_saying(&["generate", "--model", s(&m), "--prompt", "In", "-n", "0", "--save-state", s(out)], &refused);
        fails_saying(&["logits", "--model", s(&m), "--tokens", "1,2", "--out", s(out)], &refused);
    }
    fails_saying(&["logits", "--model", s(&m), "--prompt-file", s(&prompt), "--out", s(&prompt)], &refused);
    fails_saying(&["logits", "--model", s(&m), "--tokens-file", s(&ids), "--out", s(&ids)], &refused);
    fails_saying(
        &["generate", "--model", s(&m), "--prompt-file", s(&prompt), "-n", "0", "--save-state", s(&prompt)],
        &refused,
    );
    // Checked before any work: before the model is even read.
    let junk = dir.join("junk.kvm");
    std::fs::write(&junk, b"not a model").unwrap();
    fails_saying(&["generate", "--model", s(&junk), "--prompt", "In", "--save-state", s(&junk)], &refused);
    assert_eq!(std::fs::read(&junk).unwrap(), b"not a model");
    std::fs::remove_file(&junk).unwrap();
    let resave = ["generate", "--model", s(&m), "--load-state", s(&state), "--prompt", " God", "-n", "0"];
    fails_saying(&[&resave[..], &["--save-state", s(&state)]].concat(), &refused);
    // In a chat, /save of the model is an error and the chat goes on.
    // chat's /save paths are relative to its working directory.
    let o = {
        use std::io::Write;
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvm"))
            .args(["chat", "--model", "m.kvm", "-n", "2", "--temperature", "0"])
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"/save m.kvm\nhi\n/save link.kvm\n").unwrap();
        child.wait_with_output().unwrap()
    };
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(err.matches("is the input").count(), 2, "{err}");
    assert!(!err.contains("(saved to"), "{err}");
    assert_eq!(std::fs::read(&m).unwrap(), before);
    assert_eq!(std::fs::read(&state).unwrap(), saved);
    assert_eq!(std::fs::read_to_string(&prompt).unwrap(), "In the beginning");
    assert_eq!(std::fs::read_to_string(&ids).unwrap(), "1, 2, 3");
    assert_eq!(names(&dir), ["hard.kvm", "ids.txt", "link.kvm", "m.kvm", "p.txt", "s.state"]);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn special_files_as_outputs_are_refused_and_stay_as_they_are() {
    let dir = fresh_dir("special");
    let m = model_in(&dir);
    let nodes = special_files(&dir);
    for node in &nodes {
        let gen = ["generate", "--model", s(&m), "--prompt", "In", "-n", "0", "--save-state", s(node)];
        fails_saying(&gen, &[s(node), "not a regular file"]);
        fails_saying(
            &["logits", "--model", s(&m), "--tokens", "1,2", "--out", s(node)],
            &[s(node), "not a regular file"],
        );
        assert!(is_special(node), "{} was replaced", node.display());
    }
    assert_eq!(names(&dir).len(), 1 + nodes.len(), "no temporary file");
    std::fs::remove_dir_all(dir).ok();
}

/// A FIFO (with no writer: opening it would wait forever) or a device as the model is an
/// error naming it, not a read that never ends or a bare "Illegal seek".
#[test]
fn a_model_that_is_not_a_regular_file_is_refused_naming_it() {
    let dir = fresh_dir("model-fifo");
    for node in special_files(&dir) {
        for args in [
            vec!["info", "--model", s(&node)],
            vec!["generate", "--model", s(&node), "--prompt", "In", "-n", "1"],
            vec!["generate", "--model", s(&node), "--mmap", "--prompt", "In", "-n", "1"],
            // A tokenizer is read only from a file too.
            vec!["tokenize", "--tokenizer", s(&node), "In"],
        ] {
            fails_saying(&args, &[s(&node), "not a regular file"]);
        }
    }
    std::fs::remove_dir_all(dir).ok();
}

/// `--load-state` reads a state file only when it is a regular file of the session's
/// snapshot size, and restores it only when every byte is the one saved: 30 of 30
/// single-byte changes, and the state zeroed after its first 64 bytes, are refused.
#[test]
fn a_state_file_is_read_at_its_size_and_restored_only_as_saved() {
    let dir = fresh_dir("load");
    let m = model_in(&dir);
    let state = dir.join("s.state");
    let text = "In the beginning God created the heaven and the earth. And the earth was without form";
    let o = kvm_in(&["generate", "--model", s(&m), "--prompt", text, "-n", "0", "--save-state", s(&state)], b"");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let saved = std::fs::read(&state).unwrap();
    let m = m.to_str().unwrap().to_string();
    let load = |f: &Path| -> Vec<String> {
        ["generate", "--model", &m, "--load-state", s(f), "--prompt", " void", "-n", "4"].map(String::from).to_vec()
    };
    let ok = kvm_in(&strs(&load(&state)), b"");
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));

    for node in special_files(&dir) {
        let started = Instant::now();
        fails_saying(&strs(&load(&node)), &[s(&node), "not a regular file"]);
        assert!(started.elapsed() < Duration::from_secs(20), "{} was read", node.display());
    }
    let n = saved.len();
    let bad = dir.join("bad.state");
    for len in [0, 64, n - 1, n + 1, 2 * n] {
        let mut b = saved.clone();
        b.resize(len, 0);
        std::fs::write(&bad, &b).unwrap();
        fails_saying(&strs(&load(&bad)), &[s(&bad), &format!("({len} bytes, "), &format!(" or {n} expected)")]);
    }
    let damaged = [s(&bad), "is not a state of this session, or is damaged"];
    for i in 0..30usize {
        let at = if i < 5 { i * 13 % 64 } else { (i * 7_919 * 131) % n };
        let mut b = saved.clone();
        b[at] ^= if i % 2 == 0 { 1 << (i % 8) } else { 0xFF };
        std::fs::write(&bad, &b).unwrap();
        fails_saying(&strs(&load(&bad)), &damaged);
    }
    let mut b = saved.clone();
    b[64..].fill(0);
    std::fs::write(&bad, &b).unwrap();
    fails_saying(&strs(&load(&bad)), &damaged);
    std::fs::remove_dir_all(dir).ok();
}

/// SIGINT, SIGTERM and SIGHUP in the middle of `kvm logits --out` end it as the signal
/// does, with the old output as it was and no temporary file left.
/// A state file saved after a prompt holds its logits: `--load-state` with an empty
/// prompt then writes the very text the uninterrupted run does. A file of an older kvm
/// (the state alone, its flags word zero) still loads with a prompt, and without one is
/// refused, saying why.
#[test]
fn an_empty_prompt_after_a_state_generates_as_the_uninterrupted_run() {
    let dir = fresh_dir("resume");
    let m = model_in(&dir);
    let (state, old) = (dir.join("s.state"), dir.join("old.state"));
    let text = "In the beginning God created";
    let run = |args: &[&str]| {
        let o = kvm_in(&[&["generate", "--model", s(&m), "-n", "24", "--seed", "11"], args].concat(), b"");
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        o.stdout
    };
    let whole = run(&["--prompt", text, "--save-state", s(&state)]);
    let resumed = run(&["--load-state", s(&state), "--prompt", ""]);
    assert_eq!(String::from_utf8_lossy(&whole), format!("{text}{}", String::from_utf8_lossy(&resumed)));
    assert!(resumed.len() > 1, "nothing generated");

    // The older layout: the state alone (the logits' 4 * vocab_len bytes cut), no flags,
    // its CRC (every byte but its own word, 7) made right.
    let saved = std::fs::read(&state).unwrap();
    // The bundled model's vocab_len (`kvm info`).
    const VOCAB: usize = 256;
    let mut b = saved[..saved.len() - 4 * VOCAB].to_vec();
    b[32..36].fill(0);
    let crc = kvm_core::format::crc32_update(kvm_core::format::crc32(&b[..28]), &b[32..]);
    b[28..32].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&old, &b).unwrap();
    assert_eq!(
        run(&["--load-state", s(&old), "--prompt", " the"]),
        run(&["--load-state", s(&state), "--prompt", " the"])
    );
    let empty = ["generate", "--model", s(&m), "--load-state", s(&old), "--prompt", ""];
    fails_saying(&empty, &[s(&old), "holds no logits: saved by an older kvm; give a prompt"]);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_signal_during_logits_leaves_no_temporary_file() {
    use std::os::unix::process::ExitStatusExt;
    let dir = fresh_dir("signal");
    let m = model_in(&dir);
    let ids = dir.join("ids.txt");
    // Decoded one at a time: seconds of work, the file growing all along.
    let many: Vec<String> = (0..400_000).map(|i| (i * 7 % 256).to_string()).collect();
    std::fs::write(&ids, many.join(",")).unwrap();
    let out = dir.join("out.npy");
    std::fs::write(&out, b"the old logits").unwrap();
    let tmp_len = || {
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap())
            .find(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .map(|e| e.metadata().unwrap().len())
    };
    for (sig, name) in [(2, "INT"), (15, "TERM"), (1, "HUP")] {
        let mut child = default_signals(&mut Command::new(env!("CARGO_BIN_EXE_kvm")))
            .args(["logits", "--model", s(&m), "--tokens-file", s(&ids), "--prompt-len", "1", "--out", s(&out)])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while tmp_len().is_none_or(|len| len <= 1 << 20) {
            assert!(child.try_wait().unwrap().is_none(), "logits ended before it was signalled");
            assert!(started.elapsed() < Duration::from_secs(120), "no temporary file grew");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(Command::new("kill").args(["-s", name, &child.id().to_string()]).status().unwrap().success());
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(sig), "SIG{name}: {status:?}");
        assert_eq!(names(&dir), ["ids.txt", "m.kvm", "out.npy"], "SIG{name}: a temporary file was left");
        assert_eq!(std::fs::read(&out).unwrap(), b"the old logits");
    }
    // SIGKILL leaves the temporary file; the next write of the same output removes it.
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvm"))
        .args(["logits", "--model", s(&m), "--tokens-file", s(&ids), "--prompt-len", "1", "--out", s(&out)])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    while tmp_len().is_none_or(|len| len <= 1 << 20) {
        assert!(child.try_wait().unwrap().is_none(), "logits ended before it was killed");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(names(&dir).len(), 4, "the killed run's temporary file: {:?}", names(&dir));
    let o = kvm_in(&["logits", "--model", s(&m), "--tokens", "1,2", "--out", s(&out)], b"");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(names(&dir), ["ids.txt", "m.kvm", "out.npy"], "the stale temporary file is left");
    std::fs::remove_dir_all(dir).ok();
}

/// Runs `kvm args` in `dir` with standard input read from the file `stdin`.
fn kvm_with_stdin_file(dir: &Path, args: &[&str], stdin: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvm"))
        .args(args)
        .current_dir(dir)
        .stdin(std::fs::File::open(stdin).unwrap())
        .output()
        .unwrap()
}

/// Standard input is an input of the run: a prompt or a chat script read from a file is
/// never replaced by an output written to that file.
#[test]
fn the_file_on_standard_input_is_an_input() {
    let dir = fresh_dir("stdin");
    let m = model_in(&dir);
    let text = dir.join("p.txt");
    std::fs::write(&text, "In the beginning").unwrap();
    let refused = ["p.txt is the file standard input reads", "write the output somewhere else"];
    for args in [
        &["generate", "--model", s(&m), "--prompt", "-", "-n", "1", "--save-state", "p.txt"][..],
        &["logits", "--model", s(&m), "--prompt", "-", "--out", "p.txt"],
    ] {
        let o = kvm_with_stdin_file(&dir, args, &text);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && o.stdout.is_empty(), "{args:?}: {err}");
        assert!(err.lines().count() == 1 && refused.iter().all(|r| err.contains(r)), "{args:?}: {err}");
        assert_eq!(std::fs::read_to_string(&text).unwrap(), "In the beginning");
    }
    // A chat's script: `/save` onto it is an error, and the chat goes on.
    let script = dir.join("script.txt");
    let lines = "/save script.txt\n/save other.state\n";
    std::fs::write(&script, lines).unwrap();
    let o = kvm_with_stdin_file(&dir, &["chat", "--model", "m.kvm", "-n", "1"], &script);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("script.txt is the file standard input reads") && err.contains("(saved to other.state)"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&script).unwrap(), lines);
    assert_eq!(names(&dir), ["m.kvm", "other.state", "p.txt", "script.txt"]);
    std::fs::remove_dir_all(dir).ok();
}

/// `/save` and `/load` without a file are usage errors of the chat, not words to the
/// model.
#[test]
fn chat_commands_without_their_file_are_usage_errors() {
    let m = repo().join("models/tiny-kjv-q8_0.kvm");
    let o = kvm_in(&["chat", "--model", s(&m), "-n", "4"], b"/save\n/load   \n/save \n");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(o.stdout.is_empty(), "the model replied: {}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(err.matches("kvm: error: /save needs a file: /save FILE").count(), 2, "{err}");
    assert_eq!(err.matches("kvm: error: /load needs a file: /load FILE").count(), 1, "{err}");
}
