//! The workspace's integration suite, one binary: golden vectors, the trained model,
//! corrupt inputs, the command lines and the tokenizer.

#[path = "../common/mod.rs"]
mod common;

mod configs;
mod corrupt;
mod golden;
mod tiny_kjv;
mod tokenizer;
