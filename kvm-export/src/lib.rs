//! kvm-export: HF checkpoint directory -> `.kvm` model file.
