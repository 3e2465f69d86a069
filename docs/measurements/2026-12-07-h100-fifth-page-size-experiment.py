#!/usr/bin/env python3
"""Page-size experiment (issue 13): interleaved rounds of churn, torch_train and GPT-2 under the
shim with POOLSHIM_PAGE variants (and natives), NVML peak + speed + pool reserved peak.
usage: pagexp.py LIB CHURN_BIN OUTDIR BUDGET_S"""
import json, os, statistics, sys, time, glob
sys.path.insert(0, "tests/bench")
from nvml_peak import run_sampled
lib, churn, out, budget = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
t0 = time.time()
py = sys.executable
W = {
 "churn": ([churn, "malloc", "10000", "64", str(128 << 20), "none", "5000"], "us_per_pair",
           [("native", None), ("p20 sync", {"POOLSHIM_PAGE": "20M"}), ("p10 sync", {"POOLSHIM_PAGE": "10M"}),
            ("p8 sync", {"POOLSHIM_PAGE": "8M"}), ("p20 ordered", {"POOLSHIM_PAGE": "20M", "POOLSHIM_FREE": "ordered"}),
            ("p10 ordered", {"POOLSHIM_PAGE": "10M", "POOLSHIM_FREE": "ordered"})]),
 "torch_train": ([py, "tests/gpu/torch_train.py", "30", "10"], "median_step_ms",
           [("uncached", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "_noshim": 1}),
            ("p20", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "POOLSHIM_PAGE": "20M"}),
            ("p10", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "POOLSHIM_PAGE": "10M"}),
            ("p8", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "POOLSHIM_PAGE": "8M"})]),
 "gpt2": ([py, "tests/gpu/gpt2_train.py", "--steps", "12", "--warmup", "2", "--batch", "8"], "median_step_ms",
           [("caching", {"_noshim": 1}),
            ("p20", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "POOLSHIM_PAGE": "20M"}),
            ("p10", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "POOLSHIM_PAGE": "10M"})]),
}
res = {}
for r in range(1, 4):
    for wname, (argv, key, conts) in W.items():
        for cname, env in conts:
            if time.time() - t0 > budget:
                break
            e = dict(os.environ)
            e.pop("LD_PRELOAD", None)
            shim = env is not None and "_noshim" not in env
            folder = os.path.join(out, f"{wname}-{cname.replace(' ', '_')}-r{r}")
            os.makedirs(folder, exist_ok=True)
            for k, v in (env or {}).items():
                if not k.startswith("_"): e[k] = v
            if shim:
                e["LD_PRELOAD"] = lib
                e["POOLSHIM_LOG"] = os.path.join(folder, "log-%p.jsonl")
            rc, so, se, peak, n = run_sampled(argv, e, timeout=300)
            val = None
            for line in (so + "\n" + se).splitlines():
                if line.startswith(key + " "): val = float(line.split()[1])
                if line.startswith("churn_bench:"):
                    for f in line.split():
                        if f.startswith("us_per_pair="): val = float(f.split("=")[1])
            reserved = None
            for p in glob.glob(os.path.join(folder, "log-*.jsonl")):
                for line in open(p):
                    rec = json.loads(line)
                    if rec.get("type") == "exit" and rec.get("pooled_allocs", 0) > 0:
                        reserved = rec["devices"][0]["reserved_bytes_peak"] / 2**20
            res.setdefault(wname, {}).setdefault(cname, []).append((val, peak / 2**20, reserved, rc))
            print(f"r{r} {wname:12s} {cname:12s} rc={rc} speed={val} nvml={peak/2**20:.0f} MiB reserved={reserved} t={time.time()-t0:.0f}s", flush=True)
print("== medians")
for wname, d in res.items():
    for cname, runs in d.items():
        sp = [x[0] for x in runs if x[0] is not None]; nv = [x[1] for x in runs]; rs = [x[2] for x in runs if x[2] is not None]
        print(f"{wname:12s} {cname:12s} n={len(runs)} speed {statistics.median(sp) if sp else None} ({min(sp) if sp else '-'}-{max(sp) if sp else '-'}) "
              f"nvml {statistics.median(nv):.0f} ({min(nv):.0f}-{max(nv):.0f}) reserved {statistics.median(rs) if rs else '-'}")
json.dump(res, open(os.path.join(out, "pagexp.json"), "w"))
