//! The build script of every board firmware (`examples/boards/*`), as a library: it reads the
//! model file at build time and validates it, writes the consts that size the firmware's
//! statics (`model_info.rs` in `OUT_DIR`), hands the model's path to `include_bytes!`, and
//! places the board's `memory.x` with a link-time check that the statics leave room for the
//! stack.
//!
//! Inputs (environment):
//! - `KVM_BOARD_MODEL`: the `.kvm` file to link in (or, for a firmware built to read the
//!   model slot, to size its arena for); relative paths are taken from the firmware's
//!   directory. Default: the firmware's own (`Firmware::default_model`).
//! - `KVM_BOARD_N_GEN`: tokens to generate (default and most: `kvm_board_app::MAX_GEN`, 64);
//!   CI generates fewer where the emulator is slow.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// What a firmware's build needs to know of itself.
#[derive(Debug)]
pub struct Firmware {
    /// The crate's name, in messages (`kvm-pico`).
    pub name: &'static str,
    /// The model file when `KVM_BOARD_MODEL` is unset, relative to the crate.
    pub default_model: &'static str,
    /// How to make the default model, in the message when it is missing.
    pub make_model: &'static str,
    /// Bytes of RAM the statics must leave for the stack (checked at link time).
    pub stack_reserve: usize,
    /// Whether the model is linked into the image (else only its sizes are used, and the
    /// image must end below the model slot, `_kvm_model_slot` in memory.x).
    pub linked: bool,
}

/// The tokens a run generates, when `KVM_BOARD_N_GEN` does not say.
const N_GEN: usize = 64;

impl Firmware {
    /// Everything the build script does: the memory map and the model's consts.
    pub fn build(&self) {
        let (manifest, out) = dirs();
        self.memory_map(&manifest, &out);
        self.build_model();
    }

    /// The model's consts only, for a board whose HAL brings the whole memory map and its
    /// linker scripts (esp-hal's `linkall.x`): the firmware links those itself and
    /// `stack_reserve` is not used.
    pub fn build_model(&self) {
        let (manifest, out) = dirs();
        for var in ["KVM_BOARD_MODEL", "KVM_BOARD_N_GEN"] {
            println!("cargo:rerun-if-env-changed={var}");
        }
        self.model_info(&manifest, &out);
    }

    /// Places `memory.x` (the board's map) where `link.x` finds it, with the stack check;
    /// links with `link.x` (and `defmt.x` with the `defmt` feature).
    fn memory_map(&self, manifest: &Path, out: &Path) {
        let memory = manifest.join("memory.x");
        let map = fs::read_to_string(&memory).unwrap_or_else(|e| self.fail(&format!("{}: {e}", memory.display())));
        let reserve = self.stack_reserve;
        let map = format!(
            "{map}\n/* Added by the build script: the statics leave at least {reserve} bytes of stack \
             (cortex-m-rt's stack is the rest of RAM). */\nASSERT(_stack_start - _stack_end >= {reserve}, \
             \"{}: the statics leave less than {reserve} bytes of RAM for the stack\");\n",
            self.name
        );
        // An image that reads its model from the slot must not reach into the slot.
        let map = if self.linked {
            map
        } else {
            format!(
                "{map}ASSERT(__sidata + SIZEOF(.data) <= _kvm_model_slot, \"{}: the image reaches into the model \
                 slot\");\n",
                self.name
            )
        };
        fs::write(out.join("memory.x"), map).expect("write memory.x");
        println!("cargo:rerun-if-changed={}", memory.display());
        println!("cargo:rustc-link-search={}", out.display());
        // Exactly once, and only here: twice fails with "region FLASH already defined".
        println!("cargo:rustc-link-arg-bins=-Tlink.x");
        if env::var_os("CARGO_FEATURE_DEFMT").is_some() {
            println!("cargo:rustc-link-arg-bins=-Tdefmt.x");
        }
    }

    /// Validates the model and writes `model_info.rs`: `ARENA_LEN`, `N_GEN`
    /// and, when linked, `MODEL_LEN` (and `KVM_BOARD_MODEL_PATH` for `include_bytes!`).
    fn model_info(&self, manifest: &Path, out: &Path) {
        let path = env::var("KVM_BOARD_MODEL").unwrap_or_else(|_| self.default_model.to_owned());
        let path = manifest.join(path);
        println!("cargo:rerun-if-changed={}", path.display());
        let blob = fs::read(&path).unwrap_or_else(|e| {
            self.fail(&format!("model {}: {e}\n  make it with: {}", path.display(), self.make_model))
        });
        let model =
            kvm_core::Model::from_bytes(&blob).unwrap_or_else(|e| self.fail(&format!("model {}: {e}", path.display())));
        let n_gen = match env::var("KVM_BOARD_N_GEN") {
            Ok(v) => match v.parse::<usize>() {
                Ok(n) if (1..=N_GEN).contains(&n) => n,
                _ => self.fail(&format!("KVM_BOARD_N_GEN=`{v}` is not a token count in 1..={N_GEN}")),
            },
            Err(_) => N_GEN,
        };
        let mut info = format!(
            "/// Bytes of the session arena (the model's `arena_len` when this was built).\n\
             pub const ARENA_LEN: usize = {};\n\
             /// Tokens to generate (`KVM_BOARD_N_GEN`).\n\
             pub const N_GEN: usize = {n_gen};\n",
            model.arena_len()
        );
        if self.linked {
            info += &format!("/// Bytes of the model file.\npub const MODEL_LEN: usize = {};\n", blob.len());
            println!("cargo:rustc-env=KVM_BOARD_MODEL_PATH={}", path.display());
        }
        fs::write(out.join("model_info.rs"), info).expect("write model_info.rs");
    }

    fn fail(&self, msg: &str) -> ! {
        eprintln!("{} build: {msg}", self.name);
        std::process::exit(1);
    }
}

/// The firmware's directory and the build script's output directory.
fn dirs() -> (PathBuf, PathBuf) {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    (manifest, out)
}
