//! kvm on the Raspberry Pi Pico (RP2040, Cortex-M0+ at 125 MHz): tiny-kjv in the integer
//! numerics (its 256 KiB configuration: i8 attention rows, slot reads recomputed) generates
//! greedily from "And God said" and streams the text on UART0 (GP0 TX, GP1 RX, 115200 8N1).
//!
//! HAL: `rp2040-hal` with `rp2040-boot2`, because blocking UART and the clocks are all this
//! firmware needs (an async executor, embassy-rp, would add nothing), and its
//! `disable-intrinsics` keeps float code off the boot ROM, which rp2040js (the CI's
//! emulator) does not have.
//!
//! The application is `kvm-board-app`, shared with every board; the board (clocks, UART0,
//! SysTick, where the model and arena live) is `../../rp/board.rs`, shared with the Pico 2.
//! This file adds what only the RP2040 has: boot2 and the crystal. By default the model is
//! linked into flash (`KVM_BOARD_MODEL` at build time); with the `slot` feature the image
//! holds no model and reads the one written at 0x1010_0000 (the model slot), saying in words
//! when there is none or a bad one. No semihosting: this image runs on a chip with no
//! debugger attached; after its report it sleeps.
#![no_std]
#![no_main]

use rp2040_hal as hal;

#[cfg(feature = "defmt")]
use defmt_rtt as _;

/// The USB controller's registers and its RAM, taken from the peripherals.
#[cfg(feature = "usb")]
macro_rules! usb_peripherals {
    ($pac:ident) => {
        ($pac.USBCTRL_REGS, $pac.USBCTRL_DPRAM)
    };
}
#[cfg(feature = "usb")]
use usb_peripherals;

#[path = "../../rp/board.rs"]
mod board;

mod model_info {
    include!(concat!(env!("OUT_DIR"), "/model_info.rs"));
}

/// Starts every report line.
const NAME: &str = "kvm-pico";
/// The Pico's crystal.
const XOSC_HZ: u32 = 12_000_000;

/// The second-stage boot loader for the Pico's W25Q080 flash, first in flash (memory.x): the
/// boot ROM runs it, and it turns on execute-in-place and enters the vector table after it.
#[link_section = ".boot2"]
#[used]
static BOOT2: [u8; 256] = rp2040_boot2::BOOT_LOADER_W25Q080;

#[hal::entry]
fn main() -> ! {
    if let Some(mut rp) = board::start() {
        board::run(&mut rp);
    }
    board::halt()
}
