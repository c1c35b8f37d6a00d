//! 32-bit Arm tiers: [`dsp`] for Armv7E-M and Armv8-M Mainline cores with the DSP extension
//! (Cortex-M4, M7, M33, M35P, M55).

pub(crate) mod dsp;
