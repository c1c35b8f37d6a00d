#![doc = include_str!("../README.md")]
//!
//! ## Layout
//!
//! Modules follow the data: [`format`] (the file, its sections checked by [`crc`]) ->
//! [`quant`] (weight blocks) -> [`kernels`] (matrix x vector) -> [`config`] + [`model`]
//! (weights view, forward) -> [`state`] (arena layout, window, means state; rows stored as
//! [`cache`] says) -> [`tokenizer`] -> [`sampler`].
#![no_std]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "std")]
extern crate std;

pub mod cache;
pub mod config;
pub mod crc;
pub mod error;
pub mod format;
pub mod kernels;
pub mod math;
pub mod model;
pub mod quant;
pub mod sampler;
pub mod state;
pub mod tokenizer;

pub use config::Config;
pub use error::Error;
pub use model::Model;
pub use state::Session;
