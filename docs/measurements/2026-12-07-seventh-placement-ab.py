"""The seventh session's A/B of the paged arena's placement change (9a20a97), on one GPU machine:
the library before (main e764455, digest 9c593f863cad) and after it (digest a1268c3f5e93), each
under its defaults, on the footprint section's three workloads (scripts/bench's argv), in
interleaved rounds (old, new, old, new, ...), beside the runs without the shim. For each run:
the process's NVML peak (tests/bench/nvml_peak.py), the pool's reserved peak (the log's exit
record) and the speed (churn_bench's us_per_pair, the loops' median_step_ms).

    python3 placement-ab.py OLD_LIB NEW_LIB CHURN_BENCH OUT_JSON [ROUNDS [WORKLOADS]]
"""
import json
import os
import re
import statistics
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "bench"))
from nvml_peak import run_sampled  # noqa: E402

MiB = 1 << 20


def exit_reserved(folder):
    best = None
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as f:
            for line in f:
                r = json.loads(line)
                if r.get("type") == "exit":
                    for d in r.get("devices") or []:
                        v = d.get("reserved_bytes_peak") or 0
                        best = v if best is None else max(best, v)
    return best


def one(argv, env, library):
    run_env = dict(env)
    folder = tempfile.mkdtemp(prefix="ab-")
    if library:
        run_env.update(LD_PRELOAD=library, POOLSHIM_LOG=os.path.join(folder, "log-%p.jsonl"))
    rc, out, err, peak, _ = run_sampled(argv, run_env, timeout=600)
    if rc != 0:
        raise SystemExit(f"{argv} failed ({rc}): {err[-2000:]}")
    m = re.search(r"us_per_pair=([0-9.]+)", out + err) or re.search(r"median_step_ms ([0-9.]+)", err)
    return {"speed": float(m.group(1)), "nvml_mib": peak / MiB,
            "reserved_mib": (exit_reserved(folder) or 0) / MiB if library else None}


def main():
    old, new, churn = sys.argv[1:4]
    out_json = sys.argv[4]
    rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 5  # churn's; the PyTorch loops' rounds - 2
    only = sys.argv[6].split(",") if len(sys.argv) > 6 else ["churn", "torch_train", "gpt2"]
    py = sys.executable
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("POOLSHIM_") or k == "LD_PRELOAD":
            del env[k]
    uncached = dict(env, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    workloads = [
        ("churn", [churn, "malloc", "10000", "64", str(128 * MiB), "none", "5000"], env, rounds),
        ("torch_train", [py, os.path.join(ROOT, "tests/gpu/torch_train.py"), "30", "10"], uncached, max(2, rounds - 2)),
        ("gpt2", [py, os.path.join(ROOT, "tests/gpu/gpt2_train.py"), "--steps", "24", "--warmup", "4",
                  "--batch", "8"], uncached, max(2, rounds - 2)),
    ]
    results = {}
    for name, argv, wenv, n in [w for w in workloads if w[0] in only]:
        runs = {"native": [], "old": [], "new": []}
        modes = [("old", old), ("new", new)]
        if name == "churn":  # the churn loop is no PyTorch process: auto is sync; ordered too
            modes += [("old ordered", old), ("new ordered", new)]
            runs.update({"old ordered": [], "new ordered": []})
        for i in range(n):
            if i == 0:
                runs["native"].append(one(argv, wenv, None))
            for label, lib in modes:
                e = dict(wenv, POOLSHIM_FREE="ordered") if label.endswith("ordered") else wenv
                runs[label].append(one(argv, e, lib))
        results[name] = runs
        print(f"== {name} (medians of {n} rounds; native 1 run)", flush=True)
        base = runs["native"][0]["nvml_mib"] or float("nan")
        for label, rs in runs.items():
            sp = statistics.median(r["speed"] for r in rs)
            nv = statistics.median(r["nvml_mib"] for r in rs)
            res = [r["reserved_mib"] for r in rs if r["reserved_mib"] is not None]
            spread = f"{min(r['speed'] for r in rs):.3f}-{max(r['speed'] for r in rs):.3f}"
            print(f"   {label:12} speed {sp:9.3f} ({spread})  NVML {nv:8.0f} MiB = {nv / base:.3f}x native/uncached"
                  f"  reserved {statistics.median(res) if res else float('nan'):8.0f} MiB", flush=True)
    with open(out_json, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
