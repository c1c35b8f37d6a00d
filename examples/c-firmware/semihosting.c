/* Arm semihosting: an operation number in r0, a pointer to its argument block in r1, then
   `bkpt 0xAB` (Thumb); the debugger (QEMU) performs the call and puts the result in r0. */
#include "semihosting.h"

enum {
    SYS_OPEN = 0x01,
    SYS_WRITE = 0x05,
    SYS_EXIT_EXTENDED = 0x20,
};

/* ADP_Stopped_ApplicationExit: with SYS_EXIT_EXTENDED its subcode is the exit status. */
#define ADP_STOPPED_APPLICATION_EXIT 0x20026u

static int32_t sh_call(uint32_t op, const void *arg) {
    register uint32_t r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
    return (int32_t)r0;
}

/* The host's stdout: ":tt" opened for writing (mode 4, "w"). Opened on first use. */
static int32_t sh_stdout = -1;

void sh_write(const void *buf, size_t len) {
    if (sh_stdout < 0) {
        static const char tt[] = ":tt";
        const uint32_t open_args[3] = {(uint32_t)tt, 4, sizeof tt - 1};
        sh_stdout = sh_call(SYS_OPEN, open_args);
    }
    const uint32_t args[3] = {(uint32_t)sh_stdout, (uint32_t)buf, (uint32_t)len};
    sh_call(SYS_WRITE, args);
}

void sh_puts(const char *s) {
    size_t n = 0;
    while (s[n] != '\0') {
        n++;
    }
    sh_write(s, n);
}

void sh_put_u64(uint64_t v) {
    char buf[20];
    size_t i = sizeof buf;
    do {
        buf[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    sh_write(buf + i, sizeof buf - i);
}

void sh_exit(int code) {
    const uint32_t args[2] = {ADP_STOPPED_APPLICATION_EXIT, (uint32_t)code};
    for (;;) {
        sh_call(SYS_EXIT_EXTENDED, args);
    }
}
