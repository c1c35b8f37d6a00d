//! kvm-runtime's integration suite, one binary: the `kvm` command line as a user runs it,
//! `kvm bench`'s reports, model files in memory, and what `kvm` writes and reads back.

mod bench;
mod cli;
mod cli_llama;
mod file;
mod limits;
mod outputs;
