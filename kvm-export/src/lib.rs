//! kvm-export: HF checkpoint directory -> `.kvm` model file.

pub mod tokenizer;
