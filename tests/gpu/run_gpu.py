#!/usr/bin/env python3
"""The GPU suite (DESIGN §6.3-4), run by scripts/gpu-test on a machine with an NVIDIA GPU.

1. Builds the test programs with nvcc twice: shared runtime (-cudart shared) and nvcc's
   default static runtime (plus per-thread-default-stream variants).
2. Differential runs: each program with and without the shim; exit codes and standard output
   (which prints CUDA error names, checksums and corruption counts) must be identical. Logs of
   shared-runtime builds must show the allocations pooled (exact counts where the program
   fixes them); static-runtime builds run untouched and their log says why nothing was pooled.
3. Measurements, side by side in this one run: the churn loop (cudaMalloc/cudaFree, mixed
   sizes 256 B - 128 MiB) with and without the shim, and a PyTorch training loop with
   PYTORCH_NO_CUDA_MEMORY_CACHING=1 with and without the shim (identical losses required),
   next to PyTorch's own caching allocator.

    run_gpu.py --build BUILD --out OUT [--skip-bench] [--skip-torch]
"""

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from harness import (ROOT, Failure, clean_environment, compare, exit_device, exit_record, expect,  # noqa: E402
                     expect_equal, logs_in, parse_fields, poolshim_log, records_of, run_process, with_shim)

CUDA = os.environ.get("CUDA_HOME", "/usr/local/cuda")
PROGRAMS = {  # name -> (source, extra nvcc flags)
    "api_edges": ("tests/programs/api_edges.cpp", []),
    "churn": ("tests/programs/churn.cpp", []),
    "demo": ("tests/programs/demo.cpp", []),
    "oom_exit": ("tests/programs/oom_exit.cpp", []),
    "threads": ("tests/programs/threads.cpp", []),
    "kernels_diff": ("tests/gpu/kernels_diff.cu", []),
    "kernels_diff_ptds": ("tests/gpu/kernels_diff.cu", ["--default-stream", "per-thread"]),
    "churn_ptds": ("tests/programs/churn.cpp", ["-DCUDA_API_PER_THREAD_DEFAULT_STREAM=1"]),
}
RUNTIMES = ("shared", "static")


class Suite:
    def __init__(self, build, out):
        self.build = build
        self.out = out
        self.library = os.path.join(build, "libpoolshim.so")
        self.results = {"cases": [], "measurements": {}}
        self.failures = 0

    # ---- building ---------------------------------------------------------------------
    def binary(self, name, runtime):
        return os.path.join(self.build, "gpu", runtime, name)

    def compile_all(self):
        jobs = []
        for name, (source, flags) in PROGRAMS.items():
            for runtime in RUNTIMES:
                target = self.binary(name, runtime)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                jobs.append([os.path.join(CUDA, "bin", "nvcc"), "-O2", "-std=c++17", "-arch=sm_90",
                             "-Itests/programs", "-cudart", runtime, *flags, os.path.join(ROOT, source),
                             "-o", target, "-lpthread"])
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
            done = list(pool.map(lambda cmd: subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True), jobs))
        for cmd, d in zip(jobs, done):
            if d.returncode != 0:
                print(d.stdout + d.stderr)
                raise SystemExit(f"nvcc failed: {' '.join(cmd)}")
        print(f"built {len(jobs)} test programs (shared and static runtime)")

    # ---- running ----------------------------------------------------------------------
    def env(self, extra=None):
        env = clean_environment()
        env["LD_LIBRARY_PATH"] = os.path.join(CUDA, "lib64") + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        env.update(extra or {})
        return env

    def logdir(self, case):
        d = os.path.join(self.out, "logs", case)
        os.makedirs(d, exist_ok=True)
        return d

    def differential(self, case, args, extra=None, timeout=300):
        folder = self.logdir(case)
        native = run_process(args, self.env(extra), timeout)
        shim = run_process(args, with_shim(self.env(extra), self.library, os.path.join(folder, "log-%p.jsonl")), timeout)
        compare(args, native, shim)
        return native, shim, [poolshim_log.read_log(p) for p in logs_in(folder)]

    def case(self, name, fn):
        started = time.time()
        try:
            detail = fn() or ""
            status = "passed"
        except Failure as e:
            status, detail = "FAILED", str(e)
            self.failures += 1
        except Exception:  # a broken test is a failure too, with its traceback
            status, detail = "FAILED", traceback.format_exc()
            self.failures += 1
        self.results["cases"].append({"case": name, "status": status, "detail": detail,
                                      "seconds": round(time.time() - started, 2)})
        print(f"{status:6} {name} ({time.time() - started:.1f} s){': ' + detail if detail else ''}", flush=True)

    # ---- differential cases -----------------------------------------------------------
    def pooled(self, logs, expected=None):
        expect_equal(len(logs), 1, "logs")
        ex = exit_record(logs[0])
        if expected is None:
            expect(ex["pooled_allocs"] > 0, f"nothing pooled: {ex}")
        else:
            expect_equal(ex["pooled_allocs"], expected, "pooled allocations")
        return ex

    def untouched(self, logs):
        expect_equal(len(logs), 1, "logs")
        ex = exit_record(logs[0])
        expect_equal(ex["pooled_allocs"], 0, "pooled allocations of a static-runtime program")
        expect(any("probably links the CUDA runtime statically" in n for n in ex["notes"]), ex["notes"])

    def run_differential_cases(self):
        for runtime in RUNTIMES:
            shared = runtime == "shared"
            check = (lambda logs, n=None: self.pooled(logs, n)) if shared else (lambda logs, n=None: self.untouched(logs))

            def api_edges(runtime=runtime, check=check, shared=shared):
                native, shim, logs = self.differential(f"api_edges-{runtime}", [self.binary("api_edges", runtime)])
                for line in ("oom_huge: cudaErrorMemoryAllocation", "final_last_error: cudaSuccess"):
                    expect(line in shim.out, f"missing {line!r}:\n{shim.out}")
                check(logs)
                if shared:
                    ex, d = exit_device(logs[0])
                    expect_equal(d["ooms"], 1, "ooms")
                    expect_equal(d["reset_dropped"], 1, "reset_dropped")
                    expect_equal(ex["leaks"]["count"], 0, "leaks")
                    return f"pooled {ex['pooled_allocs']}, oom retries {d['oom_retries']} ({d['oom_retry_successes']} ok)\n" + shim.out
                return shim.out
            self.case(f"api_edges [{runtime}]", api_edges)

            def churn(runtime=runtime, check=check):
                native, shim, logs = self.differential(f"churn-{runtime}", [self.binary("churn", runtime), "2000", "64"])
                check(logs, 2064)
            self.case(f"churn [{runtime}]", churn)

            def churn_async(runtime=runtime, check=check, shared=shared):
                native, shim, logs = self.differential(f"churn-async-{runtime}", [self.binary("churn_ptds", runtime), "2000", "64", str(128 << 20), "async"])
                check(logs, 2064)
                if shared:
                    expect_equal(exit_device(logs[0])[1]["async_allocs"], 2064, "async allocations (_ptsz)")
            self.case(f"churn async, per-thread default stream [{runtime}]", churn_async)

            def demo(runtime=runtime, check=check):
                native, shim, logs = self.differential(f"demo-{runtime}", [self.binary("demo", runtime), "100"])
                check(logs, 1 + 100 * 7)
                if runtime == "shared":
                    expect_equal(exit_record(logs[0])["leaks"]["bytes"], 3 << 20, "leaked bytes")
            self.case(f"demo [{runtime}]", demo)

            def oom_exit(runtime=runtime, check=check, shared=shared):
                native, shim, logs = self.differential(f"oom_exit-{runtime}", [self.binary("oom_exit", runtime)])
                expect_equal(shim.rc, 3, "exit status")
                check(logs)
                if shared:
                    ooms = records_of(logs[0], "oom")
                    expect_equal(len(ooms), 1, "oom records")
                    expect_equal(ooms[0]["verdict"], "exhausted", "verdict")
                    return [l for l in shim.err.splitlines() if "out of memory" in l][0]
            self.case(f"oom_exit [{runtime}]", oom_exit)

            def threads(runtime=runtime, check=check):
                native, shim, logs = self.differential(f"threads-{runtime}", [self.binary("threads", runtime)])
                check(logs, 2400)
            self.case(f"threads [{runtime}]", threads)

            for variant in ("kernels_diff", "kernels_diff_ptds"):
                def kernels(runtime=runtime, check=check, variant=variant):
                    native, shim, logs = self.differential(f"{variant}-{runtime}", [self.binary(variant, runtime), "fault"])
                    for line in shim.out.splitlines():
                        if "corrupted=" in line:
                            expect_equal(parse_fields(line)["corrupted"], "0", line)
                    check(logs)
                    return shim.out
                self.case(f"{variant} [{runtime}]", kernels)

    # ---- measurements -----------------------------------------------------------------
    def churn_rate(self, args, shim, repeats=3):
        rates = []
        for _ in range(repeats):
            env = self.env({"POOLSHIM_LOG": ""})
            if shim:
                env = with_shim(env, self.library, None)
            r = run_process(args, env, 600)
            expect_equal(r.rc, 0, f"churn exit status\n{r.describe()}")
            rates.append(float(r.err.split("us_per_pair")[1].split()[0]))
        return statistics.median(rates), rates

    def bench_churn(self):
        table = {}
        for live, iterations in ((64, 20000), (1, 20000)):
            args = [self.binary("churn", "shared"), str(iterations), str(live), str(128 << 20)]
            native, native_all = self.churn_rate(args, False)
            shim, shim_all = self.churn_rate(args, True)
            table[f"churn {live} live"] = {"native_us": native, "shim_us": shim, "ratio": native / shim,
                                           "native_runs": native_all, "shim_runs": shim_all}
        self.results["measurements"]["churn"] = table
        return "; ".join(f"{k}: native {v['native_us']:.2f} us/pair, shim {v['shim_us']:.2f} us/pair, {v['ratio']:.1f}x"
                         for k, v in table.items())

    def torch_run(self, label, extra, shim):
        folder = self.logdir(f"torch-{label}")
        env = self.env(dict(extra, PYTHONUNBUFFERED="1"))
        if shim:
            env = with_shim(env, self.library, os.path.join(folder, "log-%p.jsonl"))
        r = run_process([sys.executable, os.path.join(HERE, "torch_train.py"), "40", "5"], env, 600)
        expect_equal(r.rc, 0, f"torch {label} exit status\n{r.describe()}")
        fields = dict(line.split()[:2] for line in r.err.splitlines() if line.startswith(("median_step_ms", "max_reserved_mb")))
        losses = [line for line in r.out.splitlines() if line.startswith("loss ")]
        logs = [poolshim_log.read_log(p) for p in logs_in(folder)]
        return losses, float(fields["median_step_ms"]), float(fields["max_reserved_mb"]), logs

    def bench_torch(self):
        cached, cached_ms, cached_mb, _ = self.torch_run("cached", {}, False)
        uncached, uncached_ms, _, _ = self.torch_run("uncached", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, False)
        shimmed, shim_ms, _, logs = self.torch_run("uncached-shim", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, True)
        expect_equal(shimmed, uncached, "losses with and without the shim (uncached)")
        expect_equal(len(uncached), 45, "loss lines")
        main_logs = [l for l in logs if exit_record(l)["pooled_allocs"] > 0]
        expect_equal(len(main_logs), 1, "logs with pooled allocations")
        ex = exit_record(main_logs[0])
        self.results["measurements"]["torch"] = {
            "cached_ms": cached_ms, "cached_max_reserved_mb": cached_mb, "uncached_ms": uncached_ms,
            "uncached_shim_ms": shim_ms, "uncached_over_shim": uncached_ms / shim_ms,
            "shim_over_cached": shim_ms / cached_ms, "pooled_allocs": ex["pooled_allocs"],
            "losses_identical": True, "same_as_cached": cached == uncached}
        return (f"step ms: cached {cached_ms:.2f}, uncached {uncached_ms:.2f}, uncached+shim {shim_ms:.2f} "
                f"(uncached/shim {uncached_ms / shim_ms:.2f}x, shim/cached {shim_ms / cached_ms:.2f}x); "
                f"{ex['pooled_allocs']} allocations pooled; losses identical; cached losses equal too: {cached == uncached}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--skip-torch", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    suite = Suite(os.path.realpath(args.build), os.path.realpath(args.out))
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    suite.results["gpu"] = gpu
    print(f"GPU: {gpu}")
    suite.compile_all()
    suite.run_differential_cases()
    if not args.skip_bench:
        suite.case("measure: churn, cudaMalloc/cudaFree with and without the shim", suite.bench_churn)
    if not args.skip_torch:
        suite.case("measure: PyTorch uncached with and without the shim", suite.bench_torch)
    with open(os.path.join(args.out, "gpu-results.json"), "w") as f:
        json.dump(suite.results, f, indent=1)
    passed = sum(c["status"] == "passed" for c in suite.results["cases"])
    print(f"\n{passed} passed, {suite.failures} failed; results in {args.out}/gpu-results.json")
    return 1 if suite.failures else 0


if __name__ == "__main__":
    sys.exit(main())
