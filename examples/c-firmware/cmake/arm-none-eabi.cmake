# Toolchain file for a bare-metal Cortex-M4F with arm-none-eabi-gcc (Debian's
# gcc-arm-none-eabi): hard-float ABI, as Rust's thumbv7em-none-eabihf, so the C objects
# and the kvm archive agree on how floats are passed. CMAKE_SYSTEM_PROCESSOR picks the
# kvm library's Rust target (kvm-fw/kvmConfig.cmake).
set(CMAKE_SYSTEM_NAME Generic)
set(CMAKE_SYSTEM_PROCESSOR cortex-m4)
set(CMAKE_C_COMPILER arm-none-eabi-gcc)
set(CMAKE_ASM_COMPILER arm-none-eabi-gcc)
# No C library to link a test program against: the compiler checks build a static library.
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
set(CMAKE_C_FLAGS_INIT "-mcpu=cortex-m4 -mthumb -mfpu=fpv4-sp-d16 -mfloat-abi=hard")
set(CMAKE_ASM_FLAGS_INIT "-mcpu=cortex-m4 -mthumb -mfpu=fpv4-sp-d16 -mfloat-abi=hard")
