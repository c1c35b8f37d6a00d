//! 32-bit Arm (Cortex-M) tiers: [`helium`] for Armv8.1-M with MVE.

pub(crate) mod helium;
