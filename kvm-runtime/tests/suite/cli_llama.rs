//! The everyday tools of a llama.cpp user, end to end on the bundled model: prompts from
//! files and stdin, stop strings and the other generation controls, log-probabilities,
//! raw bytes, state files, state capacity, `kvm chat` and `kvm bench`'s sweeps.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use kvm_test_support::repo;

use crate::kvm_in;
use serde_json::Value;

fn bundled() -> String {
    repo().join("models/tiny-kjv-q8_0.kvm").to_str().unwrap().to_string()
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kvm-llama-{}-{name}", std::process::id()))
}

/// Runs `kvm ARGS`, which must succeed: its stdout.
fn ok(args: &[&str], stdin: &[u8]) -> Vec<u8> {
    let o = kvm_in(args, stdin);
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    o.stdout
}

/// `kvm generate --model BUNDLED ARGS --json`, greedy unless ARGS say otherwise.
fn generate(args: &[&str], stdin: &[u8]) -> Value {
    let m = bundled();
    let all = [&["generate", "--model", &m, "--temperature", "0"][..], args, &["--json"]].concat();
    serde_json::from_slice(&ok(&all, stdin)).unwrap()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

/// The bytes of byte-level token ids.
fn bytes_of(ids: &[u64]) -> Vec<u8> {
    ids.iter().map(|&i| u8::try_from(i).unwrap()).collect()
}

/// Runs `args`, which must fail with one line on stderr containing `needle`.
fn fails_saying(args: &[&str], needle: &str) {
    let o = kvm_in(args, b"");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{args:?} succeeded");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: `{needle}` not in {err}");
}

#[test]
fn prompts_come_from_arguments_files_and_stdin_alike() {
    let m = bundled();
    let prompt = "In the beginning God created";
    let file = tmp("prompt.txt");
    std::fs::write(&file, prompt).unwrap();
    let f = file.to_str().unwrap();
    let by_arg = generate(&["--prompt", prompt, "-n", "12"], b"");
    assert_eq!(bytes_of(&ids(&by_arg["prompt_ids"])), prompt.as_bytes());
    for (args, stdin) in [(["--prompt-file", f], &b""[..]), (["--prompt", "-"], prompt.as_bytes())] {
        let got = generate(&[&args[..], &["-n", "12"]].concat(), stdin);
        assert_eq!((&got["prompt_ids"], &got["generated_ids"]), (&by_arg["prompt_ids"], &by_arg["generated_ids"]));
    }
    let tokens = |args: &[&str], stdin: &[u8]| {
        String::from_utf8(ok(&[&["tokenize", "--model", &m][..], args].concat(), stdin)).unwrap()
    };
    let want = tokens(&[prompt], b"");
    assert_eq!(want.split_whitespace().count(), prompt.len());
    assert_eq!(tokens(&["-"], prompt.as_bytes()), want);
    assert_eq!(tokens(&["--prompt-file", f], b""), want);
    let score = |args: &[&str], stdin: &[u8]| -> Value {
        serde_json::from_slice(&ok(&[&["perplexity", "--model", &m, "--json"][..], args].concat(), stdin)).unwrap()
    };
    assert_eq!(score(&["--text", f], b""), score(&["--text", "-"], prompt.as_bytes()));

    // A prompt far longer than a shell argument, fed in pieces: its first pick is the
    // argmax of the last row of its logits.
    let long: String = prompt.repeat(200);
    std::fs::write(&file, &long).unwrap();
    let g = generate(&["--prompt-file", f, "-n", "3"], b"");
    assert_eq!(g["prompt_ids"].as_array().unwrap().len(), long.len());
    // The progress line is for terminals only: none in a pipe.
    let o = kvm_in(&["generate", "--model", &m, "--prompt-file", f, "-n", "1"], b"");
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(o.status.success() && err.lines().count() == 1 && err.starts_with("prompt: 5600 tokens"), "{err}");
    let npy = tmp("long.npy");
    ok(&["logits", "--model", &m, "--prompt-file", f, "--out", npy.to_str().unwrap()], b"");
    let raw = std::fs::read(&npy).unwrap();
    let header_len = u16::from_le_bytes([raw[8], raw[9]]) as usize;
    let values: Vec<f32> =
        raw[10 + header_len..].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(values.len(), long.len() * 256);
    let last = &values[values.len() - 256..];
    let argmax = (0..256).fold(0, |best, i| if last[i] > last[best] { i } else { best });
    assert_eq!(ids(&g["generated_ids"])[0], argmax as u64);
    for p in [file, npy] {
        std::fs::remove_file(p).ok();
    }
}

#[test]
fn stop_strings_end_the_text_before_them() {
    let m = bundled();
    let full = generate(&["--prompt", "In the beginning", "-n", "80"], b"");
    let text = full["text"].as_str().unwrap().to_string();
    assert_eq!(full["end"], "length");
    // Three bytes from the middle: a stop string spanning three tokens, found where it
    // first occurs.
    let stop = &text[30..33];
    let at = text.find(stop).unwrap();
    let stopped = generate(&["--prompt", "In the beginning", "-n", "80", "--stop", stop, "--stop", "never seen"], b"");
    assert_eq!(stopped["end"], "stop");
    assert_eq!(stopped["text"].as_str().unwrap(), &text[..at]);
    assert!(text.starts_with(stopped["text"].as_str().unwrap()));
    // Streaming writes the same, the stop string held back and never printed.
    let o = ok(
        &["generate", "--model", &m, "--prompt", "In the beginning", "-n", "80", "--temperature", "0", "--stop", stop],
        b"",
    );
    assert_eq!(String::from_utf8(o).unwrap(), format!("In the beginning{}\n", &text[..at]));
    let none = generate(&["--prompt", "In the beginning", "-n", "80", "--stop", "never seen"], b"");
    assert_eq!(none["text"], full["text"]);
}

#[test]
fn logprobs_are_the_models_and_the_top_one_is_the_greedy_pick() {
    let g = generate(&["--prompt", "And God said", "-n", "16", "--logprobs", "5", "--top-k", "7"], b"");
    let tokens = g["tokens"].as_array().unwrap();
    assert_eq!(ids(&g["generated_ids"]), tokens.iter().map(|t| t["id"].as_u64().unwrap()).collect::<Vec<_>>());
    for t in tokens {
        let lp = t["logprob"].as_f64().unwrap();
        let top = t["top"].as_array().unwrap();
        assert_eq!(top.len(), 5);
        assert_eq!(top[0]["id"], t["id"], "{t}");
        assert_eq!(top[0]["logprob"].as_f64().unwrap(), lp);
        let lps: Vec<f64> = top.iter().map(|x| x["logprob"].as_f64().unwrap()).collect();
        assert!(lps.iter().all(|&x| x <= 0.0) && lps.windows(2).all(|w| w[0] >= w[1]), "{t}");
        let mass: f64 = lps.iter().map(|x| x.exp()).sum();
        assert!(mass > 0.0 && mass <= 1.0 + 1e-9, "{t}");
    }
    let s = &g["sampler"];
    assert_eq!((s["temperature"].as_f64(), s["top_k"].as_u64(), s["top_p"].as_f64()), (Some(0.0), Some(7), Some(0.95)));
    assert_eq!((s["seed"].as_u64(), s["n_tokens"].as_u64()), (Some(0), Some(16)));
}

#[test]
fn max_time_ends_a_long_generation() {
    let t0 = std::time::Instant::now();
    let g = generate(&["--prompt", "In", "-n", "100000000", "--max-time", "0.3"], b"");
    assert_eq!(g["end"], "time");
    let n = g["generated_ids"].as_array().unwrap().len();
    assert!(n > 0 && n < 100_000_000, "{n}");
    assert!(t0.elapsed().as_secs_f64() < 30.0, "{:?}", t0.elapsed());
    for t in ["0", "1e20", "1e300", "NaN"] {
        let o = kvm_in(&["generate", "--model", &bundled(), "--prompt", "In", "--max-time", t], b"");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "--max-time {t}: {err}");
        assert!(err.contains(&format!("'{t}'")) && err.contains("(0, 1000000000]"), "--max-time {t}: {err}");
    }
}

#[test]
fn raw_output_writes_the_exact_bytes() {
    let m = bundled();
    let prompt = b"In the \xff\xfe beginning";
    let file = tmp("raw.txt");
    std::fs::write(&file, prompt).unwrap();
    let f = file.to_str().unwrap();
    let g = generate(&["--prompt-file", f, "-n", "20"], b"");
    let gen = bytes_of(&ids(&g["generated_ids"]));
    let args = ["generate", "--model", &m, "--prompt-file", f, "-n", "20", "--temperature", "0"];
    let raw = ok(&[&args[..], &["--raw"]].concat(), b"");
    assert_eq!(raw, [&prompt[..], &gen, b"\n"].concat());
    let text = ok(&args, b"");
    assert_eq!(text, format!("{}\n", String::from_utf8_lossy(&[&prompt[..], &gen].concat())).into_bytes());
    assert!(String::from_utf8(text).unwrap().starts_with("In the \u{fffd}\u{fffd} beginning"));
    std::fs::remove_file(file).ok();
}

#[test]
fn a_saved_prompt_state_continues_as_the_full_prompt_does() {
    let m = bundled();
    let state = tmp("prefix.state");
    let s = state.to_str().unwrap();
    let saved = generate(&["--prompt", "In the beginning", "-n", "0", "--save-state", s], b"");
    assert_eq!(saved["generated_ids"], serde_json::json!([]));
    // The snapshot's size is the state's and the logits', whatever the prompt (info
    // prints both: "(538688 of state, 1024 more with logits)").
    let info = String::from_utf8(ok(&["info", "--model", &m], b"")).unwrap();
    let line = info.lines().find(|l| l.starts_with("arena (f32)")).unwrap();
    let sizes: Vec<&str> = line.split('(').nth(2).unwrap().split(' ').collect();
    let (state_bytes, logits_bytes): (u64, u64) = (sizes[0].parse().unwrap(), sizes[3].parse().unwrap());
    assert_eq!(std::fs::metadata(&state).unwrap().len(), state_bytes + logits_bytes);
    assert_eq!(state_bytes, 538_688, "docs/cli.md states this size");
    assert_eq!(logits_bytes, 4 * 256, "4 bytes per vocabulary id");
    let resumed = generate(&["--load-state", s, "--prompt", " God", "-n", "40"], b"");
    let whole = generate(&["--prompt", "In the beginning God", "-n", "40"], b"");
    assert_eq!(resumed["generated_ids"], whole["generated_ids"]);
    assert_eq!(resumed["text"], whole["text"]);
    // Bound to its session's layout: another cache dtype cannot take it.
    fails_saying(
        &["generate", "--model", &m, "--cache", "f16", "--load-state", s, "--prompt", " God"],
        "is not a state of this session",
    );
    std::fs::remove_file(state).ok();
}

#[test]
fn state_slots_are_checked_against_the_model() {
    let m = bundled();
    let gen =
        |slots: &'static str| vec!["generate", "--model", &m, "--prompt", "In", "-n", "2", "--state-slots", slots];
    fails_saying(&gen("31"), "--state-slots 31 is below 32");
    fails_saying(&gen("33"), "--state-slots 33 is above 32");
    assert_eq!(
        generate(&["--prompt", "In", "-n", "5", "--state-slots", "32"], b"")["generated_ids"],
        generate(&["--prompt", "In", "-n", "5"], b"")["generated_ids"]
    );

    // A growable-state model: fewer slots, a smaller arena, the same text to score.
    let model = tmp("growable.kvm");
    kvm_export::convert::convert(
        &kvm_test_support::golden_dir("growable_power_law"),
        &model,
        &kvm_write::policy::Policy::uniform(kvm_core::quant::DType::F32),
        &kvm_export::convert::TokenizerSource::Auto,
        &mut |_| {},
    )
    .unwrap();
    let g = model.to_str().unwrap();
    let info = String::from_utf8(ok(&["info", "--model", g], b"")).unwrap();
    let range = info.split("--state-slots ").nth(1).unwrap().split(')').next().unwrap();
    let (lo, hi) = range.split_once("..=").unwrap();
    assert!(lo.parse::<u32>().unwrap() < hi.parse::<u32>().unwrap(), "{range}");
    let bench = |slots: &str| -> Value {
        let args = [
            "bench",
            "--model",
            g,
            "--prompt-len",
            "8",
            "--gen",
            "2",
            "--bw-mib",
            "0",
            "--json",
            "--state-slots",
            slots,
        ];
        serde_json::from_slice(&ok(&args, b"")).unwrap()
    };
    let (small, big) = (bench(lo), bench(hi));
    assert_eq!(small["state_len"].as_u64(), lo.parse().ok());
    assert!(small["arena_bytes"].as_u64() < big["arena_bytes"].as_u64(), "{small} {big}");
    let text = tmp("growable.txt");
    std::fs::write(&text, [7u8, 3, 9, 12, 5, 40, 2, 8, 1, 30].repeat(20)).unwrap();
    let score = |slots: &str| -> f64 {
        let args = ["perplexity", "--model", g, "--text", text.to_str().unwrap(), "--json", "--state-slots", slots];
        serde_json::from_slice::<Value>(&ok(&args, b"")).unwrap()["bits_per_token"].as_f64().unwrap()
    };
    assert!(score(lo).is_finite() && score(hi).is_finite());
    fails_saying(&["perplexity", "--model", g, "--text", text.to_str().unwrap(), "--state-slots", "1"], "is below");
    for f in [model, text] {
        std::fs::remove_file(f).ok();
    }
}

/// `kvm chat` on the bundled model, greedy, replies of `n` tokens, `extra` flags; `input`
/// piped in: its stdout's lines (one a reply, as no reply here holds a newline).
fn chat(n: &str, extra: &[&str], input: &str) -> Vec<String> {
    let m = bundled();
    let args = [&["chat", "--model", &m, "--temperature", "0", "-n", n, "--stop", "\n"][..], extra].concat();
    String::from_utf8(ok(&args, input.as_bytes())).unwrap().lines().map(str::to_string).collect()
}

#[test]
fn chat_keeps_one_session_across_turns() {
    let m = bundled();
    let (sys, user, bot) = ("The words of the LORD.\n", "Q: ", "A:");
    let flags = ["--system", sys, "--user-prefix", user, "--assistant-prefix", bot];
    let m2 = m.clone();
    // Replies of 12 tokens, none of them newlines: what generate gives the same text.
    let replies = {
        let args = [&["chat", "--model", &m2, "--temperature", "0", "-n", "12"][..], &flags[..]].concat();
        ok(&args, b"And God said\nLet there be\n")
    };
    let replies = String::from_utf8(replies).unwrap();
    let replies: Vec<&str> = replies.split('\n').collect();
    let first_prompt = format!("{sys}{user}And God said\n{bot}");
    let first = generate(&["--prompt", &first_prompt, "-n", "12"], b"");
    let r1 = first["text"].as_str().unwrap();
    assert!(!r1.contains('\n'), "{r1:?}: pick other prompts");
    assert_eq!(replies[0], r1);
    // The second turn continues the first: the state holds the whole conversation.
    let second_prompt = format!("{first_prompt}{r1}{user}Let there be\n{bot}");
    let second = generate(&["--prompt", &second_prompt, "-n", "12"], b"");
    assert_eq!(replies[1], second["text"].as_str().unwrap());
}

#[test]
fn chat_saves_loads_and_resets_and_a_failed_load_changes_nothing() {
    let state = tmp("chat.state");
    let junk = tmp("junk.state");
    std::fs::write(&junk, vec![7u8; 538_688]).unwrap();
    let (s, j) = (state.to_str().unwrap(), junk.to_str().unwrap());
    let input = format!("And God said\n/save {s}\n/load /nonexistent/x\n/load {j}\nthe earth\n/reset\n/load {s}\nthe earth\n/reset\nthe earth\n");
    let lines = chat("20", &[], &input);
    assert_eq!(lines.len(), 4, "{lines:?}");
    // After the failed loads, after restoring the saved state: the same reply.
    assert_eq!(lines[1], lines[2]);
    // After /reset, as from a fresh session.
    assert_eq!(lines[3], chat("20", &[], "the earth\n")[0]);
    assert_ne!(lines[2], lines[3]);
    std::fs::remove_file(junk).ok();
    std::fs::remove_file(state).ok();
}

/// The peak resident memory of `kvm ARGS` reading `input`, as its `VmHWM` last read.
fn peak_rss_with_input(args: &[&str], input: &Path) -> u64 {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvm"))
        .args(args)
        .stdin(std::fs::File::open(input).unwrap())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    loop {
        let status = std::fs::read_to_string(&status_file).unwrap_or_default();
        let hwm = status.lines().find_map(|l| l.strip_prefix("VmHWM:"));
        if let Some(kb) = hwm.and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()) {
            peak = peak.max(kb * 1024);
        }
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{args:?}: {status:?}");
            return peak;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn chat_memory_stays_flat_over_a_thousand_turns() {
    let m = bundled();
    let run = |turns: usize| {
        let input = tmp(&format!("turns-{turns}.txt"));
        std::fs::write(&input, "And God\n".repeat(turns)).unwrap();
        let args = ["chat", "--model", &m, "-n", "2", "--threads", "1"];
        let peak = peak_rss_with_input(&args, &input);
        std::fs::remove_file(input).ok();
        peak
    };
    let (short, long) = (run(100), run(1000));
    // Any buffer a turn left behind (an arena, the sampler's scratch, a prefill batch: each
    // several KB or more) would add megabytes over the 900 extra turns.
    assert!(long <= short + (256 << 10), "peak memory {short} bytes after 100 turns, {long} after 1000");
}

#[test]
fn ctrl_c_stops_the_reply_and_returns_to_the_prompt() {
    use std::io::Read;
    let m = bundled();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvm"))
        .args(["chat", "--model", &m, "-n", "100000000", "--threads", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let pid = child.id() as libc::pid_t;
    for turn in ["In the beginning\n", "And God said\n"] {
        stdin.write_all(turn.as_bytes()).unwrap();
        stdin.flush().unwrap();
        // The reply is streaming: interrupt it.
        let mut buf = [0u8; 64];
        stdout.read_exact(&mut buf).unwrap();
        // SAFETY: signals our own child, which is alive (its output is still coming).
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    }
    drop(stdin);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{:?}: {err}", o.status);
    assert_eq!(err.matches("(stopped)").count(), 2, "{err}");
}

#[test]
fn bench_sweeps_comma_lists_in_every_format() {
    let m = bundled();
    let base = ["bench", "--model", &m, "--prompt-len", "8,16", "--gen", "4", "--threads", "1,2", "--bw-mib", "0"];
    let json = String::from_utf8(ok(&[&base[..], &["--output", "json"]].concat(), b"")).unwrap();
    let runs: Vec<Value> = json.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let combos: Vec<(u64, u64)> =
        runs.iter().map(|r| (r["threads"].as_u64().unwrap(), r["prompt_len"].as_u64().unwrap())).collect();
    assert_eq!(combos, [(1, 8), (1, 16), (2, 8), (2, 16)]);
    for r in &runs {
        assert_eq!(r["gen"], 4);
        assert!(r["prefill_tok_s"].as_f64().unwrap() > 0.0 && r["decode_tok_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    // Not a terminal: JSON, as before.
    assert_eq!(String::from_utf8(ok(&base, b"")).unwrap().lines().count(), 4);
    let csv = String::from_utf8(ok(&[&base[..], &["--output", "csv"]].concat(), b"")).unwrap();
    let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(rows[0], ["model", "dtype", "params", "cache", "threads", "test", "tok/s", "slots", "peak MiB"]);
    // The slots after each prompt, and after 4 tokens decoded from an empty context.
    let slots: Vec<&str> = rows[1..].iter().map(|r| r[7]).collect();
    assert_eq!(slots, ["8", "4", "16", "4", "8", "4", "16", "4"]);
    let tests: Vec<(&str, &str)> = rows[1..].iter().map(|r| (r[4], r[5])).collect();
    assert_eq!(
        tests,
        [
            ("1", "pp8"),
            ("1", "tg4"),
            ("1", "pp16"),
            ("1", "tg4"),
            ("2", "pp8"),
            ("2", "tg4"),
            ("2", "pp16"),
            ("2", "tg4")
        ]
    );
    assert!(rows[1..].iter().all(|r| r[6].parse::<f64>().unwrap() > 0.0), "{csv}");
    let md = String::from_utf8(ok(&[&base[..], &["--output", "md"]].concat(), b"")).unwrap();
    let lines: Vec<&str> = md.lines().collect();
    assert_eq!(lines.len(), 2 + 8, "{md}");
    assert!(lines.iter().all(|l| l.starts_with('|') && l.ends_with('|')), "{md}");
    assert!(lines[2].contains("pp8") && lines[9].contains("tg4"), "{md}");
    fails_saying(&["bench", "--model", &m, "--gen", "40,50", "--checkpoints", "30"], "one long run");
}

/// A GPT-2-tokenizer model (50257 tokens) of the tiny preset's shapes whose logits always
/// favour the end-of-text token (50256) and tie every other: every vector 1 (so the final
/// norm's output sums to `d_model`), matrices small and deterministic, lm_head zero but
/// for the end-of-text row.
fn gpt2_model(path: &Path) {
    use kvm_core::format::{Role, TokenizerKind};
    let json = std::fs::read_to_string(repo().join("tests/data/tokenizers/gpt2/tokenizer.json")).unwrap();
    let section = kvm_write::tokenizer::build_section(&json).unwrap();
    let cfg = kvm_core::config::Config { vocab_len: 50257, ..kvm_export::synth::Preset::Tiny.config() };
    let mut source = |role: Role, layer: u16, rows: u32, cols: u32| -> anyhow::Result<Vec<f32>> {
        let n = rows as usize * cols as usize;
        if role == Role::LmHead {
            return Ok((0..n).map(|i| if i / cols as usize == 50256 { 0.01 } else { 0.0 }).collect());
        }
        if !role.is_matrix() {
            return Ok(vec![1.0; n]);
        }
        let salt = (role as usize * 131 + layer as usize * 7919) as u64;
        Ok((0..n as u64).map(|i| ((i * 2_654_435_761 + salt) % 1000) as f32 / 1000.0 * 0.2 - 0.1).collect())
    };
    let mut out = std::fs::File::create(path).unwrap();
    kvm_write::writer::write_model_to(
        &mut out,
        &cfg,
        (TokenizerKind::Bpe, &section),
        (kvm_core::cache::CacheDtype::F32, kvm_core::cache::SlotReads::Stored),
        &|_, _, _| kvm_core::quant::DType::F32,
        &mut source,
        &mut |_| {},
    )
    .unwrap();
}

#[test]
fn gpt2_models_end_at_end_of_text_unless_told_to_ignore_it_and_chat() {
    let model = tmp("gpt2.kvm");
    gpt2_model(&model);
    let m = model.to_str().unwrap();
    let gen = |extra: &[&str]| -> Value {
        let args = [
            &["generate", "--model", m, "--prompt", "Hello world", "-n", "5", "--temperature", "0", "--json"][..],
            extra,
        ]
        .concat();
        serde_json::from_slice(&ok(&args, b"")).unwrap()
    };
    let ended = gen(&[]);
    assert_eq!(ended["prompt_ids"], serde_json::json!([15496, 995]));
    assert_eq!((&ended["end"], &ended["generated_ids"]), (&"eos".into(), &serde_json::json!([])));
    // With the end-of-text token out of reach, every other logit ties: the lowest id, "!".
    let ignored = gen(&["--ignore-eos", "--logprobs", "2"]);
    assert_eq!((&ignored["end"], &ignored["generated_ids"]), (&"length".into(), &serde_json::json!([0, 0, 0, 0, 0])));
    assert_eq!(ignored["text"], "!!!!!");
    assert_eq!(ignored["tokens"][0]["top"][0]["id"], 50256, "logprobs are the model's, before the mask");
    let state = tmp("gpt2.state");
    let s = state.to_str().unwrap();
    let chat = |extra: &[&str]| {
        let args =
            [&["chat", "--model", m, "--temperature", "0", "-n", "3", "--user-prefix", "User: "][..], extra].concat();
        String::from_utf8(ok(&args, format!("Hello\n/save {s}\n/load {s}\nworld\n").as_bytes())).unwrap()
    };
    assert_eq!(chat(&["--ignore-eos"]), "!!!\n!!!\n");
    assert_eq!(chat(&[]), "\n\n");
    for f in [model, state] {
        std::fs::remove_file(f).ok();
    }
}
