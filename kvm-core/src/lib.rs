#![doc = include_str!("../README.md")]
//!
//! ## Layout
//!
//! Data flows one way; each module imports only modules listed before it, and
//! `docs/architecture.md` maps each file to the step of the spec it owns:
//!
//! - [`error`], [`crc`], [`config`] (hyper-parameters), [`fixed`] (the integer
//!   numerics' fixed-point arithmetic, a leaf), [`quant`] (weight blocks);
//! - [`tensor`] (the [`tensor::Vector`] and [`tensor::Matrix`] views) -> [`math`] (norms,
//!   RoPE) and [`kernels`] (matrix x vector in tiers) -> [`cache`] (how attention rows are
//!   stored, float and integer) -> [`exec`] (how splittable work runs);
//! - [`format`] (the file) -> [`tokenizer`] -> [`state`] (the arena layout, the step plan,
//!   the means state, the window and attention reads) -> [`model`] (the validated weights)
//!   -> `int` (the integer numerics' rows, norms and heads, docs/integer.md) ->
//!   [`forward`] (the forward pass, written once over both numerics) -> [`session`] (the
//!   [`Session`] handle);
//! - [`sampler`] (logits to tokens) stands beside them.
#![no_std]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "std")]
extern crate std;

pub mod cache;
pub mod config;
pub mod crc;
pub mod error;
pub mod exec;
pub mod fixed;
pub mod format;
pub mod forward;
pub(crate) mod int;
pub mod kernels;
pub mod math;
pub mod model;
pub mod quant;
pub mod sampler;
pub mod session;
pub mod state;
pub mod tensor;
pub mod tokenizer;

pub use config::Config;
pub use error::Error;
pub use model::Model;
pub use session::Session;
