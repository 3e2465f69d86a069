"""A GPT-2-class training loop for the memory benchmarks (issue 13): a `transformers` GPT-2 small
built from a config (no download: 12 layers, width 768, 12 heads, vocabulary 50257), batch 8 by
default, the sequence length varying from 64 to 512 from step to step as real batches do, AdamW.
Its GPU time per step (20-50 ms on an H200) lets the CPU run ahead of the GPU, which a small loop
hides. Prints the losses (float.hex, identical with and without the shim when PyTorch's caching
is off) and, on stderr, the median step time and PyTorch's own peaks.

    python3 gpt2_train.py [--steps N] [--warmup N] [--batch N] [--budget-mb MB] [--attention eager]

--budget-mb: PyTorch's allocator may hold at most this much (set_per_process_memory_fraction;
only PyTorch's native allocator honours it: under PYTORCH_NO_CUDA_MEMORY_CACHING=1 set
POOLSHIM_LIMIT instead). An out-of-memory error prints 'oom <step>' on stderr and exits 4.
--attention: transformers' attention implementation (default sdpa, whose backward kernels may
accumulate in a different order from run to run; eager is deterministic).
"""
import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

LENGTHS = (512, 64, 448, 128, 384, 192, 320, 256, 480, 96, 352, 224)  # 512 first: the peak early


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--budget-mb", type=float, default=0)
    parser.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa")
    args = parser.parse_args()
    torch.manual_seed(1234)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda")
    if args.budget_mb > 0:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(args.budget_mb * 2**20 / total, torch.cuda.current_device())
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=512,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation=args.attention)
    model = GPT2LMHeadModel(config).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator(device="cpu").manual_seed(99)
    times = []
    step = 0
    try:
        for step in range(args.warmup + args.steps):
            length = LENGTHS[step % len(LENGTHS)]
            tokens = torch.randint(0, config.vocab_size, (args.batch, length), generator=generator).to(device)
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = model(tokens, labels=tokens)
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            optimizer.step()
            value = out.loss.item()
            torch.cuda.synchronize()
            if step >= args.warmup:
                times.append(time.perf_counter() - start)
            print(f"loss {step} {value.hex()}")
    except torch.cuda.OutOfMemoryError:
        print(f"oom {step}", file=sys.stderr)
        sys.exit(4)
    except RuntimeError as e:  # uncached PyTorch reports cudaMalloc's failure as a RuntimeError
        if "out of memory" not in str(e):
            raise
        print(f"oom {step}", file=sys.stderr)
        sys.exit(4)
    print(f"median_step_ms {1000 * statistics.median(times):.3f}", file=sys.stderr)
    print(f"max_allocated_mb {torch.cuda.max_memory_allocated() / 2**20:.1f}", file=sys.stderr)
    print(f"max_reserved_mb {torch.cuda.max_memory_reserved() / 2**20:.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
