//! Tokenizer tests against Hugging Face `tokenizers` (golden vectors in
//! `tests/data/tokenizers/`), round trips, streaming, and corrupted sections.

mod corrupt;
mod helpers;
mod parity;
mod stream;
