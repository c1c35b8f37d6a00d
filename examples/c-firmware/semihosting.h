/* Output and exit through Arm semihosting (QEMU: -semihosting-config enable=on). */
#ifndef SEMIHOSTING_H
#define SEMIHOSTING_H

#include <stddef.h>
#include <stdint.h>

/* Writes `len` bytes to the host's stdout. */
void sh_write(const void *buf, size_t len);
/* Writes a NUL-terminated string to the host's stdout. */
void sh_puts(const char *s);
/* Writes `v` in decimal. */
void sh_put_u64(uint64_t v);
/* Ends the program; QEMU exits with `code`. */
__attribute__((noreturn)) void sh_exit(int code);

#endif
