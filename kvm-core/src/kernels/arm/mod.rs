//! 32-bit Arm (Cortex-M) tiers: [`dsp`] for Armv7E-M and Armv8-M Mainline cores with the
//! DSP extension (Cortex-M4, M7, M33, M35P), [`dsp_int`] its product for the integer
//! numerics, [`helium`] for Armv8.1-M with MVE (Cortex-M55); [`fpu`] holds what both do in
//! the scalar FPU; [`v6m`] the integer product tile of ARMv6-M cores (Cortex-M0/M0+),
//! which have neither.

#[cfg(any(kvm_arm_dsp, test))]
pub(crate) mod dsp;
#[cfg(any(kvm_arm_dsp, test))]
pub(crate) mod dsp_int;
#[cfg(any(kvm_arm_dsp, kvm_mve, test))]
pub(crate) mod fpu;
#[cfg(all(target_arch = "arm", kvm_mve))]
pub(crate) mod helium;
#[cfg(kvm_armv6m)]
pub(crate) mod v6m;
