"""PyTorch with expandable_segments:True maps its memory through the driver's virtual-memory
calls (cuMemCreate/cuMemMap), which poolshim counts but never pools (issue 15). A training-like
loop of varying sizes; it prints a checksum and PyTorch's own peak of reserved (mapped) bytes,
the independent counter that the shim's `vmm_physical_bytes_peak` must equal.

    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 torch_vmm.py
"""
import torch


def main():
    torch.manual_seed(0)
    total = 0.0
    keep = []
    for step in range(40):
        n = 1 << (16 + step % 8)  # 256 KiB to 32 MiB of floats
        x = torch.randn(n, device="cuda")
        y = (x * 2 + 1).relu()
        total += float(y.sum().item())
        if step % 5 == 0:
            keep.append(y)  # some live on
        if len(keep) > 4:
            keep.pop(0)
    torch.cuda.synchronize()
    print(f"torch_vmm: checksum {total:.6e}")
    print(f"torch_vmm: reserved peak {torch.cuda.max_memory_reserved()}")


if __name__ == "__main__":
    main()
