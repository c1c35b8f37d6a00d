//! Links with `cortex-m-rt`'s `link.x` and the board's memory map, shared with the
//! firmware (`../mcu/memory-<board>.x`; `KVM_MCU_BOARD`, default from the target).

use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-env-changed=KVM_MCU_BOARD");
    let target = env::var("TARGET").unwrap_or_default();
    let board = env::var("KVM_MCU_BOARD")
        .unwrap_or_else(|_| if target.starts_with("thumbv8m") { "an505" } else { "an386" }.to_owned());
    let memory = manifest.join(format!("../mcu/memory-{board}.x"));
    let map = fs::read(&memory).unwrap_or_else(|e| {
        eprintln!("kvm-mcu-conformance build: board `{board}`: {}: {e}", memory.display());
        std::process::exit(1)
    });
    fs::write(out.join("memory.x"), map).expect("write memory.x");
    println!("cargo:rerun-if-changed={}", memory.display());
    println!("cargo:rustc-link-search={}", out.display());
    // Exactly once, and only here (see examples/mcu/build.rs).
    println!("cargo:rustc-link-arg-bins=-Tlink.x");
}
