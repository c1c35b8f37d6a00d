//! Links with esp-hal's `linkall.x`, and reads the model file at build time: it is
//! validated here, its path goes to `include_bytes!` (the model is linked into flash, read
//! in place through the flash cache) and its arena and vocabulary sizes become the consts
//! that size the firmware's statics.
//!
//! Input (environment): `KVM_BOARD_MODEL`, the `.kvm` file (relative paths are taken from
//! this directory); default `model.kvm` here.

use std::env;
use std::fs;
use std::path::PathBuf;

const DEFAULT_MODEL: &str = "model.kvm";

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-env-changed=KVM_BOARD_MODEL");
    // esp-hal's memory map, sections and the ROM's symbols.
    println!("cargo:rustc-link-arg-bins=-Tlinkall.x");
    if env::var_os("CARGO_FEATURE_DEFMT").is_some() {
        println!("cargo:rustc-link-arg-bins=-Tdefmt.x");
    }

    let path = manifest.join(env::var("KVM_BOARD_MODEL").unwrap_or_else(|_| DEFAULT_MODEL.to_owned()));
    println!("cargo:rerun-if-changed={}", path.display());
    let blob = fs::read(&path).unwrap_or_else(|e| {
        fail(&format!(
            "model {}: {e}\n  write the board's model with (from the repository root)\n  \
             cargo run --release -p kvm-export -- convert models/tiny-kjv --numerics int --cache q8 \
             --slot-reads recomputed -o examples/boards/esp32c3/model.kvm\n  \
             or pass another as KVM_BOARD_MODEL=<file>",
            path.display()
        ))
    });
    let model = kvm_core::Model::from_bytes(&blob).unwrap_or_else(|e| fail(&format!("model {}: {e}", path.display())));
    let info = format!(
        "/// Bytes of the session arena (the model's `arena_len` when this was built).\n\
         pub const ARENA_LEN: usize = {arena};\n\
         /// The model's vocabulary size when this was built.\n\
         pub const VOCAB_LEN: usize = {vocab};\n\
         /// Bytes of the model file.\n\
         pub const MODEL_LEN: usize = {len};\n",
        arena = model.arena_len(),
        vocab = model.config().vocab_len,
        len = blob.len()
    );
    fs::write(out.join("model_info.rs"), info).expect("write model_info.rs");
    println!("cargo:rustc-env=KVM_BOARD_MODEL_PATH={}", path.display());
}

fn fail(msg: &str) -> ! {
    eprintln!("kvm-esp32c3 build: {msg}");
    std::process::exit(1);
}
