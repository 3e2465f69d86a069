# Records the GPT-2 loop (tests/gpu/gpt2_train.py)'s allocation trace (PyTorch's memory history; requested sizes, host
# order) into a CSV: action,addr,size,stream.
import sys, runpy, torch
torch.cuda.memory._record_memory_history(max_entries=3_000_000)
sys.argv = ["gpt2_train.py", "--steps", "12", "--warmup", "2"]
try:
    runpy.run_path("tests/gpu/gpt2_train.py", run_name="__main__")
except SystemExit:
    pass
snap = torch.cuda.memory._snapshot()
out = open(sys.argv_out if hasattr(sys, "argv_out") else "/tmp/trace.csv", "w")
n = 0
for dev, tr in enumerate(snap["device_traces"]):
    for e in tr:
        if e["action"] in ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free"):
            out.write(f"{e['action']},{e['addr']},{e['size']},{e['stream']}\n"); n += 1
out.close()
print("events", n, "max_allocated", torch.cuda.max_memory_allocated() >> 20, "MiB", file=sys.stderr)
