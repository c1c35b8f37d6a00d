//! Picks the board's memory map, links with the runtime's `link.x`, and reads the model
//! file at build time: it is validated here, its path is handed to `include_bytes!`, and
//! its arena and vocabulary sizes become the consts that size the firmware's statics. The
//! `heap` build links no model: only the heap's size is decided here.
//!
//! Inputs (environment):
//! - `KVM_MCU_MODEL`: the `.kvm` file to flash; relative paths are taken from this
//!   directory. Default `../../models/tiny-kjv-q8_0.kvm`.
//! - `KVM_MCU_BOARD`: `an385`, `an386`, `an505`, `an547`, `riscv32` or `riscv32imc`;
//!   default from the target (`thumbv6m` is an385, `thumbv8m.*` an505, `riscv32imc`
//!   riscv32imc, other `riscv32*` riscv32). riscv32imc is QEMU's `virt` board, as
//!   riscv32, with another CPU: it takes riscv32's map.
//!
//! ARMv6-M targets (`thumbv6m`) get `cfg(armv6m)`: the firmware traps unaligned accesses
//! there, as a Cortex-M0+ does.
//!
//! A memory map that places a `.kvm_model` section (an547: the model is too big for its
//! ITCM and goes in QSPI ROM) makes the firmware put the model there (`cfg(model_section)`);
//! the others keep it in `.rodata`, in FLASH with the code.
//! - `KVM_MCU_RAM_KIB`: shrinks the board's RAM region to this many KiB, so that statics
//!   and the reserved stack that do not fit fail the link.
//! - `KVM_MCU_ARENA_LEN`: overrides the arena size the firmware is built with (only to
//!   exercise its start-up check).
//! - `KVM_MCU_HEAP_KIB`: the `heap` build's heap, in KiB (default 1024).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

const DEFAULT_MODEL: &str = "../../models/tiny-kjv-q8_0.kvm";
/// The `heap` build's default heap: tiny-kjv's largest arena (the f32 cache's, 560,832
/// bytes), with room for a model twice its width.
const HEAP_KIB: usize = 1024;
/// Stack the link reserves below the top of RAM: the firmware's high-water mark is 5-6 KiB
/// on every board, dtype and cache.
const STACK_RESERVE: usize = 8 * 1024;

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for var in ["KVM_MCU_MODEL", "KVM_MCU_BOARD", "KVM_MCU_RAM_KIB", "KVM_MCU_ARENA_LEN", "KVM_MCU_HEAP_KIB"] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    // Memory map.
    let target = env::var("TARGET").unwrap_or_default();
    let board = env::var("KVM_MCU_BOARD").unwrap_or_else(|_| {
        if target.starts_with("thumbv6m") {
            "an385"
        } else if target.starts_with("thumbv8m") {
            "an505"
        } else if target.starts_with("riscv32imc-") {
            "riscv32imc"
        } else if target.starts_with("riscv32") {
            "riscv32"
        } else {
            "an386"
        }
        .to_owned()
    });
    let map_name = if board == "riscv32imc" { "riscv32" } else { &board };
    let memory = manifest.join(format!("memory-{map_name}.x"));
    let map =
        fs::read_to_string(&memory).unwrap_or_else(|e| fail(&format!("board `{board}`: {}: {e}", memory.display())));
    let map = match env::var("KVM_MCU_RAM_KIB") {
        Ok(v) => {
            let kib: usize = v.parse().unwrap_or_else(|_| fail(&format!("KVM_MCU_RAM_KIB=`{v}` is not a KiB count")));
            with_ram_len(&map, kib)
                .unwrap_or_else(|| fail(&format!("{}: no `RAM : ... LENGTH =` line", memory.display())))
        }
        Err(_) => map,
    };
    let (stack_bottom, arch_runtime) =
        if target.starts_with("riscv") { ("__estack", "riscv-rt") } else { ("_stack_end", "cortex-m-rt") };
    let map = format!(
        "{map}\n/* Added by build.rs: the statics leave at least {STACK_RESERVE} bytes of stack ({arch_runtime}'s \
         stack region is the rest of RAM). */\nASSERT(_stack_start - {stack_bottom} >= {STACK_RESERVE}, \
         \"kvm-mcu: the statics leave less than {STACK_RESERVE} bytes of RAM for the stack\");\n"
    );
    println!("cargo::rustc-check-cfg=cfg(armv6m)");
    if target.starts_with("thumbv6m") {
        println!("cargo:rustc-cfg=armv6m");
    }
    println!("cargo::rustc-check-cfg=cfg(model_section)");
    if map.contains(".kvm_model") {
        println!("cargo:rustc-cfg=model_section");
    }
    fs::write(out.join("memory.x"), map).expect("write memory.x");
    println!("cargo:rerun-if-changed={}", memory.display());
    println!("cargo:rustc-link-search={}", out.display());
    // Exactly once, and only here: twice fails with "region FLASH already defined".
    println!("cargo:rustc-link-arg-bins=-Tlink.x");
    // The rate of the firmware's tick counter, as run-qemu.sh's table: SysTick on the
    // processor clock on the Cortex-M boards; mcycle on RISC-V, which QEMU counts one per
    // instruction under -icount (a 1 GHz clock in virtual time).
    let tick_hz: u32 = match map_name {
        "an505" => 20_000_000,
        "an547" => 32_000_000,
        "riscv32" => 1_000_000_000,
        _ => 25_000_000,
    };
    let clock = format!("/// The tick counter's rate (Hz).\npub const TICK_HZ: u32 = {tick_hz};\n");

    if env::var_os("CARGO_FEATURE_HEAP").is_some() {
        let kib = match env::var("KVM_MCU_HEAP_KIB") {
            Ok(v) => v.parse().unwrap_or_else(|_| fail(&format!("KVM_MCU_HEAP_KIB=`{v}` is not a KiB count"))),
            Err(_) => HEAP_KIB,
        };
        let info =
            format!("/// Bytes of the heap the arena comes from.\npub const HEAP_LEN: usize = {};\n", kib * 1024);
        fs::write(out.join("model_info.rs"), info + &clock).expect("write model_info.rs");
        return;
    }

    // Model.
    let model_path = env::var("KVM_MCU_MODEL").unwrap_or_else(|_| DEFAULT_MODEL.to_owned());
    let model_path = absolute(&manifest, Path::new(&model_path));
    println!("cargo:rerun-if-changed={}", model_path.display());
    let blob = fs::read(&model_path).unwrap_or_else(|e| {
        fail(&format!(
            "model {}: {e}\n  build one with `cargo run --release -p kvm-export -- convert models/tiny-kjv \
             -o <file> --dtype q8_0` and pass it as KVM_MCU_MODEL=<file>",
            model_path.display()
        ))
    });
    let model =
        kvm_core::Model::from_bytes(&blob).unwrap_or_else(|e| fail(&format!("model {}: {e}", model_path.display())));
    let arena_len = match env::var("KVM_MCU_ARENA_LEN") {
        Ok(v) => v.parse().unwrap_or_else(|_| fail(&format!("KVM_MCU_ARENA_LEN=`{v}` is not a byte count"))),
        Err(_) => model.arena_len(),
    };
    let info = format!(
        "/// Bytes of the session arena (the model's `arena_len` when this was built).\n\
         pub const ARENA_LEN: usize = {arena_len};\n\
         /// Bytes of the model file.\n\
         pub const MODEL_LEN: usize = {model_len};\n",
        model_len = blob.len()
    );
    fs::write(out.join("model_info.rs"), info + &clock).expect("write model_info.rs");
    println!("cargo:rustc-env=KVM_MCU_MODEL_PATH={}", model_path.display());
}

/// `map` with the length of its `RAM` region replaced by `kib` KiB.
fn with_ram_len(map: &str, kib: usize) -> Option<String> {
    let mut found = false;
    let lines: Vec<String> = map
        .lines()
        .map(|line| match (line.trim_start().starts_with("RAM"), line.find("LENGTH")) {
            (true, Some(at)) => {
                found = true;
                format!("{}LENGTH = {kib}K", &line[..at])
            }
            _ => line.to_owned(),
        })
        .collect();
    found.then(|| lines.join("\n") + "\n")
}

fn absolute(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("kvm-mcu build: {msg}");
    std::process::exit(1);
}
