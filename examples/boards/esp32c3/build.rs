//! Links with esp-hal's `linkall.x` (its memory map, sections and the ROM's symbols; it
//! checks the stack minimum, `ESP_HAL_CONFIG_ENSURE_MAIN_STACK_MINIMUM` in
//! .cargo/config.toml) and writes the model's sizes as every board firmware does
//! (`kvm-board-build`; inputs `KVM_BOARD_MODEL`, `KVM_BOARD_N_GEN`). With the `slot`
//! feature, no model is linked in and the model slot's place is read from `partitions.csv`
//! (its `model` row), the table espflash writes, so the two cannot disagree.

use std::path::PathBuf;
use std::{env, fs};

fn main() {
    println!("cargo:rustc-link-arg-bins=-Tlinkall.x");
    if env::var_os("CARGO_FEATURE_DEFMT").is_some() {
        println!("cargo:rustc-link-arg-bins=-Tdefmt.x");
    }
    let slot = env::var_os("CARGO_FEATURE_SLOT").is_some();
    kvm_board_build::Firmware {
        name: "kvm-esp32c3",
        default_model: "../../../target/tiny-kjv-int-256k.kvm",
        make_model: "cargo run --release -p kvm-export -- convert models/tiny-kjv --numerics int --cache q8 \
                     --slot-reads recomputed -o target/tiny-kjv-int-256k.kvm (from the repository's root)",
        stack_reserve: 0,
        linked: !slot,
    }
    .build_model();
    if slot {
        slot_info();
    }
}

/// Writes `slot_info.rs`: `SLOT_FLASH` and `SLOT_LEN`, the `model` partition's offset and
/// size.
fn slot_info() {
    println!("cargo:rerun-if-changed=partitions.csv");
    let table = fs::read_to_string("partitions.csv").expect("partitions.csv");
    let row: Vec<&str> = table
        .lines()
        .map(|l| l.split(',').map(str::trim).collect::<Vec<_>>())
        .find(|f| f.first() == Some(&"model"))
        .expect("partitions.csv has no `model` row (the model slot)");
    let hex = |i: usize| {
        let field = row
            .get(i)
            .and_then(|f| f.strip_prefix("0x"))
            .expect("partitions.csv: the model row's offset and size in hex");
        usize::from_str_radix(field, 16).expect("partitions.csv: a hex number")
    };
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let info = format!(
        "/// The model slot's flash offset (partitions.csv, `model`).\npub const SLOT_FLASH: usize = {:#x};\n\
         /// The model slot's size in bytes.\npub const SLOT_LEN: usize = {:#x};\n",
        hex(3),
        hex(4)
    );
    fs::write(out.join("slot_info.rs"), info).expect("write slot_info.rs");
}
