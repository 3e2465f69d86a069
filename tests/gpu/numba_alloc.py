"""numba allocates through the CUDA driver API (cuMemAlloc through cuda.bindings, whose
function pointers come from cuGetProcAddress): under the shim its allocations must be pooled
and its results unchanged. Array operations only: numba's JIT is not needed for allocation
(and numba-cuda 0.30 cannot compile kernels against the numpy 2.5 of the GPU image)."""
import numpy as np
from numba import cuda


def main():
    total = 0.0
    for step in range(100):
        n = 1000 + 37 * step
        d_in = cuda.to_device(np.arange(n, dtype=np.float64) * (step + 1))
        d_out = cuda.device_array(n, dtype=np.float64)
        d_out.copy_to_device(d_in)  # device to device
        total += float(d_out.copy_to_host().sum())
        del d_in, d_out  # numba frees in batches (pending deallocations)
    print(f"numba: 200 device arrays, total {total!r}")


if __name__ == "__main__":
    main()
