"""JAX with XLA's platform allocator (XLA_PYTHON_CLIENT_ALLOCATOR=platform) allocates every
buffer through the CUDA driver: under the shim those allocations must be pooled and the
results unchanged."""
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402


def main():
    total = 0.0
    f = jax.jit(lambda x: jnp.tanh(x) * 2.0 + x.sum())
    for step in range(50):
        x = jnp.arange(1000 + 97 * step, dtype=jnp.float32) / 1000.0
        total += float(f(x).sum())
    print(f"jax: {jax.devices()[0].platform}, total {total:.6e}")


if __name__ == "__main__":
    main()
