//! The console on USB as well (CDC ACM: `/dev/ttyACM0` on Linux), for the Pico and the Pico 2.
//!
//! A USB device must answer its host within milliseconds, and a decode step holds the core
//! for tens to hundreds of them, so the device is served from the USB interrupt: it polls
//! the device and moves bytes from a transmit queue to the serial port. The application's
//! writes only queue bytes (and pend the interrupt). With no host reading, the queue keeps
//! the newest bytes and drops the oldest: the console never blocks on USB.

use core::cell::RefCell;

use critical_section::Mutex;
use hal::pac::interrupt;
use hal::usb::UsbBus;
use usb_device::class_prelude::UsbBusAllocator;
use usb_device::prelude::{StringDescriptors, UsbDevice, UsbDeviceBuilder, UsbVidPid};
use usbd_serial::SerialPort;

use crate::hal;

/// Bytes queued for the host: a few report lines.
const QUEUE: usize = 1024;

/// The device and its one class, once started.
type Usb = (UsbDevice<'static, UsbBus>, SerialPort<'static, UsbBus>);
static USB: Mutex<RefCell<Option<Usb>>> = Mutex::new(RefCell::new(None));
static TX: Mutex<RefCell<heapless::Deque<u8, QUEUE>>> = Mutex::new(RefCell::new(heapless::Deque::new()));

/// Starts the device on `bus` and unmasks its interrupt. Call once.
pub fn start(bus: UsbBus) {
    static mut ALLOCATOR: Option<UsbBusAllocator<UsbBus>> = None;
    let slot = &raw mut ALLOCATOR;
    // SAFETY: called once, before the interrupt is unmasked: nothing else names ALLOCATOR.
    let allocator: &'static UsbBusAllocator<UsbBus> = unsafe { (*slot).insert(UsbBusAllocator::new(bus)) };
    let serial = SerialPort::new(allocator);
    // The pid.codes test VID/PID for CDC devices (https://pid.codes/1209/0001/ is their
    // shared test id): fine for a demo, not for a product.
    let device = UsbDeviceBuilder::new(allocator, UsbVidPid(0x1209, 0x0001))
        .strings(&[StringDescriptors::default().manufacturer("kvm").product(crate::NAME).serial_number("0")])
        // Control transfers in 64-byte packets, the most full speed allows: the 9-byte
        // configuration descriptor header then fits one, as hosts (and rp2040js's CDC host,
        // which CI enumerates the device with) read it.
        .and_then(|b| b.max_packet_size_0(64))
        .map(|b| b.device_class(usbd_serial::USB_CLASS_CDC).build());
    let Ok(device) = device else { return };
    critical_section::with(|cs| *USB.borrow_ref_mut(cs) = Some((device, serial)));
    // SAFETY: the handler below only takes the critical section, which this code never
    // holds across an unmask.
    unsafe { cortex_m::peripheral::NVIC::unmask(hal::pac::Interrupt::USBCTRL_IRQ) };
}

/// Queues `bytes` for the host, dropping the oldest queued bytes if there is no room.
pub fn write(bytes: &[u8]) {
    critical_section::with(|cs| {
        let mut tx = TX.borrow_ref_mut(cs);
        for &b in bytes {
            if tx.is_full() {
                tx.pop_front();
            }
            // Cannot fail: there is room.
            let _ = tx.push_back(b);
        }
    });
    cortex_m::peripheral::NVIC::pend(hal::pac::Interrupt::USBCTRL_IRQ);
}

#[interrupt]
fn USBCTRL_IRQ() {
    critical_section::with(|cs| {
        let mut usb = USB.borrow_ref_mut(cs);
        let Some((device, serial)) = usb.as_mut() else { return };
        device.poll(&mut [serial]);
        let mut tx = TX.borrow_ref_mut(cs);
        // As much as the port takes now; the rest waits for the next interrupt.
        while !tx.is_empty() {
            let sent = match serial.write(tx.as_slices().0) {
                Ok(n) if n > 0 => n,
                _ => break,
            };
            for _ in 0..sent {
                tx.pop_front();
            }
        }
    });
}
