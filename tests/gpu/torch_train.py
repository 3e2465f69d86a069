"""A small transformer training loop for the GPU tests: deterministic losses (printed exactly,
as float.hex) and the median step time. Run it with and without the shim, with PyTorch's
caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1): the losses must be identical.

    python3 torch_train.py [steps] [warmup]

Under scripts/bench's call timer (tests/perf/call_timer.cpp, preloaded) the warm-up's calls are
forgotten when it ends, so that the timer counts exactly the timed steps.
"""
import ctypes
import os
import statistics
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    warmup = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda")
    vocab, width, seq, batch = 1000, 256, 128, 32
    layer = torch.nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=1024, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, width), torch.nn.TransformerEncoder(layer, num_layers=4),
                                torch.nn.Linear(width, vocab)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator(device="cpu").manual_seed(99)
    times = []
    reset_call_timer = getattr(ctypes.CDLL(None), "call_timer_reset", None)
    for step in range(warmup + steps):
        if step == warmup and reset_call_timer is not None:
            torch.cuda.synchronize()
            reset_call_timer()
        # Sequence lengths vary from step to step, as real batches do: allocation sizes vary too.
        length = 64 + (step * 37) % (seq - 63)
        tokens = torch.randint(0, vocab, (batch, length + 1), generator=generator).to(device)
        torch.cuda.synchronize()
        start = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        value = loss.item()
        torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - start)
        print(f"loss {step} {value.hex()}")
    print(f"median_step_ms {1000 * statistics.median(times):.3f}", file=sys.stderr)
    print(f"mean_step_ms {1000 * statistics.mean(times):.3f}", file=sys.stderr)
    print(f"max_allocated_mb {torch.cuda.max_memory_allocated() / 2**20:.1f}", file=sys.stderr)
    print(f"max_reserved_mb {torch.cuda.max_memory_reserved() / 2**20:.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
