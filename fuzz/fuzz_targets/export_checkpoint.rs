//! The exporter on an arbitrary checkpoint: the input is `[u16 config length]`, that much
//! `config.json`, then `model.safetensors`. Converting never panics, and whatever it
//! writes loads with the runtime's validation (the exporter checks that itself before it
//! keeps a file; the assertion here makes sure nothing slips past).
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use kvm_core::quant::DType;
use kvm_export::convert::{convert, TokenizerSource};
use kvm_write::policy::Policy;
use libfuzzer_sys::fuzz_target;

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("kvm-fuzz-checkpoint-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((len, rest)) = data.split_first_chunk::<2>() else { return };
    let len = usize::from(u16::from_le_bytes(*len)).min(rest.len());
    let (config, weights) = rest.split_at(len);
    let d = dir();
    std::fs::write(d.join("config.json"), config).unwrap();
    std::fs::write(d.join("model.safetensors"), weights).unwrap();
    let out = d.join("out.kvm");
    let policy = Policy::uniform(if len % 2 == 0 { DType::F32 } else { DType::Q8_0 });
    if convert(d, &out, &policy, &TokenizerSource::Bytes, &mut |_| {}).is_ok() {
        let bytes = std::fs::read(&out).unwrap();
        assert!(kvm_core::Model::from_bytes(&bytes).is_ok(), "the exporter kept a file the runtime refuses");
    }
});
