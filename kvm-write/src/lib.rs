//! kvm-write: the model file from weights in memory, for the converter (`kvm-export`) and
//! the runtime (which packs f32 files as it loads them) alike, without the converter's
//! checkpoint readers and command line.
//!
//! [`writer::write_model`] streams tensors one at a time into the format v1 file,
//! encoding each as the [`policy::Policy`] says; [`tokenizer::build_section`] turns an HF
//! `tokenizer.json` into the file's tokenizer section; [`atomic::AtomicFile`], the one
//! writer of every output, makes it appear whole or not at all and never over an input
//! of the run or a special file; [`input::open`] the one reader of the inputs that must be
//! regular files; [`usage::one_line`] gives both command lines' usage
//! errors the one-line form of their other errors.

pub mod atomic;
pub mod input;
pub mod policy;
pub mod tokenizer;
pub mod usage;
pub mod writer;
