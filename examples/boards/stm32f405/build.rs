//! Links with `cortex-m-rt`'s `link.x` over this board's `memory.x`, and reads the model
//! file at build time: it is validated here and its arena, vocabulary and file sizes
//! become the consts that size the firmware's statics; unless the `slot` feature is on, its
//! path goes to `include_bytes!` and the model is linked into flash.
//!
//! Input (environment): `KVM_BOARD_MODEL`, the `.kvm` file (relative paths are taken from
//! this directory); default `model.kvm` here. A `slot` build still reads it, to size the
//! arena for the models it will find in the slot.

use std::env;
use std::fs;
use std::path::PathBuf;

const DEFAULT_MODEL: &str = "model.kvm";
/// Stack the link reserves below the top of RAM: the firmware reports a high-water mark of
/// about 10 KiB.
const STACK_RESERVE: usize = 16 * 1024;

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-env-changed=KVM_BOARD_MODEL");
    println!("cargo:rerun-if-changed=memory.x");

    let map = fs::read_to_string(manifest.join("memory.x")).expect("read memory.x");
    let map = format!(
        "{map}\n/* Added by build.rs: the statics leave at least {STACK_RESERVE} bytes of stack. */\n\
         ASSERT(_stack_start - _stack_end >= {STACK_RESERVE}, \
         \"kvm-stm32f405: the statics leave less than {STACK_RESERVE} bytes of RAM for the stack\");\n"
    );
    fs::write(out.join("memory.x"), map).expect("write memory.x");
    println!("cargo:rustc-link-search={}", out.display());
    // Exactly once, and only here: twice fails with "region FLASH already defined".
    println!("cargo:rustc-link-arg-bins=-Tlink.x");
    if env::var_os("CARGO_FEATURE_DEFMT").is_some() {
        println!("cargo:rustc-link-arg-bins=-Tdefmt.x");
    }

    let path = manifest.join(env::var("KVM_BOARD_MODEL").unwrap_or_else(|_| DEFAULT_MODEL.to_owned()));
    println!("cargo:rerun-if-changed={}", path.display());
    let blob = fs::read(&path).unwrap_or_else(|e| {
        fail(&format!(
            "model {}: {e}\n  write the board's model with (from the repository root)\n  \
             cargo run --release -p kvm-export -- synth --preset tiny --dtype q8_0 -o examples/boards/stm32f405/model.kvm\n  \
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
         #[allow(dead_code)]\n\
         pub const MODEL_LEN: usize = {len};\n",
        arena = model.arena_len(),
        vocab = model.config().vocab_len,
        len = blob.len()
    );
    fs::write(out.join("model_info.rs"), info).expect("write model_info.rs");
    println!("cargo:rustc-env=KVM_BOARD_MODEL_PATH={}", path.display());
}

fn fail(msg: &str) -> ! {
    eprintln!("kvm-stm32f405 build: {msg}");
    std::process::exit(1);
}
