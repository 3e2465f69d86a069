"""numba allocates through the CUDA driver API (cuMemAlloc via its driver bindings): under
the shim its allocations must be pooled and its results unchanged."""
import numpy as np
from numba import cuda


@cuda.jit
def scale(out, inp, factor):
    i = cuda.grid(1)
    if i < inp.size:
        out[i] = inp[i] * factor


def main():
    total = 0.0
    for step in range(100):
        n = 1000 + 37 * step
        d_in = cuda.to_device(np.arange(n, dtype=np.float64))
        d_out = cuda.device_array(n, dtype=np.float64)
        scale[(n + 127) // 128, 128](d_out, d_in, 2.0)
        total += float(d_out.copy_to_host().sum())
        del d_in, d_out
    cuda.current_context().deallocations.clear()
    print(f"numba: 200 device arrays, total {total!r}")


if __name__ == "__main__":
    main()
