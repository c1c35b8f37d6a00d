//! kvm-export: HF KVM checkpoint directory -> `.kvm` model file (format v1).
//!
//! [`convert::convert`] reads `config.json` and `model.safetensors` (bf16, f16 or f32),
//! checks every tensor name and shape against the config, and streams the tensors one at
//! a time into `kvm_write::writer::write_model`, quantizing as the
//! `kvm_write::policy::Policy` says.
//! [`synth::synth`] feeds the same writer random weights with the paper's shapes, for
//! benchmarks.

pub mod convert;
pub mod hf_config;
pub mod room;
pub mod synth;
