//! The `kvm` command line's limits: every numeric flag is checked against its stated range
//! before any work starts (the error echoing the value as typed), and generating,
//! tokenizing and benchmarking hold memory that does not grow with the run.

use std::path::PathBuf;
use std::process::Command;

use kvm_test_support::repo;

fn tiny() -> PathBuf {
    repo().join("models/tiny-kjv-q8_0.kvm")
}

fn kvm(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvm")).args(args).output().unwrap()
}

/// Peak resident memory of `kvm args` in KiB (which must succeed).
fn peak_rss_kib(args: &[&str]) -> u64 {
    crate::cli::peak_rss(args) >> 10
}

/// Asserts that `kvm args` fails before doing anything, with one line `kvm: error: ...`
/// naming `flag`, the value as typed and `range`, and the exit code of a usage error (2).
fn refused(args: &[&str], flag: &str, value: &str, range: &str) {
    let out = kvm(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.starts_with("kvm: error: ") && err.lines().count() == 1, "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?} printed {}", String::from_utf8_lossy(&out.stdout));
    assert!(err.contains(flag) && err.contains(&format!("'{value}'")) && err.contains(range), "{args:?}: {err}");
    assert!(!err.contains("panicked") && !err.contains("internal error"), "{args:?}: {err}");
}

#[test]
fn numeric_flags_out_of_range_are_refused_as_typed() {
    let m = tiny();
    let m = m.to_str().unwrap();
    let gen = |extra: &[&'static str]| -> Vec<&str> {
        let mut v = vec!["generate", "--model", m, "--prompt", "In", "-n", "4"];
        v.extend_from_slice(extra);
        v
    };
    for (flag, value, range) in [
        ("--temperature", "1e39", "[0, 100]"),
        ("--temperature", "-1", "[0, 100]"),
        ("--temperature", "NaN", "[0, 100]"),
        ("--top-p", "0", "(0, 1]"),
        ("--min-p", "1.5", "[0, 1]"),
        ("--repeat-penalty", "inf", "(0, 100]"),
        ("--repeat-window", "257", "[0, 256]"),
        ("--threads", "1000", "[1, 256]"),
        ("--threads", "0", "[1, 256]"),
        ("--max-time", "1e20", "(0, 1000000000]"),
        ("--max-time", "1e300", "(0, 1000000000]"),
        ("--max-time", "0", "(0, 1000000000]"),
    ] {
        refused(&gen(&[flag, value]), flag, value, range);
    }
    refused(&gen(&["--json", "--logprobs", "1001"]), "--logprobs", "1001", "[0, 1000]");
    for cmd in ["chat", "perplexity", "logits", "bench"] {
        let mut args = vec![cmd, "--model", m, "--threads", "1000"];
        match cmd {
            "perplexity" => args.extend(["--text", "x.txt"]),
            "logits" => args.extend(["--tokens", "1", "--out", "x.npy"]),
            _ => {}
        }
        refused(&args, "--threads", "1000", "[1, 256]");
    }
    refused(&["bench", "--model", m, "--threads", "1,0"], "--threads", "0", "[1, 256]");
    for (flag, value, range) in [
        ("--bw-mib", "16385", "[0, 16384]"),
        ("--prompt-len", "100000000000", "[1, 16777216]"),
        ("--prompt-len", "0", "[1, 16777216]"),
        ("--gen", "4294967296", "[1, 4294967295]"),
        ("--context", "16777217", "[0, 16777216]"),
        ("--round-trip", "1025", "[0, 1024]"),
        ("--runs", "1001", "[1, 1000]"),
        ("--window", "0", "[1, 16777216]"),
        ("--checkpoints", "0", "[1, 4294967295]"),
    ] {
        refused(&["bench", "--model", m, flag, value], flag, value, range);
    }
    // Values at the ends of the ranges run.
    let out = kvm(&gen(&["--temperature", "100", "--threads", "1", "--max-time", "1e9", "--repeat-window", "256"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Usage errors are the one line every other error is (`kvm: error: ...`), with clap's
/// exit code for them, 2; help and the version print as ever.
#[test]
fn usage_errors_are_one_line() {
    let m = tiny();
    let m = m.to_str().unwrap();
    let out = kvm(&["generate", "--model", m, "--temperature", "NaN"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "kvm: error: invalid value 'NaN' for '--temperature <TEMPERATURE>': must be in [0, 100]\n"
    );
    for (args, needle) in [
        (&["generate", "--prompt", "In"][..], "--model <MODEL>"),
        (&["generate", "--model", m, "--seeds", "1"], "unexpected argument '--seeds' found (tip: "),
        (&["nonsense"], "unrecognized subcommand 'nonsense'"),
    ] {
        let out = kvm(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.starts_with("kvm: error: ") && err.lines().count() == 1 && err.contains(needle), "{args:?}: {err}");
    }
    for args in [&["--help"][..], &["--version"], &["generate", "--help"]] {
        let out = kvm(args);
        assert!(out.status.success() && out.stderr.is_empty() && !out.stdout.is_empty(), "{args:?}");
    }
}

/// Every sampler flag's range is the C API's (one table, `kvm_core::sampler::ranges`): each bound runs
/// when it is in its range and is refused when not, and so is the nearest value beyond it.
#[test]
fn the_sampler_flags_take_the_c_apis_ranges() {
    use kvm_core::sampler::ranges;
    use std::ops::Bound::{Excluded, Included, Unbounded};
    let m = tiny();
    let m = m.to_str().unwrap();
    // `--flag=value`: clap takes `-1e-45` for a flag otherwise.
    let args = |flag: &str, value: &str| {
        ["generate", "--model", m, "--prompt", "In", "-n", "0", &format!("{flag}={value}")].map(String::from)
    };
    let run = |flag: &str, value: &str| kvm(&args(flag, value).each_ref().map(String::as_str));
    let next = |v: f32, up: bool| match (v == 0.0, up == (v > 0.0)) {
        (true, _) => f32::from_bits(1).copysign(if up { 1.0 } else { -1.0 }),
        (false, true) => f32::from_bits(v.to_bits() + 1),
        (false, false) => f32::from_bits(v.to_bits() - 1),
    };
    let flags = [
        ("--temperature", ranges::TEMPERATURE),
        ("--top-p", ranges::TOP_P),
        ("--min-p", ranges::MIN_P),
        ("--repeat-penalty", ranges::REPEAT_PENALTY),
    ];
    for (flag, range) in flags {
        // As the flags state it: `[lo, hi]`, `(lo, hi]`.
        let ends = |b| match b {
            Included(v) => ('[', v, ']'),
            Excluded(v) => ('(', v, ')'),
            Unbounded => unreachable!("every range is bounded"),
        };
        let ((open, lo, _), (_, hi, close)) = (ends(range.0), ends(range.1));
        let stated = format!("{open}{lo}, {hi}{close}");
        for (bound, up) in [(range.0, false), (range.1, true)] {
            let (Included(v) | Excluded(v)) = bound else { unreachable!() };
            let ran = |x: f32| run(flag, &format!("{x:?}")).status.success();
            assert_eq!(ran(v), matches!(bound, Included(_)), "{flag} {v:?}");
            let beyond = format!("{:?}", next(v, up));
            refused(&args(flag, &beyond).each_ref().map(String::as_str), flag, &beyond, &stated);
            assert!(ran(next(v, !up)), "{flag} {:?}", next(v, !up));
        }
    }
    let (Included(0), Included(hi)) = ranges::REPEAT_WINDOW else { panic!("{:?}", ranges::REPEAT_WINDOW) };
    assert!(run("--repeat-window", &hi.to_string()).status.success());
    assert!(run("--repeat-window", "0").status.success());
    let over = (hi + 1).to_string();
    refused(
        &["generate", "--model", m, "--prompt", "In", "-n", "0", "--repeat-window", &over],
        "--repeat-window",
        &over,
        &format!("[0, {hi}]"),
    );
}

#[test]
fn json_and_raw_together_are_refused() {
    let m = tiny();
    let out = kvm(&["generate", "--model", m.to_str().unwrap(), "--prompt", "In", "-n", "2", "--json", "--raw"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.stdout.is_empty(), "{err}");
    assert!(err.contains("--json") && err.contains("--raw"), "{err}");
}

#[test]
fn any_token_budget_runs_in_constant_memory() {
    let m = tiny();
    let m = m.to_str().unwrap();
    // Budgets no memory could hold a token of each: they end by the time limit.
    for n in ["100000000000", "4611686018427387904", &u64::MAX.to_string()] {
        let out = kvm(&["generate", "--model", m, "--prompt", "In", "-n", n, "--max-time", "0.3", "--threads", "1"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "-n {n}: {err}");
        assert!(err.contains("ended by time"), "-n {n}: {err}");
    }
    // 79,000 tokens more hold no more memory (within noise): a byte each (the text) and
    // four (the ids) would be 386 KiB more. The peak of one command moves by up to ~300
    // KiB from run to run (page-ins, the allocator), either way: the least of three runs
    // is each length's steady figure.
    let run = |n: &str| {
        let args = ["generate", "--model", m, "--prompt", "In", "-n", n, "--ignore-eos", "--threads", "1"];
        (0..3).map(|_| peak_rss_kib(&args)).min().expect("three runs")
    };
    let (short, long) = (run("1000"), run("80000"));
    assert!(long <= short + 160, "peak RSS {short} KiB for 1,000 tokens, {long} KiB for 80,000");
}

#[test]
fn tokenizing_holds_the_text_and_its_ids_only() {
    let text: PathBuf = std::env::temp_dir().join(format!("kvm-limits-{}-text.txt", std::process::id()));
    // 4 MB of varied lines.
    let line = "And God said, Let there be light: and there was light. 0123456789\n";
    std::fs::write(&text, line.repeat(4_000_000 / line.len())).unwrap();
    let len = std::fs::metadata(&text).unwrap().len() / 1024;
    let m = tiny();
    let m = m.to_str().unwrap();
    let base = peak_rss_kib(&["tokenize", "--model", m, "x"]);
    for json in [false, true] {
        let mut args = vec!["tokenize", "--model", m, "--prompt-file", text.to_str().unwrap()];
        if json {
            args.push("--json");
        }
        let kib = peak_rss_kib(&args);
        // The text, and its ids at 4 bytes each (byte-level: one a byte), with room for
        // noise: each id as a `String` or a JSON value would take 40 bytes or more.
        assert!(kib <= base + 12 * len, "{args:?}: peak RSS {kib} KiB for {len} KiB of text ({base} KiB for none)");
    }
    std::fs::remove_file(&text).ok();
}

#[test]
fn the_bandwidth_probe_holds_a_bounded_buffer() {
    let m = tiny();
    let args = ["bench", "--model", m.to_str().unwrap(), "--prompt-len", "8", "--gen", "8", "--threads", "1", "--json"];
    let kib = peak_rss_kib(&args);
    // The default probe reads 256 MiB.
    assert!(kib < 300 << 10, "peak RSS {kib} KiB");
}

/// Runs `kvm args` with no stdin and its address space limited to `kib` KiB (`ulimit -v`).
fn kvm_in_kib(kib: u64, args: &[&str]) -> std::process::Output {
    Command::new("sh")
        .args(["-c", &format!("ulimit -v {kib} && exec \"$0\" \"$@\""), env!("CARGO_BIN_EXE_kvm")])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// Model files whose config asks for more memory than a process may have are an error of
/// one line, exit 1, for every command that builds a session: never an abort by signal.
#[test]
fn out_of_memory_is_an_error_of_every_command_that_builds_a_session() {
    use kvm_export::synth::{growable, synth, Preset, SQRT16};
    use kvm_write::policy::Policy;
    let dir = std::env::temp_dir().join(format!("kvm-limits-{}-oom", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = Policy::uniform(kvm_core::quant::DType::F32);
    // A growable state with room for a million tokens: 568 KB of file, a 37 MB arena.
    let sqrt = dir.join("sqrt.kvm");
    synth(&sqrt, &growable(Preset::Tiny.config(), SQRT16, 1_000_000).unwrap(), &policy, 1, &mut |_| {}).unwrap();
    // A window of 2^20 tokens: as small a file, an arena past 1 GiB at any state size.
    let wide = dir.join("wide.kvm");
    let cfg = kvm_core::config::Config { chunk_len: 1 << 16, window_chunks: 16, ..Preset::Tiny.config() };
    synth(&wide, &cfg, &policy, 1, &mut |_| {}).unwrap();
    let arena = kvm_core::Model::from_bytes(&std::fs::read(&wide).unwrap()).unwrap().arena_len();
    assert!(arena > 1 << 30, "{arena}");
    let text = dir.join("text.txt");
    std::fs::write(&text, "In the beginning").unwrap();
    let out = dir.join("out.npy");
    for (model, kib) in [(&sqrt, 45_000), (&wide, 1_000_000)] {
        let m = model.to_str().unwrap();
        let mut runs = vec![
            vec!["generate", "--model", m, "--prompt", "In", "-n", "2"],
            vec!["perplexity", "--model", m, "--text", text.to_str().unwrap()],
            vec!["logits", "--model", m, "--tokens", "1,2", "--out", out.to_str().unwrap()],
            vec!["chat", "--model", m],
        ];
        // `kvm bench` sizes each run's arena to the slots it reaches: the window's.
        if model == &wide {
            runs.push(vec!["bench", "--model", m, "--prompt-len", "1", "--gen", "1", "--bw-mib", "0"]);
        }
        for args in runs {
            let o = kvm_in_kib(kib, &args);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{args:?} under {kib} KiB: {:?}: {err}", o.status);
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            assert!(err.starts_with("kvm: error: ") && err.contains("out of memory"), "{args:?}: {err}");
            assert!(!out.exists());
        }
    }
    std::fs::remove_dir_all(dir).ok();
}
