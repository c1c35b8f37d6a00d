//! kvm-runtime: sessions over kvm-core, the C API and (with `std`) the `kvm` CLI.
#![cfg_attr(not(feature = "std"), no_std)]

pub mod capi;
