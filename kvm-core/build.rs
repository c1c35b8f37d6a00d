//! Sets `cfg(kvm_mve)` when the target is 32-bit Arm with Helium (MVE), which selects the
//! Helium kernel tier at compile time. Stable rustc does not expose Arm's `mve` as a
//! `target_feature` cfg, so this reads the codegen flags cargo passes to rustc instead:
//! `-C target-cpu=cortex-m55` (or cortex-m85) switches MVE on, and a `-C target-feature`
//! list's `+mve`, `+mve.fp`, `-mve` win over it in order.

use std::env;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kvm_mve)");
    println!("cargo:rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("arm") {
        return;
    }
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if mve(flags.split('\u{1f}')) {
        println!("cargo:rustc-cfg=kvm_mve");
    }
}

/// Whether rustc flags `args` turn MVE on.
fn mve<'a>(args: impl Iterator<Item = &'a str>) -> bool {
    let mut on = false;
    let mut codegen = false;
    for arg in args {
        let opt = if codegen {
            codegen = false;
            arg
        } else if let Some(opt) = arg.strip_prefix("-C").or_else(|| arg.strip_prefix("--codegen=")) {
            if opt.is_empty() {
                codegen = true;
                continue;
            }
            opt
        } else {
            if arg == "--codegen" {
                codegen = true;
            }
            continue;
        };
        if let Some(cpu) = opt.strip_prefix("target-cpu=") {
            on = matches!(cpu, "cortex-m55" | "cortex-m85");
        } else if let Some(list) = opt.strip_prefix("target-feature=") {
            for f in list.split(',') {
                match f {
                    "+mve" | "+mve.fp" => on = true,
                    "-mve" => on = false,
                    _ => {}
                }
            }
        }
    }
    on
}
