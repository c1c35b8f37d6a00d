//! kvm-runtime: what an application links to run KVM models.
//!
//! Without `std` it is the C API over `kvm-core`, a static library C firmware links with
//! no allocator. With `std` (default) it adds loading model files (into huge pages, or
//! mapped), aligned arenas, and the `kvm` command line.
#![cfg_attr(not(feature = "std"), no_std)]

#[cfg(feature = "std")]
pub mod arena;
pub mod capi;
#[cfg(feature = "std")]
pub mod file;
#[cfg(feature = "std")]
pub mod npy;
#[cfg(feature = "std")]
pub mod pool;
#[cfg(feature = "std")]
pub mod prefill;

pub use kvm_core;
