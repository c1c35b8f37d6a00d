//! Tokenizers stored in the model blob: byte-level, and GPT-2 byte-level BPE.
