//! kvm-runtime's integration suite, one binary: the `kvm` command line as a user runs it,
//! `kvm bench`'s reports, and model files in memory.

mod bench;
mod cli;
mod cli_llama;
mod file;
mod limits;
