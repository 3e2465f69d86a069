"""torch.multiprocessing shares CUDA tensors through legacy IPC (issue 14): the parent makes
two tensors with PyTorch's caching allocator on (its segments come from cudaMalloc, which the
shim pools), a spawned child doubles them in place, and the parent checks every element. Run it
with and without the shim: the output must be the same. A third tensor goes the other way: the
child makes it and the parent reads it.

    python3 torch_ipc.py
"""
import sys

import torch
import torch.multiprocessing as mp

SIZES = (1000, 6 << 20)  # int64 elements: 8 KB (a small segment), 48 MiB (a large one)


def child(inbox, outbox):
    tensors = inbox.get()
    for t in tensors:
        t.mul_(2)
    torch.cuda.synchronize()
    made = torch.arange(3 << 20, dtype=torch.int64, device="cuda") * 3
    outbox.put(made)
    outbox.put([int(t.sum().item()) for t in tensors])
    inbox.get()  # the parent has read `made`: it may go now


def main():
    mp.set_start_method("spawn")
    tensors = [torch.arange(n, dtype=torch.int64, device="cuda") for n in SIZES]
    inbox, outbox = mp.Queue(), mp.Queue()
    p = mp.Process(target=child, args=(inbox, outbox))
    p.start()
    inbox.put(tensors)
    made = outbox.get()
    sums = outbox.get()
    ok = True
    for n, t, s in zip(SIZES, tensors, sums):
        want = torch.arange(n, dtype=torch.int64, device="cuda") * 2
        same = bool(torch.equal(t, want))
        print(f"parent: tensor of {n} elements doubled by the child: {same}, child's sum {s == n * (n - 1)}")
        ok = ok and same and s == n * (n - 1)
    want = torch.arange(3 << 20, dtype=torch.int64, device="cuda") * 3
    same = bool(torch.equal(made, want))
    print(f"parent: the child's tensor of {3 << 20} elements: {same}")
    ok = ok and same
    del made
    inbox.put("done")
    p.join(120)
    print(f"parent: child exited {p.exitcode}")
    return 0 if ok and p.exitcode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
