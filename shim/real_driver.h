// The real dynamic-linker and driver entry points behind the shim's driver hooks: the C
// library's dlsym (the shim exports its own), and libcuda.so.1's exported functions.
#pragma once

namespace poolshim::shim {

using DlsymFunction = void* (*)(void*, const char*);

/// The C library's dlsym, found with dlvsym (GLIBC_2.34, then GLIBC_2.2.5). Never null:
/// without it the process cannot go on, and the shim says so and aborts.
DlsymFunction real_dlsym();

/// libcuda.so.1, loaded with local scope if it is not loaded yet; nullptr if there is none.
void* driver_library();

}  // namespace poolshim::shim
