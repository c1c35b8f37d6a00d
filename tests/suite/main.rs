//! The workspace's integration suite, one binary: golden vectors, the trained model,
//! corrupt inputs and the command lines.

#[path = "../common/mod.rs"]
mod common;

mod corrupt;
mod golden;
mod tiny_kjv;
