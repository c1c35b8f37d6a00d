//! Helpers shared by the integration test suites (the workspace's and kvm-runtime's):
//! golden-case loading and model conversion.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kvm_core::quant::DType;
use kvm_export::convert::{convert, TokenizerSource};
use kvm_write::policy::Policy;
use safetensors::SafeTensors;

/// Sessions' arenas, as the runtime makes them.
pub use kvm_runtime::arena::Arena;
pub use values::values;

mod values;

/// Root of the repository (the package using this module is the root one or a member).
pub fn repo() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors().find(|d| d.join("tests/data/golden").is_dir()).unwrap_or(here).to_path_buf()
}

/// Directory of golden case `name`.
pub fn golden_dir(name: &str) -> PathBuf {
    repo().join("tests/data/golden").join(name)
}

/// Every golden case shipped with the repo.
pub fn golden_cases() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(repo().join("tests/data/golden"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("golden.safetensors").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A tensor from a safetensors file, as f32 or i32 values with its shape.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub f32: Vec<f32>,
    pub i32: Vec<i32>,
}

/// Reads every tensor of a safetensors file.
pub fn read_safetensors(path: &Path) -> HashMap<String, Tensor> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, t)| {
            let d = t.data();
            let (f, i) = match t.dtype() {
                safetensors::Dtype::F32 => {
                    (d.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect(), vec![])
                }
                safetensors::Dtype::I32 => {
                    (vec![], d.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect())
                }
                other => panic!("unexpected dtype {other:?} in {name}"),
            };
            (name, Tensor { shape: t.shape().to_vec(), f32: f, i32: i })
        })
        .collect()
}

/// Converts checkpoint `dir` to a temporary model file with `dtype` matrices; returns
/// its bytes.
pub fn convert_to_bytes(dir: &Path, dtype: DType) -> Vec<u8> {
    convert_with(dir, &Policy::uniform(dtype))
}

/// Converts checkpoint `dir` to a temporary model file as `policy` says; returns its bytes.
pub fn convert_with(dir: &Path, policy: &Policy) -> Vec<u8> {
    static UNIQUE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let out = std::env::temp_dir().join(format!(
        "kvm-test-{}-{}-{}-{}.kvm",
        std::process::id(),
        UNIQUE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        dir.file_name().unwrap().to_string_lossy(),
        policy.dtype.name()
    ));
    convert(dir, &out, policy, &TokenizerSource::Auto, &mut |_| {}).unwrap();
    let bytes = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).ok();
    bytes
}

/// Max |a - b|.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// A model file with the tiny preset's shapes but `vocab_len` tokens, byte-level: every
/// vector (norm weights and biases, gates) 1, matrix weights small and deterministic,
/// except that every lm_head weight is `lm_head` (all stored as f32). The final norm's
/// output then sums to `d_model`, so with `lm_head = f32::MAX` every logit overflows: the
/// file is valid, its outputs are not finite.
pub fn model_with(vocab_len: u32, lm_head: f32) -> Vec<u8> {
    model_with_matrix(vocab_len, (kvm_core::format::Role::LmHead, 0), lm_head)
}

/// As [`model_with`], with every weight of matrix `(role, layer)` equal to `value` instead
/// of lm_head's.
pub fn model_with_matrix(vocab_len: u32, (which, at): (kvm_core::format::Role, u16), value: f32) -> Vec<u8> {
    use kvm_core::format::{Role, TokenizerKind};
    let cfg = kvm_core::config::Config { vocab_len, ..kvm_export::synth::Preset::Tiny.config() };
    let mut source = |role: Role, layer: u16, rows: u32, cols: u32| -> anyhow::Result<Vec<f32>> {
        let n = rows as usize * cols as usize;
        if (role, layer) == (which, at) {
            return Ok(vec![value; n]);
        }
        if !role.is_matrix() {
            return Ok(vec![1.0; n]);
        }
        let salt = (role as usize * 131 + layer as usize * 7919) as u64;
        Ok((0..n as u64).map(|i| ((i * 2_654_435_761 + salt) % 1000) as f32 / 1000.0 * 0.2 - 0.1).collect())
    };
    write_f32(&cfg, (TokenizerKind::Bytes, &[]), &mut source)
}

/// The bytes of a model file of `cfg` with `tokenizer`, every tensor f32 from `source`.
fn write_f32(
    cfg: &kvm_core::config::Config,
    tokenizer: (kvm_core::format::TokenizerKind, &[u8]),
    source: &mut dyn FnMut(kvm_core::format::Role, u16, u32, u32) -> anyhow::Result<Vec<f32>>,
) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    kvm_write::writer::write_model_to(
        &mut out,
        cfg,
        tokenizer,
        (kvm_core::cache::CacheDtype::F32, kvm_core::cache::SlotReads::Stored),
        &|_, _, _| DType::F32,
        source,
        &mut |_| {},
    )
    .unwrap();
    out.into_inner()
}

/// The paper's padded vocabulary: GPT-2's 50,257 tokens padded to 50,304 ids.
pub const PADDED_VOCAB: u32 = 50_304;

/// A model of the tiny preset's shapes with GPT-2's tokenizer
/// (`tests/data/tokenizers/gpt2/tokenizer.json`) and the paper's padded vocabulary of
/// [`PADDED_VOCAB`] ids, whose padding ids (50,257 and up) carry the largest logits
/// whatever the input: their lm_head rows are all 1 (a logit of `d_model`), the
/// others' small. Greedy decoding of its full logits picks a padding id every step.
pub fn padded_gpt2_model() -> Vec<u8> {
    use kvm_core::format::{Role, TokenizerKind};
    let json = std::fs::read_to_string(repo().join("tests/data/tokenizers/gpt2/tokenizer.json")).unwrap();
    let section = kvm_write::tokenizer::build_section(&json).unwrap();
    let cfg = kvm_core::config::Config { vocab_len: PADDED_VOCAB, ..kvm_export::synth::Preset::Tiny.config() };
    let text = kvm_core::tokenizer::Tokenizer::from_bytes(&section).unwrap().vocab_len();
    let mut source = |role: Role, layer: u16, rows: u32, cols: u32| -> anyhow::Result<Vec<f32>> {
        let n = rows as usize * cols as usize;
        if !role.is_matrix() {
            return Ok(vec![1.0; n]);
        }
        let salt = (role as usize * 131 + layer as usize * 7919) as u64;
        let small = |i: u64| ((i * 2_654_435_761 + salt) % 1000) as f32 / 1000.0 * 0.2 - 0.1;
        Ok((0..n as u64)
            .map(|i| if role == Role::LmHead && i / cols as u64 >= text as u64 { 1.0 } else { small(i) })
            .collect())
    };
    write_f32(&cfg, (TokenizerKind::Bpe, &section), &mut source)
}

/// A copy of checkpoint `dir` in a fresh temporary directory named after `what`, with
/// `patch` applied to its `config.json`.
pub fn checkpoint_copy(dir: &Path, what: &str, patch: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let to = std::env::temp_dir().join(format!("kvm-ckpt-{}-{what}", std::process::id()));
    std::fs::create_dir_all(&to).unwrap();
    for name in ["config.json", "model.safetensors", "tokenizer.json"] {
        if dir.join(name).exists() {
            std::fs::copy(dir.join(name), to.join(name)).unwrap();
        }
    }
    let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(to.join("config.json")).unwrap()).unwrap();
    patch(&mut cfg);
    std::fs::write(to.join("config.json"), serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    to
}

/// Special files made in `dir`, for tests of writers (never the machine's own `/dev`
/// nodes, which a rename over them as root would replace): a FIFO always, and a character
/// device with `/dev/zero`'s numbers where this user may make one.
pub fn special_files(dir: &Path) -> Vec<PathBuf> {
    use std::process::Command;
    let fifo = dir.join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let mut v = vec![fifo];
    let dev = dir.join("zero");
    if Command::new("mknod").arg(&dev).args(["c", "1", "5"]).status().is_ok_and(|s| s.success()) {
        v.push(dev);
    }
    v
}

/// Whether `p` exists as something other than a regular file or a symbolic link.
pub fn is_special(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| !m.file_type().is_file() && !m.file_type().is_symlink())
}

/// `cmd` with every signal's disposition set to the default and none blocked in the child,
/// whatever the test runner inherited: a background job of a non-interactive shell starts
/// with SIGINT ignored, `nohup` with SIGHUP ignored, and an ignored signal stays ignored
/// across `exec` (which the writers rightly keep: they never install a handler over it).
pub fn default_signals(cmd: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure calls only `signal` and `sigprocmask`
    // (async-signal-safe) on values of its own.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_DFL);
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        })
    }
}
