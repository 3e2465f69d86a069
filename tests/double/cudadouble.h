/* Control API of the CUDA driver test double (libcuda.so.1 in ${CMAKE_BINARY_DIR}/double).
 *
 * The double simulates devices in host memory so that the pool core, the shim and unmodified
 * test programs can run on a machine without a GPU. Tests use these functions to start from a
 * known state and to observe what the simulated driver holds. They are exported by the driver
 * double only; the runtime double reaches the driver the way the real runtime does and never
 * calls them.
 *
 * Simulated memory model (what the exact figures in tests rely on):
 * - A device's consumption is the sum of its plain allocations (cuMemAlloc, each rounded up to
 *   512 bytes) and the reserved bytes of all its memory pools. A request that would take it
 *   over the capacity fails with CUDA_ERROR_OUT_OF_MEMORY and changes nothing.
 * - A pool allocation of n bytes uses round_up(n, 512) bytes. When nothing fits, the pool
 *   reserves a chunk of round_up(max(used_size, 2 MiB), 2 MiB) bytes. Blocks never span chunks.
 * - Placement for an allocation on stream s: first a pending free of s (first fit), then a free
 *   range (first fit), then a new chunk. First fit scans chunks in creation order and each
 *   chunk's ranges in address order. Free ranges coalesce; pending frees do not.
 * - cuMemFreeAsync(p, s) leaves a pending free tagged with s. It becomes free when s or the
 *   device's context is synchronized, or at cuMemPoolTrimTo.
 * - After a stream or context synchronization, each pool of the device releases its fully
 *   free chunks, newest first, while reserved - chunk size >= release threshold.
 * - cuMemPoolTrimTo settles the pool's pending frees, then releases fully free chunks, newest
 *   first, while reserved >= minBytesToKeep. Destroying a stream settles its pending frees
 *   without a release pass.
 * - The last cuDevicePrimaryCtxRelease of a device, like cuDevicePrimaryCtxReset, frees its
 *   plain allocations, pools, streams and events and empties its default pool.
 * - Virtual memory management: cuMemCreate makes physical memory of a multiple of 2 MiB (the
 *   granularity; it counts in consumption until cuMemRelease, or until its last unmapping after
 *   that); cuMemAddressReserve reserves address space; cuMemMap maps a whole handle at a 2 MiB
 *   aligned address inside a reservation; its range is device memory (to copies and sets) once
 *   cuMemSetAccess gave read-write access. The contents stay with the handle: unmapped and
 *   mapped elsewhere, it holds what was written. VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 1.
 *   Physical memory made with requestedHandleTypes CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
 *   (the only other type than NONE; the rest fail with CUDA_ERROR_NOT_SUPPORTED) exports as a
 *   new close-on-exec descriptor (cuMemExportToShareableHandle; other memory or types:
 *   CUDA_ERROR_INVALID_VALUE), which imports in any process as a new handle to the same memory
 *   (cuMemImportFromShareableHandle; the caller keeps its descriptor; it counts in no device's
 *   consumption there; a descriptor the double did not make: CUDA_ERROR_INVALID_HANDLE). The
 *   real driver's error codes for the refusals and its descriptor's close-on-exec state were
 *   not checked on a GPU.
 * - Legacy IPC: cuIpcGetMemHandle of a plain allocation's base moves its memory into a memfd at
 *   the same address (once) and answers the same 64 bytes for every call on it (pool and VMM
 *   memory, interior pointers: CUDA_ERROR_INVALID_VALUE). cuIpcOpenMemHandle in another process
 *   of the user maps it (through /proc/<pid>/fd) at a new address, which counts in no device's
 *   consumption; opened again there, the same address, counted; in the exporting process
 *   CUDA_ERROR_INVALID_CONTEXT (cudaErrorDeviceUninitialized, as UCX reports the real driver);
 *   bytes that are no live export: CUDA_ERROR_INVALID_HANDLE. cuIpcCloseMemHandle unmaps at the
 *   last close. The exporter's cudaFree leaves importers' mappings as they are. Only the
 *   in-process case's code comes from a report of the real driver; the others are unchecked.
 * - Stream capture follows cuThreadExchangeStreamCaptureMode: a thread in GLOBAL mode may not
 *   call cuMemAlloc, cuMemFree (non-null) or cuCtxSynchronize during its own non-relaxed
 *   capture or another thread's GLOBAL capture; in THREAD_LOCAL mode only its own counts; in
 *   RELAXED mode nothing does. The call fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
 *   invalidates those captures.
 */
#ifndef POOLSHIM_TESTS_DOUBLE_CUDADOUBLE_H
#define POOLSHIM_TESTS_DOUBLE_CUDADOUBLE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDADOUBLE_EXPORT __attribute__((visibility("default")))

/* What the double holds for one device. */
struct cudadouble_device_stats {
  size_t consumption;        /* plain_bytes + reserved bytes of every pool of the device */
  size_t capacity;           /* bytes the device can hold */
  size_t plain_count;        /* live cuMemAlloc allocations */
  size_t plain_bytes;        /* their sizes, each rounded up to 512 bytes */
  size_t pool_count;         /* app-created pools not yet destroyed (the default pool excluded) */
  size_t pending_free_count; /* cuMemFreeAsync ranges not yet synchronized, in all its pools */
  size_t vmm_bytes;          /* cuMemCreate'd physical memory not yet released (in consumption) */
  size_t vmm_mapped_bytes;   /* of which mapped (cuMemMap) now */
};

/* The function below shares the struct's name, so C++ must spell the type `struct ...`;
 * this alias avoids that. */
typedef struct cudadouble_device_stats cudadouble_device_stats_t;

/* Forgets everything (allocations, pools, streams, events, contexts, captures, call counts)
 * and starts over with `devices` devices (clamped to 1..8) of `capacity_per_device` bytes.
 * cuInit must be called again afterwards. Overrides CUDADOUBLE_DEVICES and CUDADOUBLE_MEM. */
CUDADOUBLE_EXPORT void cudadouble_reset(int devices, size_t capacity_per_device);

/* Fills *out for `device`. Returns 0, or -1 for a bad ordinal or a null `out`.
 * Does not need cuInit. */
CUDADOUBLE_EXPORT int cudadouble_device_stats(int device, struct cudadouble_device_stats* out);

/* How many times the driver entry point exported as `name` (e.g. "cuMemAlloc_v2",
 * "cuMemAllocAsync_ptsz", "cuGetProcAddress_v2") was called since the last reset or load.
 * 0 for a name the double does not export. */
CUDADOUBLE_EXPORT unsigned long long cudadouble_call_count(const char* name);

/* A kernel faulted: from now until the next reset, synchronizations, stream and event queries
 * and allocation calls return CUDA_ERROR_ILLEGAL_ADDRESS (a sticky error). */
CUDADOUBLE_EXPORT void cudadouble_fault(void);

#ifdef __cplusplus
}
#endif

#endif /* POOLSHIM_TESTS_DOUBLE_CUDADOUBLE_H */
