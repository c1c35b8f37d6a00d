//! Sets `--cfg kvm_arm_dsp` when the target is 32-bit Arm and its code generation has the
//! DSP extension (`smlad`, `sxtb16`), which selects the `dsp` kernel tier at compile time.
//!
//! rustc does not expose Arm's `dsp` as a stable `target_feature`, so this asks the
//! compiler itself: it compiles one `smlad` for the target with the build's own flags
//! (`thumbv7em` has the extension; `thumbv8m.main` has it with `-C target-cpu=cortex-m33`
//! or `-C target-feature=+dsp`; `thumbv6m` and `thumbv7m` never do).

use std::env;
use std::path::PathBuf;
use std::process::{Command, Stdio};

const PROBE: &str = r#"#![no_std]
pub fn probe(a: u32, b: u32, c: u32) -> u32 {
    let r: u32;
    unsafe { core::arch::asm!("smlad {0}, {1}, {2}, {3}", out(reg) r, in(reg) a, in(reg) b, in(reg) c) };
    r
}
"#;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kvm_arm_dsp)");
    println!("cargo:rerun-if-changed=build.rs");
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("arm") && has_dsp() {
        println!("cargo:rustc-cfg=kvm_arm_dsp");
    }
}

/// Whether an `smlad` compiles for the target with the flags cargo passes this build.
fn has_dsp() -> bool {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let src = out.join("dsp_probe.rs");
    if std::fs::write(&src, PROBE).is_err() {
        return false;
    }
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = env::var("TARGET").unwrap_or_default();
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    Command::new(rustc)
        .args(["--crate-type=lib", "--emit=obj", "--edition=2021", "--target", &target])
        .args(flags.split('\x1f').filter(|f| !f.is_empty()))
        .arg("-o")
        .arg(out.join("dsp_probe.o"))
        .arg(&src)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
