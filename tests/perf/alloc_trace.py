# Records a PyTorch script's allocation trace (PyTorch's memory history: requested sizes, host
# order) into a CSV of action,addr,size,stream lines, which tests/perf/heap_replay reads.
#
#     python3 tests/perf/alloc_trace.py [OUT.csv [SCRIPT [ARGS...]]]
#
# Defaults: /tmp/trace.csv and the GPT-2 loop (tests/gpu/gpt2_train.py --steps 12 --warmup 2).
# docs/measurements/2026-12-03-gpt2-alloc-trace.csv.gz is the GPT-2 loop's; the torch_train
# trace (2026-12-04-torch-train-alloc-trace.csv.gz) was recorded the same way, torch_train.py 12 2
# (alloc and free_requested lines only).
import runpy
import sys

import torch

out_path = sys.argv[1] if len(sys.argv) > 1 else "/tmp/trace.csv"
script = sys.argv[2] if len(sys.argv) > 2 else "tests/gpu/gpt2_train.py"
args = sys.argv[3:] if len(sys.argv) > 2 else ["--steps", "12", "--warmup", "2"]
torch.cuda.memory._record_memory_history(max_entries=3_000_000)
sys.argv = [script] + args
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit:
    pass
snap = torch.cuda.memory._snapshot()
n = 0
with open(out_path, "w") as out:
    for tr in snap["device_traces"]:
        for e in tr:
            if e["action"] in ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free"):
                out.write(f"{e['action']},{e['addr']},{e['size']},{e['stream']}\n")
                n += 1
print("events", n, "max_allocated", torch.cuda.max_memory_allocated() >> 20, "MiB", file=sys.stderr)
