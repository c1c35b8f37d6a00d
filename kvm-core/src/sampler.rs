//! Token sampling from logits: greedy, temperature, top-k, top-p, min-p, repetition
//! penalty, with a seeded PRNG.
