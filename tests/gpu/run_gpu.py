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
import re
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from harness import (ROOT, Failure, check_proc_address, clean_environment, compare, exit_device,  # noqa: E402
                     exit_record, expect, expect_equal, expect_exit_snapshot, logs_in, parse_fields,
                     poolshim_log, records_of, run_process, with_shim)

CUDA = os.environ.get("CUDA_HOME", "/usr/local/cuda")
PROGRAMS = {  # name -> (source, extra nvcc flags); each built with the shared and the static runtime
    "api_edges": ("tests/programs/api_edges.cpp", []),
    "churn": ("tests/programs/churn.cpp", []),
    "demo": ("tests/programs/demo.cpp", []),
    "oom_exit": ("tests/programs/oom_exit.cpp", []),
    "threads": ("tests/programs/threads.cpp", []),
    "dlsym_semantics": ("tests/programs/dlsym_semantics.cpp", ["-ldl"]),
    "capture_threads": ("tests/programs/capture_threads.cpp", []),
    "oom_cases": ("tests/programs/oom_cases.cpp", []),
    "kernels_diff": ("tests/gpu/kernels_diff.cu", ["-lcuda"]),
    "kernels_diff_ptds": ("tests/gpu/kernels_diff.cu", ["--default-stream", "per-thread", "-lcuda"]),
    "churn_ptds": ("tests/programs/churn.cpp", ["-DCUDA_API_PER_THREAD_DEFAULT_STREAM=1"]),
    "host_edges": ("tests/programs/host_edges.cpp", ["-ldl"]),
    "ipc_kernels": ("tests/gpu/ipc_kernels.cu", []),
}
# Built with g++ -fsanitize=thread against the real runtime (issue 12: ThreadSanitizer looks up
# its functions through dlsym while it starts, and crashed there with the shim preloaded).
TSAN_PROGRAMS = {"threads": "tests/programs/threads.cpp", "churn": "tests/programs/churn.cpp"}
DRIVER_PROGRAMS = {  # no CUDA runtime at all
    "driver_alloc": ("tests/programs/driver_alloc.cpp", ["-ldl"]),
    "driver_linked": ("tests/programs/driver_linked.cpp", ["-lcuda"]),
    "proc_address": ("tests/programs/proc_address.cpp", ["-ldl"]),
    "per_thread_calls": ("tests/programs/per_thread_calls.cpp", ["-lcuda", "-ldl"]),
    "vmm_alloc": ("tests/programs/vmm_alloc.cpp", ["-ldl"]),
}
RUNTIMES = ("shared", "static")


class Suite:
    def __init__(self, build, out):
        self.build = build
        self.out = out
        self.library = os.path.join(build, "libpoolshim.so")
        self.probe = os.path.join(build, "gpu", "vmm_probe.so")
        self.results = {"cases": [], "measurements": {}}
        self.jax = False
        self.skip_torch = False
        self.failures = 0

    # ---- building ---------------------------------------------------------------------
    def binary(self, name, runtime):
        return os.path.join(self.build, "gpu", runtime, name)

    def compile_all(self):
        jobs = []
        builds = [(name, source, flags, runtime) for name, (source, flags) in PROGRAMS.items() for runtime in RUNTIMES]
        builds += [(name, source, flags, "none") for name, (source, flags) in DRIVER_PROGRAMS.items()]
        for name, source, flags, runtime in builds:
            target = self.binary(name, runtime)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            jobs.append([os.path.join(CUDA, "bin", "nvcc"), "-O2", "-std=c++17", "-arch=sm_90",
                         "-Itests/programs", "-cudart", runtime, os.path.join(ROOT, source),
                         "-o", target, "-lpthread", *flags])
        for name, source in TSAN_PROGRAMS.items():
            for runtime, libraries in (("shared", ["-lcudart"]), ("static", ["-lcudart_static", "-ldl", "-lrt"])):
                target = self.binary(name, "tsan-" + runtime)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                jobs.append(["g++", "-O1", "-g", "-std=c++17", "-fsanitize=thread", "-Itests/programs",
                             "-I" + os.path.join(CUDA, "include"), os.path.join(ROOT, source), "-o", target,
                             "-L" + os.path.join(CUDA, "lib64"), *libraries, "-lpthread"])
        # The independent VMM counter (issue 15): CUPTI's callbacks, loaded by the driver itself.
        jobs.append(["gcc", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-I" + os.path.join(CUDA, "include"),
                     os.path.join(ROOT, "tests/gpu/vmm_probe.c"), "-o", self.probe, "-L" + os.path.join(CUDA, "lib64"),
                     "-lcupti", "-lpthread", "-Wl,-rpath," + os.path.join(CUDA, "lib64")])
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
    def pooled(self, logs, expected=None, runtime="shared"):
        """The one log of a run: allocations pooled (exactly `expected` when given), through
        the runtime hooks for a shared-runtime build and the driver hooks for a static one."""
        main = [l for l in logs if exit_record(l)["pooled_allocs"] > 0] or logs
        expect_equal(len(main), 1, "logs with pooled allocations")
        ex = exit_record(main[0])
        if expected is None:
            expect(ex["pooled_allocs"] > 0, f"nothing pooled: {ex}")
        else:
            expect_equal(ex["pooled_allocs"], expected, "pooled allocations")
        if runtime == "static":
            expect_equal(ex["paths"]["runtime_hooks"], 0, "runtime hook calls of a static-runtime build")
            expect(ex["paths"]["driver_hooks"] > 0 and ex["paths"]["cuGetProcAddress"] > 0, ex["paths"])
        elif runtime == "shared":
            expect(ex["paths"]["runtime_hooks"] > 0, ex["paths"])
        return ex

    def run_differential_cases(self):
        for runtime in RUNTIMES:
            def check(logs, n=None, runtime=runtime):
                return self.pooled(logs, n, runtime)

            def api_edges(runtime=runtime, check=check):
                native, shim, logs = self.differential(f"api_edges-{runtime}", [self.binary("api_edges", runtime)])
                for line in ("oom_huge: cudaErrorMemoryAllocation", "final_last_error: cudaSuccess"):
                    expect(line in shim.out, f"missing {line!r}:\n{shim.out}")
                ex = check(logs)
                ex, d = exit_device(logs[0])
                expect_equal(d["ooms"], 1, "ooms")
                expect_equal(d["reset_dropped"], 1, "reset_dropped")
                expect_equal(ex["leaks"]["count"], 0, "leaks")
                return (f"pooled {ex['pooled_allocs']}, oom retries {d['oom_retries']} ({d['oom_retry_successes']} ok), "
                        f"paths {ex['paths']}")
            self.case(f"api_edges [{runtime}]", api_edges)

            def churn(runtime=runtime, check=check):
                native, shim, logs = self.differential(f"churn-{runtime}", [self.binary("churn", runtime), "2000", "64"])
                return f"paths {check(logs, 2064)['paths']}"
            self.case(f"churn, counted once [{runtime}]", churn)

            def churn_async(runtime=runtime, check=check):
                native, shim, logs = self.differential(f"churn-async-{runtime}", [self.binary("churn_ptds", runtime), "2000", "64", str(128 << 20), "async"])
                check(logs, 2064)
                expect_equal(exit_device(logs[0])[1]["async_allocs"], 2064, "async allocations (_ptsz)")
            self.case(f"churn async, per-thread default stream [{runtime}]", churn_async)

            def demo(runtime=runtime, check=check):
                native, shim, logs = self.differential(f"demo-{runtime}", [self.binary("demo", runtime), "100"])
                check(logs, 1 + 100 * 7)
                expect_equal(exit_record(logs[0])["leaks"]["bytes"], 3 << 20, "leaked bytes")
                # The exit record is written while the pool can still be queried.
                d = exit_device(logs[0])[1]
                expect(d["reserved_bytes_peak"] > 0 and d["device_free"] is not None, f"exit figures: {d}")
                return f"exit record: reserved peak {d['reserved_bytes_peak']}, device free {d['device_free']}"
            self.case(f"demo [{runtime}]", demo)

            def oom_exit(runtime=runtime, check=check):
                native, shim, logs = self.differential(f"oom_exit-{runtime}", [self.binary("oom_exit", runtime)])
                expect_equal(shim.rc, 3, "exit status")
                check(logs)
                ooms = records_of(logs[0], "oom")
                expect_equal(len(ooms), 1, "oom records")
                expect_equal(ooms[0]["verdict"], "exhausted", "verdict")
                return [l for l in shim.err.splitlines() if "out of memory" in l][0]
            self.case(f"oom_exit [{runtime}]", oom_exit)

            def capture_threads(runtime=runtime, check=check):
                native, shim, logs = self.differential(f"capture-{runtime}", [self.binary("capture_threads", runtime)])
                check(logs)
                return shim.out
            self.case(f"frees and allocations while another thread captures [{runtime}]", capture_threads)

            def oom_under_cap(runtime=runtime):
                # A legacy program that allocates 256 MiB layers until it runs out: natively at
                # the H200's ~139 GiB, under POOLSHIM_LIMIT=8G at 8 GiB, as an 8 GiB GPU would.
                args = [self.binary("oom_cases", runtime), "layers", "256"]
                folder = self.logdir(f"oom-cap-{runtime}")
                native = run_process(args, self.env(), 300)
                env = with_shim(self.env({"POOLSHIM_LIMIT": "8G", "POOLSHIM_BACKTRACE": "16"}), self.library,
                                os.path.join(folder, "log-%p.jsonl"))
                shim = run_process(args, env, 300)
                expect_equal((native.rc, shim.rc), (3, 3), f"exit statuses\n{native.describe()}\n{shim.describe()}")
                held = int(shim.out.split("failed after ")[1].split(":")[0])
                expect(30 <= held <= 32, f"layers held under an 8 GiB cap: {shim.out}")
                logs = [poolshim_log.read_log(p) for p in logs_in(folder)]
                ooms = records_of(logs[0], "oom")
                expect_equal(len(ooms), 1, "oom records")
                o = ooms[0]
                expect_equal((o["verdict"], o["cap_bytes"]), ("cap", 8 << 30), "verdict and cap")
                top = poolshim_log.site_text(o["site"])
                expect(top.startswith("(anonymous namespace)::allocate_layer"), f"top call site: {top}")
                top_group = poolshim_log.site_text(o["by_site"][0]["site"])
                expect(top_group.startswith("(anonymous namespace)::allocate_layer"), f"top group: {top_group}")
                block = shim.err[shim.err.index("poolshim: out of memory"):]
                with open(os.path.join(self.out, f"oom-block-{runtime}.txt"), "w") as f:
                    f.write(block)
                return f"native: {native.out.strip()}\n{block}"
            self.case(f"OOM under POOLSHIM_LIMIT names the allocating function [{runtime}]", oom_under_cap)

            def threads(runtime=runtime, check=check):
                native, shim, logs = self.differential(f"threads-{runtime}", [self.binary("threads", runtime)])
                check(logs, 2400)
            self.case(f"threads [{runtime}]", threads)

            if runtime == "shared":  # a static build has no libcudart for RTLD_NEXT to find
                def dlsym_semantics(runtime=runtime):
                    native, shim, logs = self.differential(f"dlsym-{runtime}", [self.binary("dlsym_semantics", runtime)])
                    expect("rtld_next_is_caller_relative: 1" in shim.out, shim.out)
                    expect("cuMemAlloc_v2 from poolshim" in shim.err, shim.err)
                self.case(f"dlsym keeps native semantics [{runtime}]", dlsym_semantics)

            for variant in ("kernels_diff", "kernels_diff_ptds"):
                for mode in ("sync", "ordered", "ordered+legacy_reuse"):
                    def kernels(runtime=runtime, check=check, variant=variant, mode=mode):
                        legacy = mode.endswith("+legacy_reuse")
                        native, shim, logs = self.differential(
                            f"{variant}-{mode.replace('+', '-')}-{runtime}", [self.binary(variant, runtime), "fault"],
                            {"POOLSHIM_FREE": mode.split("+")[0], "POOLSHIM_LEGACY_REUSE": "1" if legacy else "0"})
                        for line in shim.out.splitlines():
                            if "corrupted=" in line:
                                expect_equal(parse_fields(line)["corrupted"], "0", line)
                        ex = check(logs)
                        d = exit_device(logs[0])[1]
                        if mode != "sync":
                            expect(d["ordered_frees"] > 0, f"no ordered free: {d}")
                        # With legacy_reuse the cases behind blocking writers ran through its barrier.
                        expect((d.get("legacy_reuses", 0) > 0) == legacy, f"legacy-barrier reuses: {d}")
                        return (f"ordered frees {d['ordered_frees']} of {d['frees']}, legacy-barrier reuses "
                                f"{d.get('legacy_reuses')}\n" + shim.out)
                    self.case(f"{variant}, free mode {mode} [{runtime}]", kernels)

            # The legacy rule's first case (only stream 0 in use: reuse with no event) and its end at
            # the first stream the program makes, which must be ordered behind the late writer.
            for variant in ("kernels_diff", "kernels_diff_ptds"):
                for first in ("nonblocking", "blocking"):
                    def legacy_first(runtime=runtime, variant=variant, first=first):
                        native, shim, logs = self.differential(
                            f"{variant}-legacy-first-{first}-{runtime}",
                            [self.binary(variant, runtime), f"legacy_first_stream_{first}"],
                            {"POOLSHIM_FREE": "ordered", "POOLSHIM_LEGACY_REUSE": "1"})
                        line = next(l for l in shim.out.splitlines() if "corrupted=" in l)
                        expect_equal(parse_fields(line)["corrupted"], "0", line)
                        d = exit_device(logs[0])[1]
                        expect(d["ordered_frees"] >= 1, f"no ordered free: {d}")
                        return (f"{line}; cache hits {d.get('cache_hits')}, legacy barriers "
                                f"{d.get('legacy_reuses')}, fences {d.get('fences')}")
                    self.case(f"{variant}: only stream 0, then a first {first} stream [{runtime}]", legacy_first)

            # The legacy rule's first case needs the per-thread default stream unused: CUDA 13's
            # runtime looks its variants up at start (no call), so a legacy program keeps it.
            def legacy_alone(runtime=runtime):
                native, shim, logs = self.differential(f"demo-legacy-alone-{runtime}",
                                                       [self.binary("demo", runtime), "20", "65536"],
                                                       {"POOLSHIM_FREE": "ordered"})
                ex, d = exit_device(logs[0])
                expect_equal(ex["legacy_only"], True, f"legacy_only: {ex['paths']}")
                expect_equal(d["legacy_reuses"], 0, "legacy barriers")
                expect(ex["paths"]["per_thread_watches"] >= 12, f"watching thunks: {ex['paths']}")
                return f"legacy_only true, no barrier; paths {ex['paths']}"
            self.case(f"the runtime's per-thread lookups leave the legacy stream alone [{runtime}]", legacy_alone)

            # Two threads' per-thread default streams: a block freed behind one's late writer and
            # taken by the other must wait (a call on that stream ends the barrier-free case).
            for variant in ("kernels_diff", "kernels_diff_ptds"):
                def per_thread(runtime=runtime, variant=variant):
                    native, shim, logs = self.differential(
                        f"{variant}-per-thread-{runtime}", [self.binary(variant, runtime), "per_thread_two_threads"],
                        {"POOLSHIM_FREE": "ordered", "POOLSHIM_LEGACY_REUSE": "1"})
                    expect_equal(shim.out.strip(), "per_thread_two_threads: premise_corrupts=1 corrupted=0",
                                 "the late writer and the data")
                    ex, d = exit_device(logs[0])
                    reused = next((l for l in shim.err.splitlines() if "block_reused=" in l), "block_reused=?")
                    expect_equal(ex["legacy_only"], False, f"legacy_only: {ex['paths']}")
                    return (f"{shim.out.strip()}; {reused.split(': ')[-1]}; legacy barriers "
                            f"{d.get('legacy_reuses')}, fences {d.get('fences')}; paths {ex['paths']}")
                self.case(f"{variant}: two threads' per-thread streams, a block freed behind a late writer [{runtime}]",
                          per_thread)

            # The paged arena's rule: pages of a block whose writer still runs never move.
            def pages_move(runtime=runtime):
                native, shim, logs = self.differential(f"pages-move-{runtime}",
                                                       [self.binary("kernels_diff", runtime), "pages_move"],
                                                       {"POOLSHIM_CACHE": "0", "POOLSHIM_PAGE": "20M"})
                expect_equal(shim.out.strip(), "pages_move_while_kernel_runs: writer=cudaSuccess corrupted=0",
                             "the late writer and the data")
                d = exit_device(logs[0])[1]
                expect_equal(d["reserved_bytes_peak"], 9 * (20 << 20),
                             "reserved peak (9 pages: a's three moved to c once the writer was done)")
                return shim.out.strip()
            self.case(f"paged arena: a late writer's pages stay, then move [{runtime}]", pages_move)

        self.run_host_edge_cases()

        def unmap_under_kernel():
            r = run_process([self.binary("kernels_diff", "shared"), "unmap_under_kernel"], self.env(), 60)
            expect_equal(r.out.strip(), "unmap_under_kernel: sync=cudaErrorIllegalAddress", r.describe())
            return r.out.strip()
        self.case("the page check can fail (pages unmapped under a running kernel fault it, natively)",
                  unmap_under_kernel)

        def selfcheck():
            native, shim, logs = self.differential("selfcheck", [self.binary("kernels_diff", "shared"), "selfcheck"])
            expect("detector_self_check: block_reused=1 corruption_detected=1" in shim.out, shim.out)
            return [l for l in shim.out.splitlines() if "self_check" in l][0]
        self.case("the corruption check can fail (an unordered free, natively too)", selfcheck)

        def driver_alloc():
            native, shim, logs = self.differential("driver_alloc", [self.binary("driver_alloc", "none")])
            ex = self.pooled(logs, 1, "driver")
            expect(ex["paths"]["dlsym"] >= 2, ex["paths"])
        self.case("driver API through dlsym (driver_alloc)", driver_alloc)

        def driver_linked():
            native, shim, logs = self.differential("driver_linked", [self.binary("driver_linked", "none")])
            ex = self.pooled(logs, 200, "driver")
            expect_equal(exit_device(logs[0])[1]["async_allocs"], 100, "cuMemAllocAsync allocations")
            return f"paths {ex['paths']}"
        self.case("driver API linked with -lcuda (driver_linked)", driver_linked)

        def proc_address():
            native = run_process([self.binary("proc_address", "none")], self.env(), 120)
            shim = run_process([self.binary("proc_address", "none")], with_shim(self.env(), self.library, None), 120)
            expect_equal((native.rc, shim.rc), (0, 0), f"{native.describe()}\n{shim.describe()}")
            hooked = check_proc_address(native.out, shim.out)
            expect("cuGetProcAddress 12000 0 -> 0 0 cuGetProcAddress_v2 poolshim" in shim.out, shim.out)
            with open(os.path.join(self.out, "proc_address-driver.txt"), "w") as f:
                f.write(native.out)
            return f"{hooked} of {len(shim.out.splitlines())} lookups answered with the hook of the driver's chosen variant"
        self.case("cuGetProcAddress: every hooked name, version and flag on the real driver", proc_address)

        def per_thread_calls():
            # (the launch modes pass a bogus function, which only the CPU double may see)
            wanted = {"none": True, "lookup": True, "proc": False, "dlsym": False, "direct": False,
                      "legacy": True, "explicit": False, "explicit_proc": False, "capture": False}
            lines = []
            for mode, legacy_only in wanted.items():
                native, shim, logs = self.differential(f"per-thread-calls-{mode}",
                                                       [self.binary("per_thread_calls", "none"), mode],
                                                       {"POOLSHIM_FREE": "ordered"})
                expect(shim.out.startswith(f"per_thread_calls {mode}: 0 0 0 0 0 0 "), f"{mode}: output {shim.out}")
                ex, d = exit_device(logs[0])
                expect_equal(ex["legacy_only"], legacy_only, f"{mode}: legacy_only ({ex['paths']})")
                lines.append(f"{mode}: legacy_only {ex['legacy_only']}, paths {ex['paths']}")
            return "\n".join(lines)
        self.case("the per-thread default stream is seen at a call, not at a lookup (real driver)", per_thread_calls)

        def numba():
            native, shim, logs = self.differential("numba", [sys.executable, os.path.join(HERE, "numba_alloc.py")],
                                                   {"PYTHONUNBUFFERED": "1"}, timeout=300)
            expect_equal(shim.rc, 0, f"exit status\n{shim.describe()}")
            expect(shim.out.startswith("numba: 200 device arrays, total "), shim.out)
            ex = self.pooled(logs, 200, "driver")
            d = exit_device(logs[0])[1]
            expect(d["frees"] >= 180, f"numba's batched frees did not reach the pool: {d['frees']}")
            return f"{shim.out.strip()}; pooled {ex['pooled_allocs']}, freed {d['frees']}, paths {ex['paths']}"
        self.case("numba allocates through the driver API, pooled", numba)

        def jax():
            native, shim, logs = self.differential("jax", [sys.executable, os.path.join(HERE, "jax_alloc.py")],
                                                   {"PYTHONUNBUFFERED": "1"}, timeout=300)
            expect_equal(shim.rc, 0, f"exit status\n{shim.describe()}")
            expect(shim.out.startswith("jax: gpu, total "), shim.out)
            pooled = sum(exit_record(l)["pooled_allocs"] for l in logs)
            paths = [exit_record(l)["paths"] for l in logs]
            return f"{shim.out.strip()}; runs unchanged; {pooled} allocations reached the shim; paths {paths}"
        if self.jax:
            self.case("JAX runs unchanged under the shim (platform allocator)", jax)

    def run_host_edge_cases(self):
        """Issue 12 on the real driver: a program taking signals with sigwait, the exit record as
        one snapshot, dlclose, and a ThreadSanitizer-built CUDA program under the shim. (The
        daemon that closes every descriptor is a CPU case only: on a GPU it closes the driver's
        own descriptors too, and fails natively.)"""
        for runtime in RUNTIMES:
            def sigwait(runtime=runtime):
                # `early`: blocked before CUDA starts, so that the driver's threads block it too
                # (a program that blocks it later loses signals to them natively).
                native, shim, logs = self.differential(f"sigwait-{runtime}", [self.binary("host_edges", runtime),
                                                                              "sigwait", "2000", "early"])
                expect_equal((shim.rc, shim.out), (0, "took 2000 of 2000 signals with sigwait\n"), "status and output")
            self.case(f"signals the program blocks to take with sigwait never reach the shim's thread [{runtime}]",
                      sigwait)

            for name in TSAN_PROGRAMS:
                def tsan(runtime=runtime, name=name):
                    args = [self.binary(name, "tsan-" + runtime)] + (["2000", "16", str(1 << 20)] if name == "churn" else [])
                    # GCC 12's ThreadSanitizer cannot run with the high mmap randomization of
                    # newer kernels ("unexpected memory mapping"): then without ASLR, both runs.
                    options = {"TSAN_OPTIONS": "exitcode=0:suppressions=" +
                               os.path.join(ROOT, "scripts", "tsan-suppressions.txt")}
                    probe = run_process(args, self.env(options), 300)
                    if "unexpected memory mapping" in probe.err:
                        args = ["setarch", os.uname().machine, "-R"] + args
                    native, shim, logs = self.differential(f"tsan-{name}-{runtime}", args, options)
                    expect_equal(shim.rc, 0, f"exit status\n{shim.describe()}")
                    reports = [shim.err.count("WARNING: ThreadSanitizer"), native.err.count("WARNING: ThreadSanitizer")]
                    expect_equal(reports[0], reports[1], f"ThreadSanitizer reports with and without the shim\n{shim.err[-4000:]}")
                    self.pooled(logs, 2400 if name == "threads" else None, runtime)
                    return f"ThreadSanitizer reports: {reports[0]} with the shim, {reports[1]} without"
                self.case(f"a ThreadSanitizer-built {name} runs under the shim [{runtime}]", tsan)

        def exit_snapshot():
            # Natively, a cudaMalloc still in progress while exit() tears the runtime down can
            # crash the process (SIGSEGV, seen once in a suite run on the H200): the program is
            # valid when one of three native runs exits 0.
            for _ in range(3):
                native = run_process([self.binary("host_edges", "shared"), "exit_while_allocating", "4"], self.env(), 120)
                if native.rc == 0:
                    break
            expect_equal(native.rc, 0, f"native exit status (3 runs)\n{native.describe()}")
            for attempt in range(5):
                folder = self.logdir(f"exit-snapshot-{attempt}")
                shim = run_process([self.binary("host_edges", "shared"), "exit_while_allocating", "4"],
                                   with_shim(self.env(), self.library, os.path.join(folder, "log-%p.jsonl")), 120)
                expect_equal(shim.rc, 0, f"exit status\n{shim.describe()}")
                live = expect_exit_snapshot(exit_record(poolshim_log.read_log(logs_in(folder)[0])), f"run {attempt}")
            return f"last run: {live[0]} live allocations, {live[1]} bytes, as the leak report says"
        self.case("the exit record is one snapshot while threads allocate [shared]", exit_snapshot)

        def dlclose():
            result = run_process([self.binary("host_edges", "shared"), "dlclose", self.library],
                                 self.env({"POOLSHIM_LOG": os.path.join(self.logdir("dlclose"), "log-%p.jsonl")}), 60)
            expect_equal((result.rc, result.out), (0, "dlclose -> 0\nafter dlclose\n"), result.describe())
        self.case("dlclose of a dlopen'ed shim returns [shared]", dlclose)

    def run_observe_cases(self):
        """Observe mode (issue 15): the differential programs with every call native and tracked,
        a capped OOM naming its call site, and the application's own VMM memory in the log."""
        observe = {"POOLSHIM_MODE": "observe"}
        for runtime in RUNTIMES:
            for name, args in (("api_edges", []), ("churn", ["2000", "64"]), ("demo", ["100"]),
                               ("threads", []), ("kernels_diff", ["fault"]), ("kernels_diff_ptds", ["fault"]),
                               ("capture_threads", []), ("oom_exit", [])):
                def differential(runtime=runtime, name=name, args=args):
                    native, shim, logs = self.differential(f"observe-{name}-{runtime}",
                                                           [self.binary(name, runtime)] + args, observe)
                    main = [l for l in logs if exit_device(l)[1]["allocs"] > 0] or logs
                    ex, d = exit_device(main[0])
                    expect_equal(ex["pooled_allocs"], 0, "pooled in observe mode")
                    expect_equal((d["reserved_bytes_peak"], d["cached_bytes_peak"]), (0, 0), "no pool")
                    expect(d["allocs"] > 0 and d["native_bytes_peak"] > 0, f"nothing tracked: {d}")
                    # Read before the runtime's teardown destroys the primary context; after a kernel's
                    # fault the context is lost (every call fails), so the figures are null there.
                    fault = args == ["fault"]
                    expect_equal((d["device_free"] is None, d["other_bytes"] is None), (fault, fault),
                                 f"device figures at exit missing (expected only after a fault): {d}")
                    return (f"rc {shim.rc}, {d['allocs']} tracked, peak {d['native_bytes_peak']} B, "
                            f"other {d['other_bytes']} B")
                self.case(f"observe mode: {name} {' '.join(args)} as natively [{runtime}]", differential)

            def capped(runtime=runtime):
                args = [self.binary("oom_cases", runtime), "layers", "256"]
                # Not a differential: natively the layers fill the whole device, under the cap 8
                # GiB, as on an 8 GiB GPU (the real function refuses the layer past the cap).
                folder = self.logdir(f"observe-oom-cap-{runtime}")
                env = with_shim(self.env(dict(observe, POOLSHIM_LIMIT="8G", POOLSHIM_BACKTRACE="16")),
                                self.library, os.path.join(folder, "log-%p.jsonl"))
                shim = run_process(args, env, 300)
                expect_equal(shim.rc, 3, f"exit status\n{shim.describe()}")
                held = int(shim.out.split("failed after ")[1].split(":")[0])
                expect_equal(held, 32, f"256 MiB layers held under an 8 GiB cap: {shim.out}")
                logs = [poolshim_log.read_log(p) for p in logs_in(folder)]
                o = records_of(logs[0], "oom")[0]
                expect_equal((o["mode"], o["verdict"], o["cap_bytes"]), ("observe", "cap", 8 << 30), "mode, verdict, cap")
                top = poolshim_log.site_text(o["site"])
                expect(top.startswith("(anonymous namespace)::allocate_layer"), f"top call site: {top}")
                return f"{shim.out.strip()}; OOM at {o['used_bytes']} B tracked, from {top}"
            self.case(f"observe mode: OOM under POOLSHIM_LIMIT=8G, its call site named [{runtime}]", capped)

        def probed(case, args, extra, timeout=300):
            """A differential run with the independent VMM counter in both processes: the native
            run's and the shim's counts, and the logs with VMM memory."""
            folder = self.logdir(case)
            probe = {"CUDA_INJECTION64_PATH": self.probe, "VMM_PROBE_DIR": folder}
            native, shim, logs = self.differential(case, args, dict(extra, **probe), timeout)
            counts = {}
            for name in os.listdir(folder):
                if name.startswith("probe-"):
                    with open(os.path.join(folder, name)) as f:
                        words = f.read().split()
                    counts[int(name[6:-4])] = dict(zip(words[::2], map(int, words[1::2])))
            main = [l for l in logs if exit_device(l)[1]["vmm_creates"] > 0]
            expect_equal(len(main), 1, "logs with VMM memory")
            pid = main[0][0]["pid"]
            expect(pid in counts and len(counts) == 2, f"probe counts {counts} (shim pid {pid})")
            ours = counts.pop(pid)
            theirs = next(iter(counts.values()))
            expect_equal((ours["lost"], theirs["lost"]), (0, 0), f"handles the probe lost: {ours} {theirs}")
            return native, shim, main[0], ours, theirs

        def vmm():
            # Also the CUPTI probe's self-check: on a program whose VMM calls are known, it must
            # count exactly them (3 creates of 8 MiB, 2 releases), or its other comparisons mean nothing.
            native, shim, log, probe, native_probe = probed("observe-vmm", [self.binary("vmm_alloc", "none"), "keep"],
                                                            {"POOLSHIM_BACKTRACE": "8"})
            for counts in (probe, native_probe):
                expect_equal(counts, {"creates": 3, "releases": 2, "live": 8 << 20, "peak": 24 << 20, "lost": 0},
                             "the probe's counts of vmm_alloc's calls")
            ex, d = exit_device(log)
            expect_equal((d["vmm_physical_bytes"], d["vmm_physical_bytes_peak"]), (8 << 20, 24 << 20), "VMM bytes")
            expect_equal(d["vmm_released_mapped_bytes_total"], 8 << 20, "released while mapped")
            expect(d["device_free"] is not None and d["other_bytes"] is not None, f"device figures at exit: {d}")
            top = poolshim_log.site_text(ex["devices"][0]["vmm_by_site"][0]["site"])
            expect(top.startswith("(anonymous namespace)::make_physical"), f"VMM call site: {top}")
            return f"{shim.out.splitlines()[-1]}; probe {probe}; other {d['other_bytes']} B; from {top}"
        self.case("the application's own VMM memory is in the log, with its call site; the CUPTI probe counts "
                  "it exactly (real driver)", vmm)

        def torch_vmm(mode):
            native, shim, log, probe, native_probe = probed(
                f"{mode}-torch-vmm", [sys.executable, os.path.join(HERE, "torch_vmm.py")],
                {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "POOLSHIM_BACKTRACE": "8", "POOLSHIM_MODE": mode})
            torch_peak = int(shim.out.split("reserved peak ")[1].split()[0])
            ex, d = exit_device(log)
            expect_equal(d["vmm_physical_bytes_peak"], torch_peak,
                         "the log's VMM peak against PyTorch's own peak of reserved bytes")
            expect(d["device_free"] is not None and d["other_bytes"] is not None, f"device figures at exit: {d}")
            if mode == "observe":  # the pool makes no VMM calls of its own to count
                expect_equal((d["vmm_physical_bytes_peak"], d["vmm_creates"]), (probe["peak"], probe["creates"]),
                             "the log's VMM peak and creates against the CUPTI probe's")
                expect_equal(native_probe["peak"], probe["peak"], "the probe's peak natively and in observe mode")
            sites = ex["devices"][0]["vmm_by_site"]
            top = poolshim_log.site_text(sites[0]["site"]) if sites else "(none live at exit)"
            return (f"VMM peak {d['vmm_physical_bytes_peak']} B = PyTorch's {torch_peak} B; probe (CUPTI) peak "
                    f"{probe['peak']} B, {probe['creates']} creates (native run: {native_probe['peak']} B); log "
                    f"{d['vmm_creates']} creates, {d['vmm_maps']} maps; other {d['other_bytes']} B; top site at exit {top}")
        if not self.skip_torch:
            for mode in ("pool", "observe"):
                self.case(f"PyTorch expandable_segments [{mode} mode]: its VMM peak in the log equals PyTorch's own"
                          + (" and the CUPTI probe's" if mode == "observe" else ""),
                          lambda mode=mode: torch_vmm(mode))

        def jax_vmm():
            native, shim, log, probe, native_probe = probed(
                "observe-jax", [sys.executable, os.path.join(HERE, "jax_alloc.py")],
                {"PYTHONUNBUFFERED": "1", "POOLSHIM_MODE": "observe", "POOLSHIM_BACKTRACE": "8"})
            ex, d = exit_device(log)
            expect(d["vmm_physical_bytes_peak"] > 0, f"no VMM memory in the log: {d}")
            expect_equal((d["vmm_physical_bytes_peak"], d["vmm_creates"]), (probe["peak"], probe["creates"]),
                         "the log's VMM peak and creates against the CUPTI probe's")
            sites = ex["devices"][0]["vmm_by_site"]
            top = poolshim_log.site_text(sites[0]["site"]) if sites else "(none live at exit)"
            return (f"{shim.out.strip()}; VMM peak {d['vmm_physical_bytes_peak']} B = probe's {probe['peak']} B "
                    f"(native run {native_probe['peak']} B), creates {d['vmm_creates']}; other {d['other_bytes']} B; "
                    f"top site at exit {top}")
        if self.jax:
            self.case("JAX (platform allocator) in observe mode: its VMM peak in the log equals the CUPTI probe's",
                      jax_vmm)

    def run_ipc_cases(self):
        """Issue 14 on the real driver: legacy IPC of pooled memory between a parent and its
        child, both ways, with kernels writing and reading the shared buffers, shared and static
        builds, with and without the shim; and torch.multiprocessing with the caching
        allocator on."""
        warning = "pooled memory was exported through legacy IPC"
        for runtime in RUNTIMES:
            def self_check(runtime=runtime):
                native, shim, logs = self.differential(f"ipc-self-check-{runtime}",
                                                       [self.binary("ipc_kernels", runtime), "self_check"])
                expect_equal((shim.rc, shim.out), (0, "self-check: holds its bytes 1, holds other bytes 0, "
                                                      "after one byte changed 0\n"), shim.describe())
            self.case(f"legacy IPC: the kernels' byte checker fails where it must [{runtime}]", self_check)
            for mode in ("parent_to_child", "child_to_parent"):
                def share(runtime=runtime, mode=mode):
                    native, shim, logs = self.differential(f"ipc-{mode}-{runtime}",
                                                           [self.binary("ipc_kernels", runtime), mode])
                    expect_equal(native.rc, 0, f"native exit status\n{native.describe()}")
                    expect_equal(shim.err.count(warning), 1, f"poolshim's export\n{shim.err}")
                    expect_equal(shim.out.count("rewritten 1"), 3, shim.out)
                    expect_equal(shim.out.count("holds the importer's bytes: 1"), 3, shim.out)
                    return " | ".join(line for line in shim.out.splitlines()
                                      if "own" in line or "no handle" in line or "exited child" in line)
                self.case(f"legacy IPC of pooled memory, {mode.replace('_', ' ')}, kernels [{runtime}]", share)

            def unshimmed(runtime=runtime):
                # An importer without the shim: each open fails as bytes that are no handle do.
                args = [self.binary("ipc_kernels", runtime), "parent_to_child"]
                shim = run_process(args, with_shim(self.env({"IPC_SHARE_CHILD_WITHOUT_SHIM": "1"}), self.library,
                                                   os.path.join(self.logdir(f"ipc-unshimmed-{runtime}"), "log-%p.jsonl")), 120)
                expect_equal(shim.rc, 3, shim.describe())
                native_error = [l.split(": ")[-1] for l in shim.out.splitlines() if "no handle" in l]
                expect_equal(len(native_error), 1, shim.out)
                opens = [l for l in shim.out.splitlines() if l.startswith("child: buffer ")]
                expect_equal([l.split("open ")[1].split(",")[0] for l in opens], native_error * 3, shim.out)
                expect_equal(shim.err.count(warning), 1, shim.err)
                return f"each open: {native_error[0]}"
            self.case(f"legacy IPC: an importer without the shim gets the native error [{runtime}]", unshimmed)

            def small(runtime=runtime):
                args = [self.binary("ipc_kernels", runtime), "export_small"]
                native = run_process(args, self.env(), 120)
                shim = run_process(args, with_shim(self.env(), self.library,
                                                   os.path.join(self.logdir(f"ipc-small-{runtime}"), "log-%p.jsonl")), 120)
                expect_equal((native.rc, native.out), (0, "export of 4096 bytes: cudaSuccess\n"), native.describe())
                expect_equal(shim.rc, 1, shim.describe())
                expect("only blocks over 1 MiB" in shim.err, shim.err)
                return shim.out.strip()
            self.case(f"legacy IPC of a 4096-byte pooled block fails with the log's warning [{runtime}]", small)

        def torch_ipc():
            native, shim, logs = self.differential("ipc-torch", [sys.executable, os.path.join(HERE, "torch_ipc.py")],
                                                   timeout=300)
            expect_equal(shim.rc, 0, shim.describe())
            # Both export (the parent two tensors, the child one): each process warns once.
            expect_equal(shim.err.count(warning), 2, f"poolshim's exports\n{shim.err[-3000:]}")
            pooled = sum(exit_record(l)["pooled_allocs"] for l in logs)
            return f"{shim.out.strip()}; {pooled} allocations pooled in {len(logs)} processes"
        self.case("torch.multiprocessing shares CUDA tensors (caching allocator on) under the shim", torch_ipc)

    # ---- measurements -----------------------------------------------------------------
    def churn_rate(self, args, shim, repeats=3, mode="sync"):
        rates = []
        for _ in range(repeats):
            env = self.env({"POOLSHIM_LOG": "", "POOLSHIM_FREE": mode})
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
            ordered, ordered_all = self.churn_rate(args, True, mode="ordered")
            table[f"churn {live} live"] = {"native_us": native, "shim_us": shim, "ratio": native / shim,
                                           "ordered_us": ordered, "ordered_ratio": native / ordered,
                                           "native_runs": native_all, "shim_runs": shim_all, "ordered_runs": ordered_all}
        self.results["measurements"]["churn"] = table
        return "; ".join(f"{k}: native {v['native_us']:.2f} us/pair, shim sync {v['shim_us']:.2f} ({v['ratio']:.1f}x), "
                         f"shim ordered {v['ordered_us']:.2f} ({v['ordered_ratio']:.1f}x)"
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
        shimmed, shim_ms, _, logs = self.torch_run(
            "uncached-shim-sync", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "POOLSHIM_FREE": "sync"}, True)
        ordered, ordered_ms, _, ordered_logs = self.torch_run(
            "uncached-shim-ordered", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "POOLSHIM_FREE": "ordered"}, True)
        expect_equal(shimmed, uncached, "losses with and without the shim (uncached)")
        expect_equal(ordered, uncached, "losses with the shim in free mode ordered (uncached)")
        ordered_main = [l for l in ordered_logs if exit_record(l)["pooled_allocs"] > 0]
        expect_equal(len(ordered_main), 1, "ordered-mode logs with pooled allocations")
        ordered_device = exit_device(ordered_main[0])[1]
        expect(ordered_device["ordered_frees"] > 0, f"no ordered frees: {ordered_device}")
        expect_equal(len(uncached), 45, "loss lines")
        main_logs = [l for l in logs if exit_record(l)["pooled_allocs"] > 0]
        expect_equal(len(main_logs), 1, "logs with pooled allocations")
        ex = exit_record(main_logs[0])
        self.results["measurements"]["torch"] = {
            "cached_ms": cached_ms, "cached_max_reserved_mb": cached_mb, "uncached_ms": uncached_ms,
            "uncached_shim_ms": shim_ms, "uncached_over_shim": uncached_ms / shim_ms,
            "shim_over_cached": shim_ms / cached_ms, "pooled_allocs": ex["pooled_allocs"],
            "uncached_shim_ordered_ms": ordered_ms, "ordered_over_cached": ordered_ms / cached_ms,
            "ordered_frees": ordered_device["ordered_frees"], "frees": ordered_device["frees"],
            "losses_identical": True, "same_as_cached": cached == uncached}
        return (f"step ms: cached {cached_ms:.2f}, uncached {uncached_ms:.2f}, uncached+shim sync {shim_ms:.2f}, "
                f"uncached+shim ordered {ordered_ms:.2f} ({ordered_device['ordered_frees']} of "
                f"{ordered_device['frees']} frees ordered) "
                f"(uncached/shim {uncached_ms / shim_ms:.2f}x, shim/cached {shim_ms / cached_ms:.2f}x, "
                f"ordered/cached {ordered_ms / cached_ms:.2f}x); "
                f"{ex['pooled_allocs']} allocations pooled; losses identical; cached losses equal too: {cached == uncached}")


    # ---- issue 17: a PyTorch run's event log, replayed and viewed -------------------------
    def events_case(self):
        """GPT-2 (tests/gpu/gpt2_train.py, PyTorch's caching off) under the shim's defaults with
        POOLSHIM_EVENTS and call sites: the log replays through poolshim-replay with the recorded
        options to the live run's reserved peak within 10%, and with a second option set; the
        event log exports as a memory_viz snapshot that memory_viz_check.py reads; the HTML page
        of the run is written. The log, the page and the replay's JSON stay in OUT/events/."""
        folder = self.logdir("events-gpt2")
        keep = os.path.join(self.out, "events")
        os.makedirs(keep, exist_ok=True)
        env = with_shim(self.env({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "PYTHONUNBUFFERED": "1",
                                  "POOLSHIM_EVENTS": os.path.join(folder, "events-%p.csv"),
                                  "POOLSHIM_BACKTRACE": "8"}),
                        self.library, os.path.join(folder, "log-%p.jsonl"))
        r = run_process([sys.executable, os.path.join(HERE, "gpt2_train.py"), "--steps", "12", "--warmup", "2"], env, 400)
        expect_equal(r.rc, 0, f"gpt2 under the shim with the event log\n{r.describe()}")
        logs = {p: poolshim_log.read_log(p) for p in logs_in(folder)}
        main = [p for p, l in logs.items() if exit_record(l)["pooled_allocs"] > 0]
        expect_equal(len(main), 1, "logs with pooled allocations")
        log_path = main[0]
        records = logs[log_path]
        start = records_of(records, "start")[0]
        ex, d = exit_device(records)
        events = os.path.join(folder, f"events-{start['pid']}.csv")
        expect(os.path.exists(events), f"no event log {events}: {os.listdir(folder)}")
        expect_equal(ex["event_log_dropped"], 0, "event log records dropped")
        with open(events) as f:
            rows = sum(1 for _ in f) - 1
        expect_equal(rows, ex["event_log_written"], "rows of the event log against event_log_written")
        # free_mode is a sentence ("free=auto: ordered, PyTorch's ... is loaded"): the mode it chose.
        chosen = re.search(r"\b(sync|ordered)\b", start["free_mode"].split(":", 1)[-1])
        expect(chosen is not None, f"no free mode in {start['free_mode']!r}")
        recorded = f"free={chosen.group(1)}"
        replay_json = os.path.join(keep, "replay.json")
        replay_env = dict(self.env(), POOLSHIM_BUILD_DIR=self.build)
        rp = run_process([sys.executable, os.path.join(ROOT, "scripts", "poolshim-replay"), events,
                          "--conf", recorded, "--conf", "free=sync,cache=0", "--json", replay_json],
                         replay_env, 600)
        expect_equal(rp.rc, 0, f"poolshim-replay\n{rp.describe()}")
        runs = json.load(open(replay_json))["runs"]
        live = d["reserved_bytes_peak"]
        replayed = runs[0]["reserved_bytes_peak"]
        ratio = replayed / live
        # Not exact: rows of several threads come in one order, the counters' peak in another.
        requested = runs[0]["requested_bytes_peak"] / d["requested_bytes_peak"]
        expect(abs(requested - 1) <= 0.001, f"replayed requested peak {runs[0]['requested_bytes_peak']} "
               f"against live {d['requested_bytes_peak']}")
        expect(abs(ratio - 1) <= 0.10, f"replayed reserved peak {replayed} against live {live}: {ratio:.3f}")
        snap = os.path.join(keep, "gpt2.pickle")
        report = os.path.join(ROOT, "scripts", "poolshim-report")
        mv = run_process([sys.executable, report, "--quiet", "--memory-viz", snap, "--events", events, log_path],
                         self.env(), 300)
        expect_equal(mv.rc, 0, f"--memory-viz\n{mv.describe()}")
        check = run_process([sys.executable, os.path.join(HERE, "memory_viz_check.py"), snap], self.env(), 300)
        expect_equal(check.rc, 0, f"memory_viz_check.py\n{check.describe()}")
        html = os.path.join(keep, "gpt2-report.html")
        page = run_process([sys.executable, report, "--quiet", "--html", html, log_path], self.env(), 300)
        expect_equal(page.rc, 0, f"--html\n{page.describe()}")
        text = run_process([sys.executable, report, log_path], self.env(), 300)
        with open(os.path.join(keep, "gpt2-report.txt"), "w") as f:
            f.write(text.out)
        with open(log_path) as src, open(os.path.join(keep, "gpt2.jsonl"), "w") as dst:
            dst.write(src.read())
        with open(os.path.join(keep, "memory_viz_check.txt"), "w") as f:
            f.write(check.out)
        with open(os.path.join(keep, "replay.txt"), "w") as f:
            f.write(rp.out + rp.err)
        self.results["measurements"]["events"] = {
            "rows": rows, "live_reserved_peak": live, "live_requested_peak": d["requested_bytes_peak"],
            "recorded": recorded, "replayed_reserved_peak": replayed, "ratio": ratio,
            "second": runs[1]["options"], "second_reserved_peak": runs[1]["reserved_bytes_peak"]}
        return (f"{rows} rows; live reserved peak {live / 2**20:.1f} MiB, replayed ({recorded}) "
                f"{replayed / 2**20:.1f} MiB ({ratio:.3f}x); {runs[1]['options']}: "
                f"{runs[1]['reserved_bytes_peak'] / 2**20:.1f} MiB; memory_viz snapshot checked")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--jax", action="store_true", help="also run JAX (about 45 s)")
    parser.add_argument("--only-ipc", action="store_true", help="only the legacy IPC cases (issue 14)")
    parser.add_argument("--only-observe", action="store_true", help="only the observe-mode cases (issue 15)")
    parser.add_argument("--only-events", action="store_true",
                        help="only the event log's replay and memory_viz export of a GPT-2 run (issue 17)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    suite = Suite(os.path.realpath(args.build), os.path.realpath(args.out))
    suite.jax = args.jax
    suite.skip_torch = args.skip_torch
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    suite.results["gpu"] = gpu
    print(f"GPU: {gpu}")
    suite.compile_all()
    only = args.only_ipc or args.only_observe or args.only_events
    if not only:
        suite.run_differential_cases()
    if not (args.only_observe or args.only_events):
        suite.run_ipc_cases()
    if not (args.only_ipc or args.only_events):
        suite.run_observe_cases()
    if not (args.only_ipc or args.only_observe or args.skip_torch):
        suite.case("issue 17: a GPT-2 run's event log replays to its reserved peak; memory_viz export",
                   suite.events_case)
    if not args.skip_bench and not only:
        suite.case("measure: churn, cudaMalloc/cudaFree with and without the shim", suite.bench_churn)
    if not args.skip_torch and not only:
        suite.case("measure: PyTorch uncached with and without the shim", suite.bench_torch)
    with open(os.path.join(args.out, "gpu-results.json"), "w") as f:
        json.dump(suite.results, f, indent=1)
    passed = sum(c["status"] == "passed" for c in suite.results["cases"])
    print(f"\n{passed} passed, {suite.failures} failed; results in {args.out}/gpu-results.json")
    return 1 if suite.failures else 0


if __name__ == "__main__":
    sys.exit(main())
