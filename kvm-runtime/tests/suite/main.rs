//! kvm-runtime's integration suite, one binary: the `kvm` command line as a user runs it,
//! `kvm bench`'s reports, model files in memory, and what `kvm` writes and reads back.

mod bench;
mod cli;
mod cli_llama;
mod file;
mod limits;
mod outputs;

use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `kvm ARGS` with `stdin` as its input (written from a thread of its own, so a large
/// input cannot block on a full pipe), killed if it takes longer than a minute (a read of a
/// FIFO or a device that never ends).
fn kvm_in(args: &[&str], stdin: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvm"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_vec();
    let writer = std::thread::spawn(move || input.write_all(&stdin));
    // The watchdog kills the child by its pid: the output is read meanwhile, so that a
    // chatty child never blocks on a full pipe.
    let (done, fired) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let pid = child.id().to_string();
    let watchdog = {
        let (done, fired) = (done.clone(), fired.clone());
        std::thread::spawn(move || {
            let started = Instant::now();
            while !done.load(Ordering::Relaxed) {
                if started.elapsed() > Duration::from_secs(60) {
                    fired.store(true, Ordering::Relaxed);
                    Command::new("kill").args(["-9", &pid]).status().ok();
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let out = child.wait_with_output().unwrap();
    done.store(true, Ordering::Relaxed);
    watchdog.join().unwrap();
    assert!(!fired.load(Ordering::Relaxed), "{args:?} did not end");
    writer.join().unwrap().unwrap();
    out
}
