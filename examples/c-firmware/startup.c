/* Cortex-M4F start-up for QEMU mps2-an386: the vector table, the reset handler (FPU on,
   .data copied from flash, .bss zeroed, then main) and fault handlers that report over
   semihosting instead of hanging. */
#include <stdint.h>

#include "semihosting.h"

extern uint32_t __data_load[], __data_start[], __data_end[], __bss_start[], __bss_end[];
extern uint32_t __stack_top[];

int main(void);

/* Coprocessor Access Control Register: CP10 and CP11 (the FPU) at bits 20-23. */
#define SCB_CPACR (*(volatile uint32_t *)0xE000ED88u)

void reset_handler(void) {
    /* Full access to the FPU before any floating-point instruction runs (the Rust
       library and this code are built for the hard-float ABI). */
    SCB_CPACR |= 0xFu << 20;
    __asm__ volatile("dsb\n\tisb" ::: "memory");

    for (uint32_t *src = __data_load, *dst = __data_start; dst < __data_end;) {
        *dst++ = *src++;
    }
    for (uint32_t *dst = __bss_start; dst < __bss_end;) {
        *dst++ = 0;
    }
    sh_exit(main());
}

static void fault(const char *what) {
    sh_puts("c-firmware: ");
    sh_puts(what);
    sh_puts("\n");
    sh_exit(102);
}

void nmi_handler(void) { fault("NMI"); }
void hard_fault_handler(void) { fault("hard fault"); }
void mem_manage_handler(void) { fault("memory management fault"); }
void bus_fault_handler(void) { fault("bus fault"); }
void usage_fault_handler(void) { fault("usage fault"); }
void unexpected_handler(void) { fault("unexpected exception"); }

/* The 16 system exceptions; this firmware enables no device interrupts. */
__attribute__((section(".vectors"), used)) static void (*const vectors[16])(void) = {
    (void (*)(void))__stack_top,
    reset_handler,
    nmi_handler,
    hard_fault_handler,
    mem_manage_handler,
    bus_fault_handler,
    usage_fault_handler,
    0, 0, 0, 0,
    unexpected_handler, /* SVCall */
    unexpected_handler, /* DebugMonitor */
    0,
    unexpected_handler, /* PendSV */
    unexpected_handler, /* SysTick */
};
