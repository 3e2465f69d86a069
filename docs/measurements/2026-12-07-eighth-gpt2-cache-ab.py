#!/usr/bin/env python3
"""GPT-2 (tests/gpu/gpt2_train.py) under the shim with free=ordered and `cache` 64M (the
default), 128M and 256M, beside PyTorch's caching allocator and uncached PyTorch, interleaved
rounds in one call (issue 13, eighth session): does more mapped slack take the misses out of the
fastest mode's step time, and at what NVML cost?

    python3 2026-12-07-eighth-gpt2-cache-ab.py LIBPOOLSHIM OUT.json ROUNDS BUDGET_S
"""
import json
import os
import re
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "bench"))
from nvml_peak import run_sampled  # noqa: E402

MiB = 1 << 20


def exit_figures(folder):
    best = {}
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as f:
            for line in f:
                r = json.loads(line)
                if r.get("type") == "exit":
                    for d in r.get("devices") or []:
                        for k in ("reserved_bytes_peak", "cache_hits", "cache_misses", "fences"):
                            best[k] = max(best.get(k, 0), d.get(k) or 0)
    return best


def one(argv, env, library):
    run_env = dict(env)
    folder = tempfile.mkdtemp(prefix="ab-")
    if library:
        run_env.update(LD_PRELOAD=library, POOLSHIM_LOG=os.path.join(folder, "log-%p.jsonl"))
    rc, out, err, peak, _ = run_sampled(argv, run_env, timeout=600)
    if rc != 0:
        raise SystemExit(f"{argv} failed ({rc}): {err[-2000:]}")
    m = re.search(r"median_step_ms ([0-9.]+)", err)
    res = {"step_ms": float(m.group(1)), "nvml_mib": peak / MiB}
    if library:
        f = exit_figures(folder)
        res.update(reserved_mib=f.get("reserved_bytes_peak", 0) / MiB, misses=f.get("cache_misses"),
                   fences=f.get("fences"))
    return res


def main():
    library, out_json, rounds, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    t0 = time.time()
    py = sys.executable
    env = {k: v for k, v in os.environ.items() if not k.startswith("POOLSHIM_") and k != "LD_PRELOAD"}
    uncached = dict(env, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    argv = [py, "tests/gpu/gpt2_train.py", "--steps", "16", "--warmup", "4", "--batch", "8"]
    contenders = [("caching", env, None)] + [
        (f"ordered cache={c}", dict(uncached, POOLSHIM_FREE="ordered", POOLSHIM_CACHE=c), library)
        for c in ("64M", "128M", "256M")]
    res = {name: [] for name, _, _ in contenders}
    res["uncached"] = [one(argv, uncached, None)]
    print("uncached", res["uncached"][0], flush=True)
    for r in range(rounds):
        for name, e, lib in contenders:
            if time.time() - t0 > budget:
                break
            res[name].append(one(argv, e, lib))
            print(f"round {r + 1} {name}: {res[name][-1]}", flush=True)
    json.dump(res, open(out_json, "w"), indent=1)
    unc = res["uncached"][0]["nvml_mib"]
    cach = statistics.median(m["step_ms"] for m in res["caching"]) if res["caching"] else None
    print("contender, step ms median (spread), / caching, NVML MiB median, / uncached, misses")
    for name, runs in res.items():
        if not runs:
            continue
        st = [m["step_ms"] for m in runs]
        nv = [m["nvml_mib"] for m in runs]
        print(f"{name:22s} {statistics.median(st):8.2f} ({min(st):.1f}-{max(st):.1f}) "
              f"{statistics.median(st) / cach if cach else float('nan'):6.3f}x {statistics.median(nv):8.0f} "
              f"{statistics.median(nv) / unc:6.3f}x {[m.get('misses') for m in runs]}")


main()
