//! kvm's C API (`kvm-runtime/include/kvm.h`) as a `no_std` static library for C firmware.
//!
//! The C functions live in `kvm-runtime`; this crate links them into one archive together
//! with what a bare-metal Rust staticlib must bring and only the firmware can define: the
//! `#[panic_handler]`. It hands a panic (a bug in kvm: the C API is written so that no
//! input panics) to the firmware's `kvm_fw_panic()`, which reports it and stops.
#![no_std]

extern crate kvm_runtime;

extern "C" {
    /// Defined by the C firmware; never returns.
    fn kvm_fw_panic() -> !;
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    // SAFETY: the firmware defines `kvm_fw_panic` as a C function of no arguments that
    // does not return.
    unsafe { kvm_fw_panic() }
}
