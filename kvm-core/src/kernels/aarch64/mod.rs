//! aarch64 tiers: [`neon`] holds both NEON and NEON + dotprod, which differ only in the
//! integer dot product.

pub(crate) mod neon;
