//! x86_64 tiers: [`avx2`] for every x86_64 CPU of the last decade, [`avx512`] on top of it
//! where wider vectors and VNNI pay off.

pub(crate) mod avx2;
pub(crate) mod avx512;
