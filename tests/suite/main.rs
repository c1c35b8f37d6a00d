//! The workspace's integration suite, one binary: golden vectors, the trained model,
//! corrupt inputs, the C API and the tokenizer. (`no_alloc` counts allocations with a
//! global allocator of its own and `miri` runs under `scripts/miri.sh`: binaries apart.)

use kvm_test_support as common;

mod capi;
mod configs;
mod corrupt;
mod golden;
mod integer;
mod padding;
mod paper;
mod tiny_kjv;
mod tokenizer;
