#!/usr/bin/env python3
"""End-to-end tests on a CPU machine (DESIGN §6.2): the test programs run under LD_PRELOAD
over the CUDA test double, with and without the shim; outputs, exit codes and the log are
checked. One case per ctest test:

    run_e2e.py --list
    run_e2e.py --build BUILD_DIR CASE
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from harness import (ROOT, SANITIZER_RUNTIME, Failure, check_proc_address, compare,  # noqa: E402
                     exit_device, exit_record, expect, expect_equal, expect_exit_snapshot, logs_in,
                     parse_fields, poolshim_log, records_of, run_process, clean_environment,
                     sanitizer_runtime, talk_to_process, with_shim)
import prom_lint  # noqa: E402
import rmm_csv  # noqa: E402

MiB = 1 << 20
CASES = {}
BUILD = None


def case(fn):
    CASES[fn.__name__[len("case_"):]] = fn
    return fn


def program(name):
    return os.path.join(BUILD, "programs", name)


def base_env(extra=None):
    env = clean_environment()
    double = os.path.join(BUILD, "double")
    env["LD_LIBRARY_PATH"] = double + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["CUDADOUBLE_MEM"] = "1G"
    env["CUDADOUBLE_DEVICES"] = "1"
    if sanitizer_runtime(BUILD):
        env[SANITIZER_RUNTIME] = sanitizer_runtime(BUILD)
    env.update(extra or {})
    return env


def run(args, shim, tmp, extra=None, timeout=60):
    env = base_env(extra)
    if shim:
        env = with_shim(env, os.path.join(BUILD, "libpoolshim.so"), os.path.join(tmp, "log-%p.jsonl"))
    return run_process(args, env, timeout)


def differential(args, tmp, extra=None):
    """Runs `args` without and with the shim: same exit code, same standard output."""
    native = run(args, False, tmp, extra)
    shim = run(args, True, tmp, extra)
    compare(args, native, shim)
    return native, shim


def logs(tmp):
    return logs_in(tmp)


def one_log(tmp):
    paths = logs(tmp)
    expect(len(paths) == 1, f"expected one log, found {paths}")
    return poolshim_log.read_log(paths[0])


def without_leak_check():
    """ASan's leak check off, for a run where LeakSanitizer cannot judge: a child forked from a
    threaded process (it cannot see what the parent's other threads, the shim's worker, hold on
    their stacks, and calls it leaked), or an exit while threads still run (its tracer fails)."""
    return {"ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0"}


# ---- cases -----------------------------------------------------------------------------

@case
def case_api_edges_match_native(tmp):
    # Paged large arenas (the default, explicit here so that a suite run with other options
    # keeps this case's figures): oom_then_recover's freed blocks merge in the arena's range and
    # serve the big request at once. Without them (page=0) the heap trims and retries once.
    segments = os.path.join(tmp, "segments")
    os.makedirs(segments)
    differential([program("api_edges")], segments, {"POOLSHIM_PAGE": "0"})
    _, d = exit_device(one_log(segments))
    expect_equal((d["oom_retries"], d["oom_retry_successes"]), (1, 1),
                 "page=0: oom_retries, oom_retry_successes (oom_then_recover trims and retries once)")
    native, shim = differential([program("api_edges")], tmp, {"POOLSHIM_PAGE": "20M"})
    # The double answers as the real runtime did on an H200 (CUDA 13.0, driver 580), recorded
    # in expected/api_edges.h200.txt by scripts/gpu-test: the CPU tests rest on real behaviour.
    with open(os.path.join(HERE, "expected", "api_edges.h200.txt")) as f:
        expect_equal(native.out, f.read(), "api_edges over the double vs. the H200 recording")
    # The cases must actually have run the paths they name.
    for line in ("oom_huge: cudaErrorMemoryAllocation last=cudaErrorMemoryAllocation cleared=cudaSuccess",
                 "oom_then_recover: held=12 big=cudaSuccess data_ok=1 last=cudaSuccess",
                 "double_free: first=cudaSuccess second=cudaErrorInvalidValue",
                 "final_last_error: cudaSuccess"):
        expect(line in shim.out, f"missing {line!r} in\n{shim.out}")
    records = one_log(tmp)
    ex, d = exit_device(records)
    expect(ex["pooled_allocs"] > 20, f"too few pooled allocations: {ex['pooled_allocs']}")
    expect_equal(d["oom_retries"], 0, "oom_retries (paged: no retry needed)")
    expect_equal(d["ooms"], 1, "ooms (only the 1 PiB request fails)")
    expect_equal(d["failed_allocs"], 1, "failed_allocs")
    expect_equal(d["reset_dropped"], 1, "reset_dropped (one buffer live at cudaDeviceReset)")
    expect_equal(ex["leaks"]["count"], 0, "leaks")
    ooms = records_of(records, "oom")
    expect_equal(len(ooms), 1, "oom records")
    expect_equal(ooms[0]["request_bytes"], 1 << 50, "oom request")
    expect_equal(ooms[0]["verdict"], "exhausted", "oom verdict")


def churn_case(tmp, binary, mode):
    args = [program(binary), "1000", "64", str(4 * MiB)] + ([mode] if mode == "async" else [])
    native, shim = differential(args, tmp)
    allocated = int(parse_fields(shim.out.splitlines()[0])["allocated_bytes"])
    ex, d = exit_device(one_log(tmp))
    expect_equal(ex["pooled_allocs"], 1064, "pooled allocations (64 live + 1000 iterations)")
    expect_equal(d["frees"], 1064, "frees")
    expect_equal(d["async_allocs"], 1064 if mode == "async" else 0, "async_allocs")
    expect_equal(d["async_frees"], 1064 if mode == "async" else 0, "async_frees")
    expect_equal(d["requested_bytes_total"], allocated, "requested_bytes_total")
    expect_equal(d["requested_bytes"], 0, "requested bytes at exit")
    expect_equal(d["live_allocs"], 0, "live allocations at exit")
    expect_equal(d["live_allocs_peak"], 64, "live allocations peak")
    expect_equal(d["passthrough_allocs"] + d["passthrough_frees"], 0, "pass-through calls")
    expect_equal(ex["leaks"]["count"], 0, "leaks")


@case
def case_two_devices_cross_device_free_matches_native(tmp):
    native, shim = differential([program("api_edges")], tmp, {"CUDADOUBLE_DEVICES": "2"})
    expect("cross_device_free: cudaSuccess last=cudaSuccess" in shim.out, shim.out)
    expect("devices: 2" in shim.out, shim.out)


@case
def case_capture_on_another_thread_matches_native(tmp):
    native, shim = differential([program("capture_threads")], tmp)
    # Over the double a global capture refuses another (global-mode) thread's cudaFree.
    expect("global_capture_global_thread: begin=cudaSuccess malloc=cudaErrorStreamCaptureUnsupported "
           "free=cudaErrorStreamCaptureUnsupported end=cudaErrorStreamCaptureInvalidated" in shim.out, shim.out)
    expect("global_capture_relaxed_thread: begin=cudaSuccess malloc=cudaSuccess free=cudaSuccess "
           "end=cudaSuccess" in shim.out, shim.out)
    ex, d = exit_device(one_log(tmp))
    expect_equal(d["live_allocs"], 0, "live allocations at exit")


def oom_case(tmp, mode, extra):
    env = {"POOLSHIM_BACKTRACE": "8"}
    env.update(extra)
    shim = run([program("oom_cases"), mode], True, tmp, env)
    expect_equal(shim.rc, 3, f"exit status\n{shim.describe()}")
    records = one_log(tmp)
    ooms = records_of(records, "oom")
    expect_equal(len(ooms), 1, "oom records")
    return shim, records, ooms[0]


def top_function(site):
    expect(site, "no call site recorded")
    return site[0]["function"]


@case
def case_oom_verdict_exhausted(tmp):
    shim, records, o = oom_case(tmp, "exhausted", {"CUDADOUBLE_MEM": "32M"})
    expect_equal(shim.out, "allocation of 4194304 bytes failed after 8: cudaErrorMemoryAllocation\n", "output")
    expect_equal(o["verdict"], "exhausted", "verdict")
    expect_equal((o["request_bytes"], o["device_free"], o["device_total"]), (4 * MiB, 0, 32 * MiB), "request, free, total")
    expect_equal((o["reserved_bytes"], o["used_bytes"], o["pool_unused_bytes"]), (32 * MiB, 32 * MiB, 0), "pool")
    expect_equal((o["live_allocs"], o["live_bytes"]), (8, 32 * MiB), "live")
    expect_equal(o["cap_bytes"], None, "cap")
    expect_equal(o["size_histogram"], {str(4 * MiB): 8}, "histogram")
    expect_equal(len(o["largest"]), 8, "largest")
    expect_equal([l["bytes"] for l in o["largest"]], [4 * MiB] * 8, "largest sizes")
    expect_equal(len(o["by_site"]), 1, "call-site groups")
    expect_equal((o["by_site"][0]["count"], o["by_site"][0]["bytes"]), (8, 32 * MiB), "the group")
    expect(top_function(o["by_site"][0]["site"]).startswith("(anonymous namespace)::allocate_layer"), o["by_site"][0])
    expect(top_function(o["site"]).startswith("(anonymous namespace)::allocate_layer"), o["site"])
    expect(o["site"][0]["module"].endswith("/programs/oom_cases"), o["site"][0])
    expect("  verdict      exhausted" in shim.err, shim.err)
    ex = records_of(records, "exit")[0]
    expect_equal((ex["leaks"]["count"], ex["leaks"]["bytes"]), (8, 32 * MiB), "leaks at exit")
    expect(top_function(ex["leaks"]["by_site"][0]["site"]).startswith("(anonymous namespace)::allocate_layer"),
           ex["leaks"]["by_site"])


@case
def case_oom_verdict_fragmentation(tmp):
    shim, records, o = oom_case(tmp, "fragmentation", {"CUDADOUBLE_MEM": "32M"})
    expect_equal(o["verdict"], "fragmentation", "verdict")
    expect_equal((o["request_bytes"], o["device_free"]), (2 * MiB, 0), "request, free")
    expect_equal((o["reserved_bytes"], o["used_bytes"], o["pool_unused_bytes"]), (32 * MiB, 16 * MiB, 16 * MiB), "pool")
    expect_equal(o["retried"], True, "retried")
    expect_equal(records_of(records, "exit")[0]["devices"][0]["oom_with_slack"], 1, "oom_with_slack")
    expect_equal(o["size_histogram"], {str(MiB): 16}, "histogram (1 MiB blocks)")
    expect("not in one piece of 2.0 MiB even after a trim" in o["hint"], o["hint"])


@case
def case_oom_verdict_cap(tmp):
    shim, records, o = oom_case(tmp, "cap", {"POOLSHIM_LIMIT": "16M"})
    expect("meminfo: free 4 MiB of 16 MiB" in shim.out, shim.out)  # the cap as total, headroom as free
    expect_equal(o["verdict"], "cap", "verdict")
    expect_equal((o["request_bytes"], o["cap_bytes"], o["used_bytes"]), (6 * MiB, 16 * MiB, 12 * MiB), "request, cap, used")
    expect_equal(o["device_total"], 1 << 30, "device total (the real device)")
    expect(o["hint"].startswith("the cap (POOLSHIM_LIMIT, 16.0 MiB) leaves 4.0 MiB for a request of 6.0 MiB"), o["hint"])
    sample = records_of(records, "exit")[0]["devices"][0]
    expect_equal(sample["cap_bytes"], 16 * MiB, "cap in the exit record")
    expect_equal(sample["reserved_bytes_peak"] <= 16 * MiB, True, "the pool never passed its cap")


@case
def case_observe_mode_keeps_native_behaviour_where_the_pool_changes_it(tmp):
    # The fragmentation program: natively (and in observe mode) the double serves its 2 MiB
    # request from the freed 1 MiB holes; the pool, holding its segments, runs out after 32.
    args = [program("oom_cases"), "fragmentation"]
    env = {"CUDADOUBLE_MEM": "32M", "POOLSHIM_BACKTRACE": "8"}
    native = run(args, False, tmp, env)
    expect_equal((native.rc, native.out), (0, "no out-of-memory\n"), "native run")
    pool_dir = os.path.join(tmp, "pool")  # its log apart from the observed run's
    os.makedirs(pool_dir)
    pooled = run(args, True, pool_dir, env)
    expect_equal(pooled.rc, 3, "pool mode changes this program's fate (the premise)")
    observed = run(args, True, tmp, dict(env, POOLSHIM_MODE="observe"))
    compare(args, native, observed)
    ex, d = exit_device(one_log(tmp))
    expect_equal(ex["pooled_allocs"], 0, "nothing pooled")
    expect_equal((d["allocs"], d["frees"], d["ooms"]), (33, 16, 0), "tracked allocations, frees, OOMs")
    expect_equal((d["native_bytes_peak"], d["requested_bytes_peak"]), (32 * MiB, 32 * MiB), "tracked peaks")
    expect_equal((d["reserved_bytes"], d["cached_bytes"]), (0, 0), "no pool")
    # The device's figures at exit, read before the runtime's teardown destroys the primary
    # context (the double's runtime releases it at exit as the real one does): nothing but the
    # tracked allocations uses the double's memory.
    expect_equal((d["device_total"], d["device_free"], d["other_bytes"]), (32 * MiB, 32 * MiB - d["native_bytes"], 0),
                 "device total, free and other bytes at exit")
    expect(any("observe mode" in n for n in ex["notes"]), ex["notes"])


@case
def case_observe_mode_makes_no_cuda_call_of_its_own(tmp):
    # The double counts every driver call the process makes: natively and in observe mode the
    # counts are the same line for line (no event for a non-blocking stream, no fence, no
    # synchronization of the shim's); pool mode's differ, which shows the counts can tell.
    args = [program("observe_calls")]
    native = run(args, False, tmp)
    counts = dict(line.split() for line in native.out.splitlines())
    expect_equal((native.rc, counts["cuEventCreate"], counts["cuEventRecord"]), (0, "0", "0"), "native run")
    observed = run(args, True, tmp, {"POOLSHIM_MODE": "observe"})
    compare(args, native, observed)
    pool_dir = os.path.join(tmp, "pool")
    os.makedirs(pool_dir)
    pooled = run(args, True, pool_dir)
    pooled_counts = dict(line.split() for line in pooled.out.splitlines())
    expect(pooled_counts["cuEventCreate"] != "0", f"pool mode makes events of its own (the premise): {pooled_counts}")
    expect_equal(pooled_counts["cuMemAllocAsync"], "0", "pool mode: the pool served the stream allocations")
    ex, d = exit_device(one_log(tmp))
    expect_equal((ex["pooled_allocs"], d["allocs"], d["frees"]), (0, 16, 16), "observe mode: tracked, nothing pooled")


@case
def case_observe_mode_oom_is_native_and_names_its_call_site(tmp):
    args = [program("oom_cases"), "exhausted"]
    env = {"CUDADOUBLE_MEM": "32M", "POOLSHIM_BACKTRACE": "8"}
    native = run(args, False, tmp, env)
    observed = run(args, True, tmp, dict(env, POOLSHIM_MODE="observe"))
    compare(args, native, observed)
    expect_equal(observed.rc, 3, "exit status")
    expect_equal(observed.out, "allocation of 4194304 bytes failed after 8: cudaErrorMemoryAllocation\n", "output")
    records = one_log(tmp)
    o = records_of(records, "oom")[0]
    expect_equal((o["mode"], o["verdict"]), ("observe", "exhausted"), "mode, verdict")
    expect_equal((o["request_bytes"], o["device_free"], o["device_total"]), (4 * MiB, 0, 32 * MiB), "request, free, total")
    expect_equal((o["live_allocs"], o["live_bytes"], o["reserved_bytes"]), (8, 32 * MiB, 32 * MiB), "tracked")
    expect(top_function(o["site"]).startswith("(anonymous namespace)::allocate_layer"), o["site"])
    expect_equal((o["by_site"][0]["count"], o["by_site"][0]["bytes"]), (8, 32 * MiB), "the call-site group")
    expect("8 tracked allocations" in o["hint"], o["hint"])
    for piece in ("  mode         observe: the real function served every allocation", "  verdict      exhausted"):
        expect(piece in observed.err, f"missing {piece!r} in\n{observed.err}")
    ex = records_of(records, "exit")[0]
    expect_equal((ex["leaks"]["count"], ex["leaks"]["bytes"]), (8, 32 * MiB), "leaks at exit")


@case
def case_observe_mode_cap_refuses_natively(tmp):
    # A cap reproduces a small device's OOM natively on a large one: 64 MiB device, 16 MiB cap.
    args = [program("oom_cases"), "cap"]
    env = {"CUDADOUBLE_MEM": "64M", "POOLSHIM_BACKTRACE": "8", "POOLSHIM_LIMIT": "16M", "POOLSHIM_MODE": "observe"}
    observed = run(args, True, tmp, env)
    expect_equal(observed.rc, 3, f"exit status\n{observed.describe()}")
    expect_equal(observed.out, "meminfo: free 4 MiB of 16 MiB\nallocation of 6291456 bytes failed after 3: "
                               "cudaErrorMemoryAllocation\n", "the cap as the device, the native error")
    o = records_of(one_log(tmp), "oom")[0]
    expect_equal((o["mode"], o["verdict"], o["cap_bytes"], o["used_bytes"]), ("observe", "cap", 16 * MiB, 12 * MiB),
                 "mode, verdict, cap, tracked")
    expect(top_function(o["site"]).startswith("(anonymous namespace)::allocate_layer"), o["site"])


@case
def case_vmm_memory_of_the_application_is_in_the_log(tmp):
    # Three 8 MiB cuMemCreate handles mapped, one released while mapped (freed at its unmap),
    # one kept at exit: the log has the physical bytes, their peak and their call site.
    args = [program("vmm_alloc"), "keep"]
    native, shim = differential(args, tmp, {"POOLSHIM_BACKTRACE": "8"})
    expect_equal(shim.out.splitlines()[-1], "unmap 0, in use 8 MiB, one handle kept", "the program's own view")
    ex, d = exit_device(one_log(tmp))
    expect_equal((d["vmm_physical_bytes"], d["vmm_physical_bytes_peak"], d["vmm_physical_bytes_total"]),
                 (8 * MiB, 24 * MiB, 24 * MiB), "physical bytes: at exit, peak, total")
    expect_equal((d["vmm_mapped_bytes"], d["vmm_mapped_bytes_peak"]), (8 * MiB, 24 * MiB), "mapped bytes")
    expect_equal(d["vmm_released_mapped_bytes_total"], 8 * MiB, "released while mapped")
    expect_equal((d["vmm_creates"], d["vmm_releases"], d["vmm_maps"], d["vmm_unmaps"]), (3, 2, 3, 2), "calls")
    expect_equal((d["native_bytes"], d["reserved_bytes"], d["pooled_allocs"] if "pooled_allocs" in d else 0),
                 (0, 0, 0), "nothing pooled or passed through")
    expect_equal(d["other_bytes"], 0, "the double's used memory is all VMM")
    sites = ex["devices"][0]["vmm_by_site"]
    expect_equal([s["bytes"] for s in sites], [8 * MiB], "live VMM bytes by call site")
    expect(top_function(sites[0]["site"]).startswith("(anonymous namespace)::make_physical"), sites[0])


@case
def case_report_names_file_and_line_of_call_sites(tmp):
    shim, records, o = oom_case(tmp, "fragmentation", {"CUDADOUBLE_MEM": "32M"})
    report = subprocess.run([os.path.join(ROOT, "scripts", "poolshim-report"), logs(tmp)[0]], capture_output=True,
                            text=True, timeout=60)
    expect_equal(report.returncode, 0, f"report exit status\n{report.stderr}")
    expect("(oom_cases) at oom_cases.cpp:" in report.stdout,
           f"no file:line in\n{report.stdout}")


@case
def case_oom_repeats_are_reported_once(tmp):
    # A retry loop: the same failing allocation again and again gives one record.
    env = {"POOLSHIM_LIMIT": "8M", "POOLSHIM_BACKTRACE": "4"}
    shim = run([program("oom_cases"), "retry"], True, tmp, env)
    expect_equal(shim.rc, 3, "exit status")
    expect_equal(shim.out.count("failed"), 5, "failed attempts")
    expect_equal(shim.err.count("poolshim: out of memory"), 1, "blocks on stderr")
    records = one_log(tmp)
    expect_equal(len(records_of(records, "oom")), 1, "oom records")
    ex = records_of(records, "exit")[0]
    expect_equal(ex["oom_repeats"], 4, "repeats not written again")
    expect_equal(ex["devices"][0]["ooms"], 5, "ooms counted")


@case
def case_prometheus_file(tmp):
    """The .prom file while the process runs: series labelled host, rank and device, the pid
    only in poolshim_info; and no file left once the process has exited (issue 17)."""
    env = with_shim(base_env({"POOLSHIM_PROM_FILE": os.path.join(tmp, "poolshim-%p.prom"),
                              "POOLSHIM_SAMPLE_MS": "5"}),
                    os.path.join(BUILD, "libpoolshim.so"), os.path.join(tmp, "log-%p.jsonl"))
    host = socket.gethostname()
    seen = {}

    def look(proc):
        expect_equal(proc.stdout.readline(), "holding\n", "the program's first line")
        path = seen["path"] = os.path.join(tmp, f"poolshim-{proc.pid}.prom")
        live = f'poolshim_live_allocations{{host="{host}",rank="0",device="0"}} 1\n'
        deadline = time.time() + 20
        text = ""
        while live not in text and time.time() < deadline:  # a sample after the allocation
            time.sleep(0.005)
            if os.path.exists(path):
                with open(path) as f:
                    text = f.read()
        seen["text"], seen["pid"] = text, proc.pid
        proc.stdin.write("go\n")
        proc.stdin.flush()

    shim = talk_to_process(host_edges("hold"), env, look)
    expect_equal((shim.rc, shim.out), (0, "freed\n"), f"exit status and output\n{shim.err}")
    text, labels = seen["text"], f'host="{host}",rank="0",device="0"'
    for line in ("# TYPE poolshim_reserved_bytes gauge", "# TYPE poolshim_allocations_total counter",
                 f'poolshim_info{{host="{host}",rank="0",pid="{seen["pid"]}",version="{poolshim_log.version()}",'
                 'mode="pool"} 1',
                 f"poolshim_allocations_total{{{labels}}} 1", f"poolshim_live_allocations{{{labels}}} 1",
                 f"poolshim_requested_bytes{{{labels}}} 1048576", f"poolshim_cache_misses_total{{{labels}}} 1",
                 f'poolshim_ooms_total{{{labels},verdict="exhausted"}} 0'):
        expect(line + "\n" in text, f"missing {line!r} in\n{text}")
    expect_equal(text.count("pid="), 1, "pid labels (poolshim_info only)")
    # What `promtool check metrics` checks: the format and promlint's rules (tests/e2e/prom_lint.py);
    # promtool itself too when it is on PATH.
    expect_equal(prom_lint.check(text), [], f"problems in\n{text}")
    families = prom_lint.parse(text)
    expect_equal(len(families), 16, f"families: {sorted(families)}")
    expect_equal(sum(len(f["samples"]) for f in families.values()), 18, "samples")
    by_promtool = prom_lint.check_with_promtool(text)
    if by_promtool is not None:
        expect_equal(by_promtool, (0, ""), "promtool check metrics")
    expect(not os.path.exists(seen["path"]), f"the .prom file is left after exit: {os.listdir(tmp)}")
    expect(not [f for f in os.listdir(tmp) if ".tmp." in f], "a temporary file was left behind")
    expect_equal(len(records_of(one_log(tmp), "exit")), 1, "exit records")


@case
def case_prometheus_checker_refuses_what_promtool_refuses(tmp):
    """The self-check of prom_lint: each broken text fails with promtool's complaint."""
    good = ('# HELP poolshim_x_bytes Bytes.\n# TYPE poolshim_x_bytes gauge\npoolshim_x_bytes{device="0"} 1\n'
            '# HELP poolshim_y_total Calls.\n# TYPE poolshim_y_total counter\npoolshim_y_total 2\n')
    expect_equal(prom_lint.check(good), [], "a good text")
    broken = {
        "no help": (good.replace("# HELP poolshim_x_bytes Bytes.\n", ""), "poolshim_x_bytes no help text"),
        "counter suffix": (good.replace("poolshim_y_total", "poolshim_y"),
                           'poolshim_y counter metrics should have "_total" suffix'),
        "duplicate": (good + 'poolshim_y_total 3\n', "second sample of poolshim_y_total"),
        "apart": (good + 'poolshim_x_bytes{device="1"} 1\n', "samples of poolshim_x_bytes are not together"),
        "type late": (good + "# TYPE poolshim_y_total counter\n", "TYPE for poolshim_y_total after its samples"),
        "escape": (good.replace('device="0"', 'device="a\\q"'), "bad escape \\q in label device"),
        "value": (good.replace("} 1", "} one"), "bad value 'one'"),
        "unit": (good.replace("poolshim_x_bytes", "poolshim_x_milliseconds"),
                 'poolshim_x_milliseconds use base unit "seconds" instead of "milliseconds"'),
        "camel": (good.replace("poolshim_x_bytes", "poolshim_xBytes"),
                  "poolshim_xBytes metric names should be written in 'snake_case' not 'camelCase'"),
        "newline": (good[:-1], "the text does not end with a newline"),
    }
    for what, (text, complaint) in broken.items():
        problems = prom_lint.check(text)
        expect(any(complaint in p for p in problems), f"{what}: {complaint!r} not in {problems}")


@case
def case_start_record_has_the_start_in_nanoseconds(tmp):
    """start_unix_ns (issue 17): the wall clock at load in nanoseconds, whose whole seconds are
    start_unix_s."""
    before = time.time_ns()
    shim = run([program("churn"), "10", "4", str(MiB)], True, tmp)
    after = time.time_ns()
    expect_equal(shim.rc, 0, f"exit status\n{shim.err}")
    start = records_of(one_log(tmp), "start")[0]
    ns = start["start_unix_ns"]
    expect(type(ns) is int and before <= ns <= after, f"start_unix_ns {ns!r} not in [{before}, {after}]")
    expect_equal(start["start_unix_s"], ns // 10 ** 9, "start_unix_s (start_unix_ns // 10^9)")


@case
def case_churn_sync_counted_once(tmp):
    churn_case(tmp, "churn", "sync")


def call_timer_lines(text):
    """fn -> fields of the call timer's lines (tests/perf/call_timer.cpp)."""
    return {f["fn"]: f for f in (parse_fields(line) for line in text.splitlines()
                                 if line.startswith("call_timer: "))}


@case
def case_call_timer_counts_each_call_with_and_without_the_shim(tmp):
    # scripts/bench's profile rests on these counts: every call is timed once, and the calls
    # still reach what answers them (the shim pools all of them).
    timer = program("libcall_timer.so")
    for mode, calls in (("sync", {"cudaMalloc": 316, "cudaFree": 316}),
                        ("async", {"cudaMallocAsync": 316, "cudaFreeAsync": 316, "cudaStreamSynchronize": 3})):
        args = [program("churn"), "300", "16", str(4 * MiB)] + ([mode] if mode == "async" else [])
        native = run(args, False, tmp, {"LD_PRELOAD": timer})
        shim = run_process(args, with_shim(base_env(), timer + ":" + os.path.join(BUILD, "libpoolshim.so"),
                                           os.path.join(tmp, f"{mode}-%p.jsonl")))
        compare(args, native, shim)
        for result in (native, shim):
            lines = call_timer_lines(result.err)
            expect_equal(sorted(lines), sorted(calls), f"functions timed ({mode})")
            for fn, n in calls.items():
                expect_equal(int(lines[fn]["calls"]), n, f"{fn} calls ({mode})")
                expect(float(lines[fn]["p50_us"]) <= float(lines[fn]["p99_us"]) <= float(lines[fn]["max_us"]),
                       f"{fn} percentiles out of order: {lines[fn]}")
        ex, _ = exit_device(poolshim_log.read_log(logs_in(tmp, f"{mode}-")[0]))
        expect_equal(ex["pooled_allocs"], 316, f"pooled allocations behind the timer ({mode})")


@case
def case_call_timer_reset_forgets_the_warmup(tmp):
    script = ("import ctypes, os\n"
              "rt = ctypes.CDLL('libcudart.so.13', mode=os.RTLD_GLOBAL)\n"
              "glob = ctypes.CDLL(None)\n"
              "p = ctypes.c_void_p()\n"
              "for _ in range(3): glob.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4096)); glob.cudaFree(p)\n"
              "glob.call_timer_reset()\n"
              "glob.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4096)); glob.cudaFree(p)\n")
    timer = program("libcall_timer.so")
    out = os.path.join(tmp, "timer.txt")
    result = run([sys.executable, "-c", script], False, tmp, {"LD_PRELOAD": timer, "CALL_TIMER_OUT": out})
    expect_equal(result.rc, 0, "exit status: " + result.describe())
    with open(out) as f:
        lines = call_timer_lines(f.read())
    expect_equal({fn: int(f["calls"]) for fn, f in lines.items()}, {"cudaMalloc": 1, "cudaFree": 1},
                 "calls counted after call_timer_reset")


@case
def case_churn_async_counted_once(tmp):
    churn_case(tmp, "churn", "async")


@case
def case_churn_per_thread_stream_build(tmp):
    churn_case(tmp, "churn_ptds", "async")


@case
def case_per_thread_stream_is_seen_at_a_call_not_at_a_lookup(tmp):
    # DESIGN §7, the legacy rule: CUDA 13's runtime looks up per-thread variants in every
    # program, so only a call on the per-thread default stream ends the barrier-free case.
    # mode -> (legacy_only, per-thread variants handed out as watching thunks, dlsym answers)
    # A legacy variant counts when its stream argument is CU_STREAM_PER_THREAD (explicit*,
    # launch_explicit: cuLaunchKernel's stream is on the stack), not on the legacy stream; so
    # does a capture of the per-thread stream.
    wanted = {"none": (True, 0, 0), "lookup": (True, 1, 0), "proc": (False, 1, 0),
              "dlsym": (False, 0, 1), "direct": (False, 0, 0), "legacy": (True, 0, 0),
              "explicit": (False, 0, 0), "explicit_proc": (False, 1, 0),
              "launch_legacy": (True, 0, 0), "launch_explicit": (False, 0, 0),
              "capture": (False, 0, 0)}
    for mode, (legacy_only, watches, dlsym) in wanted.items():
        for p in logs(tmp):
            os.remove(p)
        native, shim = differential([program("per_thread_calls"), mode], tmp, {"POOLSHIM_FREE": "ordered"})
        # The double runs no kernel (801), and cannot capture the per-thread stream (900): the
        # shim counts the capture's begin as a use all the same, before the real call.
        reached = {"launch_legacy": 801, "launch_explicit": 801, "capture": 900}.get(mode, 0)
        expect_equal(shim.out, f"per_thread_calls {mode}: 0 0 0 0 0 0 {reached} 0 0\n", f"{mode}: output")
        ex, d = exit_device(one_log(tmp))
        expect_equal(ex["legacy_only"], legacy_only, f"{mode}: legacy_only")
        expect_equal(ex["paths"]["per_thread_watches"], watches, f"{mode}: watching thunks handed out")
        expect_equal(ex["paths"]["dlsym"], dlsym, f"{mode}: dlsym answers")
        expect_equal(ex["pooled_allocs"], 2, f"{mode}: pooled allocations")


@case
def case_runtime_lookups_leave_the_legacy_stream_alone(tmp):
    # The runtime double, like CUDA 13's, looks up 20 per-thread variants at start: 5 are hooks,
    # 15 become watching thunks, and so do the 10 legacy variants of stream functions. A program built for the legacy stream never calls them, so the
    # legacy rule's first case holds (no barrier); built for per-thread default streams, its
    # cudaMemcpy/cudaMemset reach them, and each step's first handout of a block freed before
    # the last barrier records one (19 in 20 steps; the first step has nothing freed).
    for name, legacy_only, barriers in (("demo", True, 0), ("demo_static", True, 0), ("demo_ptds", False, 19)):
        for p in logs(tmp):
            os.remove(p)
        differential([program(name), "20", "65536"], tmp, {"POOLSHIM_FREE": "ordered"})
        ex, d = exit_device(one_log(tmp))
        expect_equal(ex["legacy_only"], legacy_only, f"{name}: legacy_only")
        expect_equal(ex["paths"]["per_thread_watches"], 25, f"{name}: watching thunks handed out")
        expect_equal(d["legacy_reuses"], barriers, f"{name}: legacy barriers")
        expect_equal(d["ordered_frees"], 20 * 7, f"{name}: ordered frees")


IPC_IMPORTER_LINES = """{who}: buffer 0 of 3145728 bytes: open cudaSuccess, exporter's bytes 1, rewritten 1
{who}: buffer 1 of 22020096 bytes: open cudaSuccess, exporter's bytes 1, rewritten 1
{who}: buffer 2 of 45088768 bytes: open cudaSuccess, exporter's bytes 1, rewritten 1
{who}: opened again: cudaSuccess, same pointer 1
{who}: close cudaSuccess
{who}: close 0 cudaSuccess
{who}: close 1 cudaSuccess
{who}: close 2 cudaSuccess
{who}: reopened after its close: cudaSuccess, its own bytes 1
{who}: close cudaSuccess
{who}: bytes that are no handle: cudaErrorInvalidResourceHandle
"""
IPC_EXPORTER_LINES = """{who}: exported 3 buffers; a second handle of one is the same bytes: 1
{who}: opening its own export: cudaErrorDeviceUninitialized
"""
IPC_REWRITTEN_LINES = "".join(f"{{who}}: buffer {i} holds the importer's bytes: 1\n" for i in range(3))
IPC_EXPORT_WARNING = "pooled memory was exported through legacy IPC"


@case
def case_legacy_ipc_between_processes_matches_native(tmp):
    # Issue 14 over the double: a parent exports to the child it starts and a child to its
    # parent, three buffers (3, 21 and 43 MiB: each a block of the paged arena), one opened
    # twice, closed and reopened, bytes that are no handle, the exporter opening its own export,
    # and (child_to_parent) a handle of a child that has exited. Native and under the shim, the
    # same output: under the shim the handles are poolshim's and travel through its socket.
    wanted = {
        "parent_to_child": (IPC_EXPORTER_LINES.format(who="parent") + IPC_IMPORTER_LINES.format(who="child")
                            + "parent: child exited 0\n" + IPC_REWRITTEN_LINES.format(who="parent")),
        "child_to_parent": (IPC_IMPORTER_LINES.format(who="parent") + IPC_EXPORTER_LINES.format(who="child")
                            + IPC_REWRITTEN_LINES.format(who="child") + "parent: child exited 0\n"
                            + "parent: a handle of the exited child: cudaErrorInvalidResourceHandle\n"),
    }
    for mode, out in wanted.items():
        for p in logs(tmp):
            os.remove(p)
        native, shim = differential([program("ipc_share"), mode], tmp, without_leak_check())
        expect_equal(native.rc, 0, f"{mode}: exit status\n{native.describe()}")
        expect_equal(native.out, out, f"{mode}: output")
        expect_equal(shim.err.count(IPC_EXPORT_WARNING), 1, f"{mode}: the exporter's one warning\n{shim.err}")
        # The socket never outlives its process.
        for p in logs(tmp):
            pid = int(os.path.basename(p)[len("log-"):-len(".jsonl")])
            expect(not os.path.exists(f"/tmp/poolshim-{os.getuid()}/ipc-{pid}"), f"{mode}: socket of {pid} left")


@case
def case_legacy_ipc_importer_without_the_shim_gets_the_native_error(tmp):
    # The child runs without libpoolshim: poolshim's handles are no driver handles to it, so
    # each open fails as bytes that are no handle do natively, and the exporter's log has said
    # where its handles open.
    shim = run([program("ipc_share"), "parent_to_child"], True, tmp, dict(without_leak_check(), IPC_SHARE_CHILD_WITHOUT_SHIM="1"))
    expect_equal(shim.rc, 3, f"exit status\n{shim.describe()}")
    for i, size in enumerate((3145728, 22020096, 45088768)):
        line = f"child: buffer {i} of {size} bytes: open cudaErrorInvalidResourceHandle, exporter's bytes 0, rewritten 0\n"
        expect(line in shim.out, f"missing {line!r}\n{shim.out}")
    expect("child: bytes that are no handle: cudaErrorInvalidResourceHandle\n" in shim.out, shim.out)
    expect_equal(shim.err.count(IPC_EXPORT_WARNING), 1, f"the exporter's warning\n{shim.err}")
    expect("opens only in a process that also runs under poolshim" in shim.err, shim.err)


@case
def case_legacy_ipc_of_a_small_block_fails_with_a_warning(tmp):
    # A block of 1 MiB or less lives in a shared small-block segment that cannot be exported
    # alone: the driver's own error comes back (the pool's memory is no cuMemAlloc memory), and
    # the log's warning says which blocks can be.
    native = run([program("ipc_share"), "export_small"], False, tmp)
    shim = run([program("ipc_share"), "export_small"], True, tmp)
    expect_equal((native.rc, native.out), (0, "export of 4096 bytes: cudaSuccess\n"), "native")
    expect_equal((shim.rc, shim.out), (1, "export of 4096 bytes: cudaErrorInvalidValue\n"), "under the shim")
    expect("only blocks over 1 MiB of a paged arena" in shim.err, f"the warning\n{shim.err}")


@case
def case_demo_log_and_leak(tmp):
    native, shim = differential([program("demo"), "20", str(1 << 18)], tmp, {"POOLSHIM_SAMPLE_MS": "1"})
    records = one_log(tmp)
    expect_equal(records[0]["type"], "start", "first record")
    expect(len(records_of(records, "sample")) >= 1, "no sample record")
    ex, d = exit_device(records)
    expect_equal(ex["pooled_allocs"], 1 + 20 * 7, "pooled allocations")
    expect_equal(d["frees"], 20 * 7, "frees")
    expect_equal(ex["leaks"]["count"], 1, "leaked allocations")
    expect_equal(ex["leaks"]["bytes"], 3 * MiB, "leaked bytes")
    expect_equal(ex["leaks"]["largest"][0]["bytes"], 3 * MiB, "largest leak")


@case
def case_oom_exit_status_and_record(tmp):
    native, shim = differential([program("oom_exit")], tmp)
    expect_equal(shim.rc, 3, "exit status")
    expect_equal(shim.out, "allocation failed: cudaErrorMemoryAllocation\n", "output")
    for piece in ("poolshim: out of memory on device 0 (poolshim CPU test double, device 0)",
                  "  request      2.0 GiB by cudaMalloc", "  verdict      exhausted"):
        expect(piece in shim.err, f"missing {piece!r} in\n{shim.err}")
    ooms = records_of(one_log(tmp), "oom")
    expect_equal(len(ooms), 1, "oom records")
    o = ooms[0]
    expect_equal(o["request_bytes"], 2 << 30, "request")
    expect_equal(o["device_total"], 1 << 30, "device total")
    expect_equal(o["verdict"], "exhausted", "verdict")
    expect_equal(o["live_allocs"], 1, "live allocations at the OOM")
    expect_equal(o["live_bytes"], MiB, "live bytes at the OOM")


@case
def case_threads_concurrent(tmp):
    differential([program("threads")], tmp)
    ex, d = exit_device(one_log(tmp))
    expect_equal(ex["pooled_allocs"], 2400, "pooled allocations")
    expect_equal(d["async_allocs"], 1200, "async allocations")
    expect_equal(d["frees"], 2400, "frees")
    expect_equal(d["live_allocs"], 0, "live at exit")


@case
def case_no_log_without_device_memory(tmp):
    differential([program("no_alloc")], tmp)
    differential(["true"], tmp)
    expect_equal(logs(tmp), [], "log files")


@case
def case_enable_0_passes_through(tmp):
    native, shim = differential([program("churn"), "200", "16", str(MiB)], tmp, {"POOLSHIM_ENABLE": "0"})
    expect_equal(logs(tmp), [], "log files")
    expect("poolshim" not in shim.err, f"the shim spoke although disabled:\n{shim.err}")


@case
def case_unopenable_log_warns_and_runs(tmp):
    path = "/nonexistent-poolshim-dir/x.jsonl"
    native, shim = differential([program("churn"), "100", "8", str(MiB)], tmp, {"POOLSHIM_LOG": path})
    expect(f"poolshim: warning: cannot open log {path}: No such file or directory; running without a log" in shim.err,
           shim.err)


@case
def case_symlink_log_refused(tmp):
    target = os.path.join(tmp, "target")
    link = os.path.join(tmp, "link.jsonl")
    os.symlink(target, link)
    native, shim = differential([program("churn"), "100", "8", str(MiB)], tmp, {"POOLSHIM_LOG": link})
    expect("it is a symbolic link; running without a log" in shim.err, shim.err)
    expect(not os.path.exists(target), "the link's target was written")


@case
def case_strict_refuses_bad_option(tmp):
    shim = run([program("churn"), "10", "4", str(MiB)], True, tmp, {"POOLSHIM_STRICT": "1", "POOLSHIM_SAMPLE_MS": "soon"})
    expect_equal(shim.rc, 2, "exit status")
    expect_equal(shim.out, "", "output (the program must not run)")
    expect('poolshim: error: POOLSHIM_SAMPLE_MS="soon" is not a duration in milliseconds' in shim.err, shim.err)
    expect("refusing to start" in shim.err, shim.err)


@case
def case_bad_option_warns_and_uses_default(tmp):
    native, shim = differential([program("churn"), "10", "4", str(MiB)], tmp, {"POOLSHIM_RELEASE_THRESHOLD": "lots"})
    message = 'POOLSHIM_RELEASE_THRESHOLD="lots" is not a size (bytes with K/M/G/T, e.g. 512M, or a % of device memory); using 0 (the default)'
    expect_equal(shim.err.count(message), 1, f"warnings on stderr in\n{shim.err}")
    records = one_log(tmp)
    expect([r for r in records_of(records, "warning") if r["message"] == message], "no warning record")
    expect_equal(records[0]["config"]["release_threshold"], "0", "release_threshold in the start record")


@case
def case_verbose_prints_configuration(tmp):
    shim = run([program("churn"), "10", "4", str(MiB)], True, tmp, {"POOLSHIM_VERBOSE": "1", "POOLSHIM_CONF": "sample_ms=50"})
    expect_equal(shim.rc, 0, "exit status")
    for line in ("poolshim: option verbose = 1 (environment)", "poolshim: option sample_ms = 50 (POOLSHIM_CONF)",
                 "poolshim: option free = auto (default)",
                 "poolshim: ways in: runtime_hooks 28 calls, driver_hooks 0 calls, dlsym "):
        expect(line in shim.err, f"missing {line!r} in\n{shim.err}")
    start = records_of(one_log(tmp), "start")[0]
    expect_equal(start["config"]["sample_ms"], "50", "sample_ms")
    expect_equal(start["config_sources"]["sample_ms"], "POOLSHIM_CONF", "sample_ms source")


@case
def case_verbose_prints_the_log_path_once_at_exit(tmp):
    """Plain LD_PRELOAD with POOLSHIM_VERBOSE=1: one line `poolshim: log PATH` at exit, after the
    exit-time `ways in` line; none without it."""
    shim = run([program("churn"), "10", "4", str(MiB)], True, tmp, {"POOLSHIM_VERBOSE": "1"})
    expect_equal(shim.rc, 0, f"exit status\n{shim.err}")
    path = logs(tmp)[0]
    lines = shim.err.splitlines()
    expect_equal([line for line in lines if line.startswith("poolshim: log ")], [f"poolshim: log {path}"],
                 "the exit line naming the log")
    ways_in = next(i for i, line in enumerate(lines) if line.startswith("poolshim: ways in:"))
    expect_equal(lines.index(f"poolshim: log {path}") > ways_in, True, f"the log line comes at exit in\n{shim.err}")
    quiet = os.path.join(tmp, "quiet")
    os.makedirs(quiet)
    plain = run([program("churn"), "10", "4", str(MiB)], True, quiet)
    expect_equal([line for line in plain.err.splitlines() if line.startswith("poolshim: log ")], [],
                 "no log line without POOLSHIM_VERBOSE")


@case
def case_summary_at_exit_for_plain_ld_preload(tmp):
    """POOLSHIM_SUMMARY=1: the library's own summary on stderr at exit, its figures exactly the
    exit record's; nothing of it without the option."""
    shim = run([program("demo"), "10", str(1 << 16)], True, tmp, {"POOLSHIM_SUMMARY": "1", "POOLSHIM_CONF": "page:20M"})
    expect_equal(shim.rc, 0, f"exit status\n{shim.err}")
    path = logs(tmp)[0]
    records = poolshim_log.read_log(path)
    ex, d = exit_device(records)
    fmt = poolshim_log.fmt_bytes
    expected = [
        f"poolshim: summary of pid {ex['pid']}, log {path}",
        "poolshim:   device 0: 71 allocations pooled (0 async), 70 freed; 0 allocations and 0 frees passed through",
        f"poolshim:     peak reserved {fmt(d['reserved_bytes_peak'])}, peak used {fmt(d['used_bytes_peak'])}, "
        f"peak requested {fmt(d['requested_bytes_peak'])}",
        "poolshim:     out of memory: 0 (0 with enough unused pool memory), 0 retried after a trim (0 succeeded)",
        "poolshim:   leaks at exit: 1 allocation, 3.0 MiB",
    ]
    lines = shim.err.splitlines()
    expect_equal(lines[-len(expected):], expected, "the summary, last on stderr")
    expect_equal(sum(line.startswith("poolshim: summary of pid") for line in lines), 1, "one summary")
    quiet = os.path.join(tmp, "quiet")
    os.makedirs(quiet)
    plain = run([program("demo"), "10", str(1 << 16)], True, quiet, {"POOLSHIM_CONF": "page:20M"})
    expect("summary of pid" not in plain.err, plain.err)


@case
def case_conf_takes_key_colon_value(tmp):
    """POOLSHIM_CONF items as key:value and key=value, mixed: the start record's config and its
    sources say they took, and no warning is printed."""
    shim = run([program("churn"), "10", "4", str(MiB)], True, tmp,
               {"POOLSHIM_CONF": "cache:32M, free : sync,sample_ms=50,limit:50%"})
    expect_equal(shim.rc, 0, f"exit status\n{shim.err}")
    expect("poolshim: warning" not in shim.err, shim.err)
    start = records_of(one_log(tmp), "start")[0]
    for key, value in (("cache", "32M"), ("free", "sync"), ("sample_ms", "50"), ("limit", "50%")):
        expect_equal((start["config"][key], start["config_sources"][key]), (value, "POOLSHIM_CONF"), key)
    bad = os.path.join(tmp, "bad")
    os.makedirs(bad)
    warned = run([program("churn"), "10", "4", str(MiB)], True, bad, {"POOLSHIM_CONF": "cache"})
    expect('poolshim: warning: POOLSHIM_CONF: "cache" is not key=value or key:value; ignored' in warned.err,
           warned.err)


@case
def case_verbose_shows_resolved_bytes_of_sizes(tmp):
    """POOLSHIM_VERBOSE=1: a size given as text shows the bytes it resolves to (a percentage of
    the double's 1 GiB device)."""
    shim = run([program("churn"), "10", "4", str(MiB)], True, tmp,
               {"POOLSHIM_VERBOSE": "1", "POOLSHIM_LIMIT": "5%", "POOLSHIM_CONF": "cache:512K"})
    expect_equal(shim.rc, 0, f"exit status\n{shim.err}")
    lines = shim.err.splitlines()
    for line in ("poolshim: option limit = 5% = 51.2 MiB (environment)",
                 "poolshim: option cache = 512K = 512.0 KiB (POOLSHIM_CONF)",
                 "poolshim: option release_threshold = 0 (default)"):
        expect(line in lines, f"missing {line!r} in\n{shim.err}")


@case
def case_log_path_expansion(tmp):
    template = os.path.join(tmp, "x-%h-%r-%%.jsonl")
    run([program("churn"), "10", "4", str(MiB)], True, tmp, {"POOLSHIM_LOG": template, "RANK": "5"})
    expected = os.path.join(tmp, f"x-{socket.gethostname()}-5-%.jsonl")
    expect(os.path.exists(expected), f"{expected} missing; have {os.listdir(tmp)}")
    poolshim_log.read_log(expected)


@case
def case_fork_before_cuda_child_is_pooled(tmp):
    native, shim = differential([program("fork_child"), "before"], tmp)
    paths = logs(tmp)
    expect_equal(len(paths), 2, f"logs (parent and child): {paths}")
    for p in paths:
        ex, d = exit_device(poolshim_log.read_log(p))
        expect_equal(ex["pooled_allocs"], 1, f"pooled allocations in {p}")


@case
def case_fork_after_cuda_child_passes_through(tmp):
    native, shim = differential([program("fork_child"), "after"], tmp, without_leak_check())
    expect("child: returned" in shim.out, shim.out)
    paths = logs(tmp)
    expect_equal(len(paths), 1, f"logs (the parent's only): {paths}")
    ex, d = exit_device(poolshim_log.read_log(paths[0]))
    expect_equal(ex["pooled_allocs"], 1, "pooled allocations")


@case
def case_driver_only_process_is_pooled(tmp):
    native, shim = differential([program("driver_alloc")], tmp)
    ex, d = exit_device(one_log(tmp))
    expect_equal(ex["pooled_allocs"], 1, "pooled allocations (cuMemAlloc_v2 found with dlsym)")
    expect_equal(d["frees"], 1, "frees")
    expect(ex["paths"]["dlsym"] >= 2, f"dlsym answers: {ex['paths']}")
    expect_equal(ex["paths"]["runtime_hooks"], 0, "runtime hook calls")


def static_case(tmp, args, pooled, async_allocs=0):
    native, shim = differential([program(args[0] + "_static")] + args[1:], tmp)
    ex, d = exit_device(one_log(tmp))
    expect_equal(ex["pooled_allocs"], pooled, "pooled allocations")
    expect_equal(d["async_allocs"], async_allocs, "async allocations")
    paths = ex["paths"]
    expect_equal(paths["runtime_hooks"], 0, "runtime hook calls (the runtime is linked in)")
    expect(paths["driver_hooks"] >= pooled + d["frees"], f"driver hook calls: {paths}")
    expect(paths["dlsym"] >= 1 and paths["cuGetProcAddress"] >= 1, f"ways in: {paths}")
    return native, shim, ex, d


@case
def case_static_runtime_churn_counted_once(tmp):
    static_case(tmp, ["churn", "1000", "64", str(4 * MiB)], 1064)


@case
def case_static_runtime_churn_async_counted_once(tmp):
    static_case(tmp, ["churn", "1000", "64", str(4 * MiB), "async"], 1064, 1064)


@case
def case_static_runtime_api_edges_match_native(tmp):
    native, shim = differential([program("api_edges_static")], tmp, {"POOLSHIM_PAGE": "20M"})
    with open(os.path.join(HERE, "expected", "api_edges.h200.txt")) as f:
        expect_equal(native.out, f.read(), "api_edges (static runtime) over the double vs. the H200 recording")
    ex, d = exit_device(one_log(tmp))
    expect(ex["pooled_allocs"] > 20, f"too few pooled allocations: {ex['pooled_allocs']}")
    expect_equal(d["oom_retries"], 0, "oom_retries (paged: no retry needed)")
    expect_equal(d["ooms"], 1, "ooms")
    expect_equal(d["reset_dropped"], 1, "reset_dropped")
    expect_equal(ex["leaks"]["count"], 0, "leaks")
    expect_equal(ex["paths"]["runtime_hooks"], 0, "runtime hook calls")


@case
def case_static_runtime_threads_and_demo(tmp):
    static_case(tmp, ["threads"], 2400, 1200)
    for p in logs(tmp):
        os.remove(p)
    native, shim, ex, d = static_case(tmp, ["demo", "20", str(1 << 18)], 1 + 20 * 7)
    expect_equal(ex["leaks"]["bytes"], 3 * MiB, "leaked bytes")


@case
def case_shared_runtime_counted_once_by_the_runtime_hooks(tmp):
    native, shim = differential([program("churn"), "1000", "64", str(4 * MiB), "async"], tmp)
    ex, d = exit_device(one_log(tmp))
    expect_equal(ex["pooled_allocs"], 1064, "pooled allocations")
    expect_equal(ex["paths"]["runtime_hooks"], 2 * 1064, "runtime hook calls (allocs and frees)")
    expect_equal(ex["paths"]["driver_hooks"], 0, "driver hook calls (all nested under runtime hooks)")
    expect(ex["paths"]["cuGetProcAddress"] >= 1, "the runtime's driver lookups went through the hook")
    # One dlsym answer: the runtime's own lookup of cuGetProcAddress_v2. The core resolves the
    # driver with the C library's dlsym; were it answered with hooks, its calls would re-enter.
    expect_equal(ex["paths"]["dlsym"], 1, "dlsym lookups answered with a hook")


@case
def case_cuGetProcAddress_hands_back_the_hook_of_exactly_the_variant(tmp):
    native = run([program("proc_address")], False, tmp)
    shim = run([program("proc_address")], True, tmp)
    expect_equal(native.rc, 0, f"native run\n{native.describe()}")
    expect_equal(shim.rc, 0, f"shim run\n{shim.describe()}")
    hooked = check_proc_address(native.out, shim.out)
    expect(hooked >= 40, f"only {hooked} answers were hooks")
    # The runtime's self-lookup: cuGetProcAddress at 12000 answers with the v2 hook itself.
    expect("cuGetProcAddress 12000 0 -> 0 0 cuGetProcAddress_v2 poolshim" in shim.out, shim.out)
    expect("cuGetProcAddress 11030 0 -> 0 0 cuGetProcAddress poolshim" in shim.out, shim.out)
    expect("cuMemAllocAsync 11020 2 -> 0 0 cuMemAllocAsync_ptsz poolshim" in shim.out, shim.out)


@case
def case_dlsym_keeps_native_semantics(tmp):
    native, shim = differential([program("dlsym_semantics")], tmp)
    expect("rtld_next_is_caller_relative: 1" in shim.out, shim.out)
    expect("cuMemAlloc_v2 from poolshim" in shim.err, shim.err)
    expect("cuMemAlloc_v2 from driver" in native.err, native.err)


@case
def case_ordered_free_mode_matches_native(tmp):
    for name in ("api_edges", "threads", "api_edges_static", "threads_static"):
        for p in logs(tmp):
            os.remove(p)
        differential([program(name)], tmp, {"POOLSHIM_FREE": "ordered"})
        ex, d = exit_device(one_log(tmp))
        expect(d["ordered_frees"] > 0, f"{name}: no ordered free: {d}")
        expect_equal(d["live_allocs"], 0, f"{name}: live allocations at exit")


@case
def case_ordered_free_mode_without_seen_streams_falls_back_to_sync(tmp):
    # churn never creates a stream and (over the double) never makes the runtime look up the
    # driver: the shim cannot prove it knows every stream, so every free synchronizes.
    native, shim = differential([program("churn"), "100", "8", str(MiB)], tmp, {"POOLSHIM_FREE": "ordered"})
    records = one_log(tmp)
    ex, d = exit_device(records)
    expect_equal(d["ordered_frees"], 0, "ordered frees")
    expect_equal(d["frees"], 108, "frees")
    message = ("free mode ordered: the application's stream creation was not seen by the shim; "
               "such frees synchronize the device as in mode sync")
    expect([r for r in records_of(records, "warning") if r["message"] == message], "no warning record")


@case
def case_launcher_summary_and_status(tmp):
    launcher = os.path.join(ROOT, "scripts", "poolshim")
    env = launcher_env()
    log = os.path.join(tmp, "log-%p.jsonl")
    done = subprocess.run([launcher, "--log", log, "--conf", "backtrace=6", "--", program("demo"), "10", str(1 << 16)], env=env,
                          capture_output=True, text=True, timeout=60)
    expect_equal(done.returncode, 0, f"exit status\n{done.stderr}")
    expect("demo: 10 steps" in done.stdout, done.stdout)
    for piece in ("71 allocations pooled (0 async), 70 freed", "leaks at exit: 1 allocation, 3.0 MiB",
                  "peak reserved", "of reserved at the end (", "cached, reusable at once; ",
                  "leaked from: 1 allocation, 3.0 MiB, main"):
        expect(piece in done.stderr, f"missing {piece!r} in\n{done.stderr}")
    failed = subprocess.run([launcher, "--log", log, "--", program("oom_exit")], env=env, capture_output=True,
                            text=True, timeout=60)
    expect_equal(failed.returncode, 3, "the command's exit status")
    expect("OOM at t=" in failed.stderr and "verdict exhausted" in failed.stderr, failed.stderr)
    usage = subprocess.run([launcher, "--log", log], env=env, capture_output=True, text=True, timeout=60)
    expect_equal(usage.returncode, 2, "no command")
    expect("no command given" in usage.stderr, usage.stderr)


@case
def case_launcher_observe_flag_and_memory_outside_the_pool(tmp):
    launcher = os.path.join(ROOT, "scripts", "poolshim")
    env = dict(launcher_env(), CUDADOUBLE_MEM="32M")
    log = os.path.join(tmp, "log-%p.jsonl")
    observed = subprocess.run([launcher, "--observe", "--log", log, "--", program("oom_cases"), "exhausted"], env=env,
                              capture_output=True, text=True, timeout=60)
    expect_equal(observed.returncode, 3, f"exit status\n{observed.stderr}")
    for piece in ("observe mode, 8 allocations tracked (0 async), 0 freed, nothing pooled",
                  "peak tracked 32.0 MiB", "8 tracked allocations"):
        expect(piece in observed.stderr, f"missing {piece!r} in\n{observed.stderr}")
    vmm = subprocess.run([launcher, "--log", log, "--", program("vmm_alloc"), "keep"], env=env,
                         capture_output=True, text=True, timeout=60)
    expect_equal(vmm.returncode, 0, f"exit status\n{vmm.stderr}")
    expect("outside the pool: VMM (cuMemCreate) peak 24.0 MiB, 8.0 MiB at the end" in vmm.stderr, vmm.stderr)


@case
def case_launcher_verbose_prints_the_log_path_at_start(tmp):
    """--verbose: the launcher's first line names the command's log (its pid filled in) before
    the command runs; the summary then finds that log, named through a key:value --conf."""
    launcher = os.path.join(ROOT, "scripts", "poolshim")
    done = subprocess.run([launcher, "--verbose", "--conf", "log:" + os.path.join(tmp, "log-%p-%%.jsonl"), "--",
                           program("demo"), "3", str(1 << 16)], env=launcher_env(), capture_output=True, text=True,
                          timeout=60)
    expect_equal(done.returncode, 0, f"exit status\n{done.stderr}")
    paths = logs(tmp)
    expect_equal(len(paths), 1, f"logs: {paths}")
    pid = records_of(poolshim_log.read_log(paths[0]), "start")[0]["pid"]
    expect_equal(paths[0], os.path.join(tmp, f"log-{pid}-%.jsonl"), "the log's name")
    lines = done.stderr.splitlines()
    expect_equal(lines[0], f"poolshim: log {paths[0]}", "the first line on stderr")
    expect(f"poolshim: pid {pid} (" in done.stderr, f"the summary of that log in\n{done.stderr}")
    disabled = subprocess.run([launcher, "--verbose", "--log", "", "--", "true"], env=launcher_env(),
                              capture_output=True, text=True, timeout=60)
    expect_equal((disabled.returncode, disabled.stderr.splitlines()[:1]),
                 (0, ["poolshim: log disabled (POOLSHIM_LOG is empty)"]), "an empty --log")


@case
def case_launcher_finds_the_log_of_a_bad_template(tmp):
    """A log template the library refuses (%x) falls back to the default name in the folder it
    named; the launcher follows the same rule, so --verbose names that file and the summary
    reads it. A valid POOLSHIM_CONF item under a bad variable is the one taken."""
    launcher = os.path.join(ROOT, "scripts", "poolshim")

    def run_and_check(options, env, expected_name):
        done = subprocess.run([launcher, "--verbose", *options, "--", program("demo"), "3", str(1 << 16)], env=env,
                              capture_output=True, text=True, timeout=60)
        expect_equal(done.returncode, 0, f"exit status\n{done.stderr}")
        paths = logs_in(tmp, "")
        expect_equal(len(paths), 1, f"logs: {paths}")
        pid = records_of(poolshim_log.read_log(paths[0]), "start")[0]["pid"]
        expect_equal(paths[0], os.path.join(tmp, expected_name.format(pid=pid)), "the log's name")
        expect_equal(done.stderr.splitlines()[0], f"poolshim: log {paths[0]}", "the first line on stderr")
        expect(f"poolshim: pid {pid} (" in done.stderr, f"the summary of that log in\n{done.stderr}")
        os.remove(paths[0])

    run_and_check(["--log", os.path.join(tmp, "run-%x.jsonl")], launcher_env(), "poolshim-{pid}.jsonl")
    run_and_check([], dict(launcher_env(), POOLSHIM_LOG=os.path.join(tmp, "bad-%q.jsonl"),
                           POOLSHIM_CONF="log=" + os.path.join(tmp, "conf-%p.jsonl")), "conf-{pid}.jsonl")


@case
def case_launcher_takes_the_command_without_double_dash(tmp):
    """The command starts at the first argument that is neither a launcher option nor its value;
    everything after it is the command's, `--` and launcher-like options included."""
    launcher = os.path.join(ROOT, "scripts", "poolshim")
    env = launcher_env()
    log = os.path.join(tmp, "log-%p.jsonl")
    echoed = subprocess.run([launcher, "--no-summary", "--log", log, "sh", "-c", 'printf "%s|" "$@"', "sh", "a", "--",
                             "--log", "b"], env=env, capture_output=True, text=True, timeout=60)
    expect_equal((echoed.returncode, echoed.stdout, echoed.stderr), (0, "a|--|--log|b|", ""), "the command's arguments")
    done = subprocess.run([launcher, "--log", log, program("demo"), "10", str(1 << 16)], env=env,
                          capture_output=True, text=True, timeout=60)
    expect_equal(done.returncode, 0, f"exit status\n{done.stderr}")
    expect("71 allocations pooled (0 async), 70 freed" in done.stderr, done.stderr)
    expect("no log written" not in done.stderr, done.stderr)


@case
def case_launcher_says_when_no_log_was_written(tmp):
    """A command that allocated no device memory under the shim (none at all, or with the shim
    off) leaves no log: one line says so, and the status stays the command's."""
    launcher = os.path.join(ROOT, "scripts", "poolshim")
    log = os.path.join(tmp, "log-%p.jsonl")
    line = f"poolshim: no log written ({log}): the command allocated no device memory under the shim, or did not load it"
    for command, extra, status in ((["sh", "-c", "exit 5"], {}, 5),
                                   ([program("demo"), "2", "1024"], {"POOLSHIM_ENABLE": "0"}, 0)):
        done = subprocess.run([launcher, "--log", log, "--"] + command, env=dict(launcher_env(), **extra),
                              capture_output=True, text=True, timeout=60)
        said = [s for s in done.stderr.splitlines() if s.startswith("poolshim")]   # the demo times itself there
        expect_equal((done.returncode, said), (status, [line]), f"{command} {extra}")
    expect_equal(logs(tmp), [], "log files")


@case
def case_launcher_names_a_missing_cuda_driver(tmp):
    """Without the double on the loader's path (and no driver installed) the command fails with
    cudaErrorInsufficientDriver: after the no-log line the launcher says why, naming the double
    beside the build's library; with the double there is no such line."""
    launcher = os.path.join(ROOT, "scripts", "poolshim")
    log = os.path.join(tmp, "log-%p.jsonl")
    env = launcher_env()
    env.pop("LD_LIBRARY_PATH")
    native = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libcuda.so.1')"], env=env,
                            capture_output=True)
    if native.returncode == 0:
        print("skipped: this machine has a CUDA driver (libcuda.so.1 loads without the double)")
        return
    done = subprocess.run([launcher, "--log", log, program("demo"), "2", "1024"], env=env, capture_output=True,
                          text=True, timeout=60)
    said = [s for s in done.stderr.splitlines() if s.startswith("poolshim")]
    expect_equal((done.returncode, said), (10, [
        f"poolshim: no log written ({log}): the command allocated no device memory under the shim, or did not load it",
        "poolshim: no CUDA driver (libcuda.so.1) loads in the command's environment: it could reach no GPU; run over "
        f"the CPU test double with LD_LIBRARY_PATH={os.path.join(BUILD, 'double')}"]), done.stderr)
    with_double = subprocess.run([launcher, "--log", log, "--", "sh", "-c", "exit 5"], env=launcher_env(),
                                 capture_output=True, text=True, timeout=60)
    expect("no CUDA driver" not in with_double.stderr, with_double.stderr)


@case
def case_launcher_exit_status_126_and_127_as_shells_give(tmp):
    """127 when there is no such command, 126 when there is one that cannot be executed."""
    launcher = os.path.join(ROOT, "scripts", "poolshim")
    not_executable = os.path.join(tmp, "not-executable")
    with open(not_executable, "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(not_executable, 0o644)
    bad_interpreter = os.path.join(tmp, "bad-interpreter")
    with open(bad_interpreter, "w") as f:
        f.write("#!/nonexistent/interpreter\n")
    os.chmod(bad_interpreter, 0o755)
    missing = os.path.join(tmp, "missing")
    for command, status, why in ((missing, 127, "No such file or directory"),
                                 ("poolshim-no-such-command", 127, "No such file or directory"),
                                 (not_executable, 126, "Permission denied"),
                                 (tmp, 126, "Permission denied"),
                                 (bad_interpreter, 126, "No such file or directory")):
        done = subprocess.run([launcher, "--log", os.path.join(tmp, "log-%p.jsonl"), "--", command], env=launcher_env(),
                              capture_output=True, text=True, timeout=60)
        expect_equal((done.returncode, done.stdout, done.stderr),
                     (status, "", f"poolshim: error: cannot run {command}: {why}\n"), command)


@case
def case_launcher_refuses_a_poolshim_library_that_is_not_one(tmp):
    """A POOLSHIM_LIBRARY that names no ELF file is an error (status 2), not skipped for
    another copy; the command does not run."""
    launcher = os.path.join(ROOT, "scripts", "poolshim")
    text = os.path.join(tmp, "text.so")
    with open(text, "w") as f:
        f.write("not a library\n")
    ran = os.path.join(tmp, "ran")
    for named, why in ((os.path.join(tmp, "missing.so"), "No such file or directory"), (text, "not an ELF file"),
                       (tmp, "Is a directory")):
        env = dict(launcher_env(), POOLSHIM_LIBRARY=named)
        done = subprocess.run([launcher, "--log", os.path.join(tmp, "log-%p.jsonl"), "--", "touch", ran], env=env,
                              capture_output=True, text=True, timeout=60)
        expect_equal((done.returncode, done.stdout, done.stderr),
                     (2, "", f"poolshim: error: POOLSHIM_LIBRARY={named} names no loadable library: {why}\n"), named)
        expect(not os.path.exists(ran), f"the command ran with POOLSHIM_LIBRARY={named}")


def launcher_env():
    """The environment of the new launcher cases' commands (Python programs, some of which exec
    test programs). In a sanitizer build the runtime leads LD_PRELOAD (the launcher keeps it
    first), and the interpreter's own leaks at exit are not ours to report."""
    env = base_env({"POOLSHIM_LIBRARY": os.path.join(BUILD, "libpoolshim.so")})
    runtime = env.get("E2E_SANITIZER_RUNTIME")
    if runtime:
        env["LD_PRELOAD"] = runtime
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    return env


@case
def case_launcher_keeps_the_status_and_summarizes_only_its_run(tmp):
    """Other logs in the folder change during the run: one of a process that started before the
    launcher, with fields missing (not summarized: not this run's), one that is not JSON (one
    line says so) and one of a process that started during the run, with fields missing (a
    descendant, as far as a log can tell: summarized, ? for what it lacks)."""
    launcher = os.path.join(ROOT, "scripts", "poolshim")
    env = launcher_env()
    other, broken, started_during = (os.path.join(tmp, f"log-{n}.jsonl") for n in (1, 2, 3))
    other_text = ('{"schema":1,"type":"start","t":0,"pid":1,"start_unix_s":1000}\n'
                  '{"schema":1,"type":"sample","t":1,"pid":1,"device":0}\n')
    broken_text = "{not json\n"
    started_during_text = ('{"schema":1,"type":"start","t":0,"pid":3,"start_unix_s":%d}\n'
                           '{"schema":1,"type":"exit","t":0.5,"pid":3}\n')
    writes_logs_then_runs_oom_exit = (
        "import os, time\n"
        f"open({other!r}, 'w').write({other_text!r})\n"
        f"open({broken!r}, 'w').write({broken_text!r})\n"
        f"open({started_during!r}, 'w').write({started_during_text!r} % time.time())\n"
        f"os.execv({program('oom_exit')!r}, ['oom_exit'])\n")
    done = subprocess.run([launcher, "--log", os.path.join(tmp, "log-%p.jsonl"), "--", sys.executable, "-c",
                           writes_logs_then_runs_oom_exit], env=env, capture_output=True, text=True, timeout=60)
    expect_equal(done.returncode, 3, f"the command's exit status\n{done.stderr}")
    expect("Traceback" not in done.stderr, done.stderr)
    expect(other not in done.stderr, f"a log of a process that started before the run was summarized\n{done.stderr}")
    lines = done.stderr.splitlines()
    expect(f"poolshim: cannot summarize {broken}:1: not JSON (Expecting property name enclosed in double quotes)"
           in lines, done.stderr)
    header = f"poolshim: pid 3 (), log {started_during}"
    expect(header in lines, f"no summary of the log of a process that started during the run\n{done.stderr}")
    summary = lines.index(header)
    expect_equal(lines[summary + 1:summary + 3], ["  no device memory was pooled", "  leaks at exit: ?"],
                 f"the summary of a log without figures\n{done.stderr}")
    expect("OOM at t=" in done.stderr and "verdict exhausted" in done.stderr, done.stderr)


# A command for the launcher that waits to be signalled: it writes its pid to the file named
# by its argument (renamed into place, so that a reader never sees half of it) and sleeps.
WAITS_FOR_A_SIGNAL = """
import os, resource, signal, sys, time
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))          # SIGQUIT: no core file
for s in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, signal.SIG_DFL)                      # die of it, whatever the caller ignored
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""


def process_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@case
def case_launcher_passes_signals_on_to_the_command(tmp):
    """kill -TERM (-HUP, -INT, -QUIT, -USR1, -USR2) of the launcher's pid alone reaches the command,
    the launcher waits for it and returns 128+N: the command does not run on as an orphan."""
    import signal
    import time
    launcher = os.path.join(ROOT, "scripts", "poolshim")
    env = launcher_env()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        ready = os.path.join(tmp, f"pid-{sig.name}")
        launched = subprocess.Popen([launcher, "--log", os.path.join(tmp, "log-%p.jsonl"), "--", sys.executable,
                                     "-c", WAITS_FOR_A_SIGNAL, ready], env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
        child = None
        try:
            deadline = time.time() + 30
            while not os.path.exists(ready) and launched.poll() is None and time.time() < deadline:
                time.sleep(0.01)
            expect(os.path.exists(ready), f"{sig.name}: the command did not start")
            with open(ready) as f:
                child = int(f.read())
            launched.send_signal(sig)
            try:
                status = launched.wait(timeout=5)
            except subprocess.TimeoutExpired:
                status = "still running 5 s later"
            deadline = time.time() + 2
            while process_exists(child) and time.time() < deadline:
                time.sleep(0.01)
            expect(not process_exists(child), f"{sig.name}: the command still runs after the launcher got it")
            expect_equal(status, 128 + sig, f"the launcher's status after {sig.name}\n{launched.stderr.read()}")
        finally:
            if launched.poll() is None:
                launched.kill()
                launched.wait()
            if child is not None and process_exists(child):
                os.kill(child, signal.SIGKILL)
            launched.stderr.close()


@case
def case_launcher_leaves_ctrl_c_to_the_terminal(tmp):
    """Ctrl-C on the launcher's terminal reaches the command once (the terminal sends it to the
    whole foreground group; the launcher does not pass it on a second time) and the launcher
    returns the command's status."""
    import pty
    import select
    import time
    launcher = os.path.join(ROOT, "scripts", "poolshim")
    env = launcher_env()
    counts_sigints = ("import signal, time\n"
                      "got = []\n"
                      "signal.signal(signal.SIGINT, lambda *_: got.append(1))\n"
                      "print('ready', flush=True)\n"
                      "deadline = time.time() + 20\n"
                      "while not got and time.time() < deadline:\n"
                      "    time.sleep(0.01)\n"
                      "time.sleep(0.5)   # time for a second one to come\n"
                      "print(f'SIGINT x{len(got)}', flush=True)\n")
    pid, terminal = pty.fork()
    if pid == 0:   # the launcher, leading a session on a new terminal
        try:
            os.execve(launcher, [launcher, "--no-summary", "--", sys.executable, "-c", counts_sigints], env)
        finally:
            os._exit(127)
    output = b""
    sent = False
    deadline = time.time() + 40
    try:
        while time.time() < deadline:
            if not sent and b"ready" in output:
                os.write(terminal, b"\x03")
                sent = True
            readable, _, _ = select.select([terminal], [], [], 0.1)
            if readable:
                try:
                    chunk = os.read(terminal, 4096)
                except OSError:          # EIO: the terminal's other end closed
                    break
                if not chunk:
                    break
                output += chunk
    finally:
        if time.time() >= deadline:
            os.kill(pid, 9)
        _, status = os.waitpid(pid, 0)
        os.close(terminal)
    text = output.decode(errors="replace")
    expect("SIGINT x1" in text, f"the command's count of SIGINTs:\n{text}")
    expect_equal(os.waitstatus_to_exitcode(status), 0, f"the launcher's status\n{text}")


@case
def case_log_reader_rejects_foreign_lines(tmp):
    path = os.path.join(tmp, "bad.jsonl")
    with open(path, "w") as f:
        f.write('{"schema":1,"type":"start","t":0,"pid":1}\n{"hello": 1}\n')
    try:
        poolshim_log.read_log(path)
    except poolshim_log.LogError as e:
        expect_equal(str(e), f"{path}:2: not a poolshim record (no schema, type, t, pid)", "message")
    else:
        raise Failure("a foreign line was accepted")


# ---- hardening: the shim never hangs, kills or writes into its host (issue 12) -------------

def host_edges(*args):
    return [program("host_edges")] + [str(a) for a in args]


def shim_library():
    return os.path.join(BUILD, "libpoolshim.so")


def gcc_runtime(name):
    found = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    path = os.path.realpath(found)
    expect(os.path.isabs(found) and os.path.exists(path), f"{name} not found: gcc's sanitizer runtimes come with g++")
    return path


def warnings_of(result, text):
    return result.err.count(f"poolshim: warning: {text}\n")


@case
def case_sanitizer_runtime_first_in_preload_starts(tmp):
    """Defect 1: ASan and TSan look up functions through dlsym while they initialize, and met
    a guarded static and instrumented code there: `libtsan.so:libpoolshim.so /bin/true` exited
    139. In a sanitizer job its own runtime goes first anyway (the harness): it checks that one."""
    own = sanitizer_runtime(BUILD)
    runtimes = [own] if own else [gcc_runtime("libasan.so"), gcc_runtime("libtsan.so")]
    for runtime in runtimes:
        env = base_env({"ASAN_OPTIONS": "detect_leaks=0", "LD_PRELOAD": runtime + ":" + shim_library(),
                        "POOLSHIM_LOG": os.path.join(tmp, "log-%p.jsonl")})
        env.pop(SANITIZER_RUNTIME, None)
        done = subprocess.run(["true"], env=env, capture_output=True, text=True, timeout=60)
        expect_equal(done.returncode, 0, f"/bin/true with {os.path.basename(runtime)} first, then the shim")
        native = run_process([program("churn"), "200", "8", "65536"], dict(env, LD_PRELOAD=runtime))
        shim = run_process([program("churn"), "200", "8", "65536"], env)
        compare(["churn", "with", runtime], native, shim)
        expect_equal(shim.rc, 0, "churn's exit status")


@case
def case_fifo_log_is_refused_without_blocking(tmp):
    """Defect 2: a FIFO as the log hung the application for ever (open without O_NONBLOCK,
    then exit and fork waited for the worker)."""
    fifo = os.path.join(tmp, "f.jsonl")
    os.mkfifo(fifo)
    message = f"cannot open log {fifo}: it is a FIFO, not a regular file; running without a log"
    native = run([program("churn"), "100", "8", "65536"], False, tmp)
    shim = run([program("churn"), "100", "8", "65536"], True, tmp, {"POOLSHIM_LOG": fifo}, timeout=20)
    compare(["churn", "logging to a FIFO"], native, shim)
    expect_equal(warnings_of(shim, message), 1, f"the warning in\n{shim.err}")
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader that never reads
    try:
        shim = run([program("fork_child"), "after"], True, tmp, dict(without_leak_check(), POOLSHIM_LOG=fifo),
                   timeout=20)
    finally:
        os.close(reader)
    expect_equal(shim.rc, 0, "fork_child's exit status")
    expect_equal(warnings_of(shim, message), 1, f"the warning in\n{shim.err}")


@case
def case_hard_linked_log_is_refused(tmp):
    """Defect 5: the log was opened without an owner or link check: a hard link planted as the
    log had the shim append to the linked file."""
    victim = os.path.join(tmp, "victim.txt")
    link = os.path.join(tmp, "planted.jsonl")
    with open(victim, "w") as f:
        f.write("precious\n")
    os.link(victim, link)
    native, shim = differential([program("churn"), "100", "8", "65536"], tmp, {"POOLSHIM_LOG": link})
    expect_equal(warnings_of(shim, f"cannot open log {link}: it has 2 hard links; running without a log"), 1,
                 f"the warning in\n{shim.err}")
    with open(victim) as f:
        expect_equal(f.read(), "precious\n", "the linked file")


@case
def case_log_is_private_to_its_user(tmp):
    """The log holds the command line and the configuration: created 0600, not 0644."""
    old = os.umask(0o022)
    try:
        differential([program("churn"), "10", "4", "65536"], tmp)
    finally:
        os.umask(old)
    mode = os.stat(logs(tmp)[0]).st_mode & 0o777
    expect_equal(oct(mode), oct(0o600), "the log's mode")


@case
def case_file_size_limit_stops_the_log_not_the_program(tmp):
    """Defect 3: past RLIMIT_FSIZE the worker's write raised SIGXFSZ and killed the program
    (exit status 153). Now the log stops before a record would be cut, with one warning."""
    limited = [sys.executable, "-c",
               # Python ignores SIGXFSZ, and exec would pass that on: the default for the program.
               "import os, resource, signal, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (9000, 9000)); "
               "signal.signal(signal.SIGXFSZ, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
               program("churn"), "300000", "16", "65536"]
    log = os.path.join(tmp, "log-%p.jsonl")
    native = run(limited, False, tmp)
    shim = run(limited, True, tmp, {"POOLSHIM_SAMPLE_MS": "1", "POOLSHIM_LOG": log}, timeout=120)
    # 9000 bytes: the start record and five samples of about 1.3 KB (a run makes tens of KB of
    # them; with 16 KiB a fast run sometimes ended first).
    compare(["churn with a 9000-byte file-size limit"], native, shim)
    expect_equal(shim.rc, 0, "exit status")
    path = logs(tmp)[0]
    message = f"cannot write log {path}: it reached the file-size limit (ulimit -f: 9000 bytes); logging stops"
    expect_equal(warnings_of(shim, message), 1, f"the warning in\n{shim.err}")
    records = poolshim_log.read_log(path)  # every line whole
    expect(os.path.getsize(path) <= 9000, f"the log grew past the limit: {os.path.getsize(path)}")
    expect(len(records_of(records, "sample")) > 3, "samples before the limit")


@case
def case_daemon_closing_descriptors_keeps_its_files(tmp):
    """Defect 4: a daemon-style program that closes every descriptor above 2 and opens its own
    file got the shim's records in that file, and the shim closed the program's descriptor at
    exit. Now the log's descriptor is high and checked by device and inode before each write."""
    own = os.path.join(tmp, "own.txt")
    native = run(host_edges("daemon_fds", own), False, tmp)
    suppressions = os.path.join(HERE, "daemon_fds.tsan.supp")
    shim = run(host_edges("daemon_fds", own), True, tmp, {
        "POOLSHIM_SAMPLE_MS": "20",
        "TSAN_OPTIONS": os.environ.get("TSAN_OPTIONS", "") + f":suppressions={suppressions}"})
    compare(["host_edges", "daemon_fds"], native, shim)
    expect_equal(shim.out.splitlines()[-1], "descriptors still open after exit handlers: 1021", "the program's descriptors")
    with open(own) as f:
        expect_equal(f.read(), "the program's own line\n", "the program's file")
    path = logs(tmp)[0]
    expect_equal(warnings_of(shim, f"cannot write log {path}: its descriptor was closed or reused by the program; "
                                   "logging stops"), 1, f"the warning in\n{shim.err}")
    poolshim_log.read_log(path)


@case
def case_signal_blocked_by_the_program_never_reaches_the_shim_thread(tmp):
    """Defect 7: the worker thread did not block signals, so a signal the program blocked in its
    threads to take with sigwait was delivered there and killed the process."""
    native, shim = differential(host_edges("sigwait", 2000), tmp)  # 20 often survived before
    expect_equal(shim.out, "took 2000 of 2000 signals with sigwait\n", "output")
    expect_equal(shim.rc, 0, "exit status")


@case
def case_exit_record_is_one_snapshot_while_threads_allocate(tmp):
    """Defect 11: with threads inside hooks at exit, live_allocs and the leak count disagreed
    (28 of 30 runs). Now the exit handler waits for hooks in flight before the snapshot."""
    for attempt in range(10):
        folder = os.path.join(tmp, str(attempt))
        os.mkdir(folder)
        shim = run(host_edges("exit_while_allocating", 4), True, folder, without_leak_check(), timeout=60)
        expect_equal(shim.rc, 0, f"exit status (run {attempt})\n{shim.err}")
        expect_exit_snapshot(exit_record(poolshim_log.read_log(logs_in(folder)[0])), f"run {attempt}")


@case
def case_dlclose_of_a_dlopened_shim_does_not_hang(tmp):
    """Defect 12: dlclose ran the exit handler under the loader's lock, and it joined the worker:
    a deadlock. The library is linked -z nodelete: it stays loaded."""
    shim = run(host_edges("dlclose", shim_library()), False, tmp,
               {"POOLSHIM_LOG": os.path.join(tmp, "log-%p.jsonl")}, timeout=20)
    expect_equal((shim.rc, shim.out), (0, "dlclose -> 0\nafter dlclose\n"), f"exit status and output\n{shim.err}")


@case
def case_prometheus_file_replaces_only_a_regular_file_of_ours(tmp):
    """Defect 5: POOLSHIM_PROM_FILE replaced whatever was at the path (a device node became a
    regular file) and wrote through a predictable temporary name opened with O_TRUNC, so a hard
    link planted there had the shim overwrite the linked file."""
    fifo = os.path.join(tmp, "metrics.prom")
    os.mkfifo(fifo)
    native, shim = differential([program("churn"), "2000", "8", "65536"], tmp,
                                {"POOLSHIM_PROM_FILE": fifo, "POOLSHIM_SAMPLE_MS": "5"})
    expect(os.path.exists(fifo) and not os.path.isfile(fifo), "the FIFO was replaced")
    expect_equal(warnings_of(shim, f"POOLSHIM_PROM_FILE: refusing to replace {fifo}: it is not a regular file"), 1,
                 f"the warning in\n{shim.err}")
    os.unlink(fifo)
    victim = os.path.join(tmp, "victim.txt")
    with open(victim, "w") as f:
        f.write("precious\n")
    prom = os.path.join(tmp, "metrics.prom")
    # The shell plants a hard link under the old temporary name (<path>.tmp.<pid>; exec keeps
    # the pid), then becomes the program.
    planted = ["sh", "-c", 'victim=$0; prom=$1; shift; ln "$victim" "$prom.tmp.$$" && exec "$@"', victim, prom,
               program("churn"), "2000", "8", "65536"]
    shim = run(planted, True, tmp, {"POOLSHIM_PROM_FILE": prom, "POOLSHIM_SAMPLE_MS": "5"})
    expect_equal(shim.rc, 0, f"exit status\n{shim.err}")
    with open(victim) as f:
        expect_equal(f.read(), "precious\n", "the file linked under the old temporary name")
    # Written at each sample without a warning, and removed at exit, as the file last written.
    expect("POOLSHIM_PROM_FILE" not in shim.err, f"a warning about the metrics file\n{shim.err}")
    expect(not os.path.exists(prom), "the metrics file is left after exit")


# ---- the event log (issue 17, POOLSHIM_EVENTS) --------------------------------------------

def event_files(tmp):
    return sorted(f for f in os.listdir(tmp) if f.endswith(".csv"))


def event_rows(tmp):
    """The one event log in `tmp`: its pid (from the name), header and rows split into cells."""
    files = event_files(tmp)
    expect_equal(len(files), 1, f"event logs in {os.listdir(tmp)}")
    path = os.path.join(tmp, files[0])
    with open(path) as f:
        lines = f.read().split("\n")
    expect_equal(lines[-1], "", "the file ends with a newline")
    return int(files[0].split("-")[1].split(".")[0]), lines[0], [line.split(",") for line in lines[1:-1]], path


def expect_frees_follow_allocations(rows):
    live = set()
    for n, r in enumerate(rows, start=2):
        if r[2] == "allocate":
            expect(r[3] not in live, f"line {n}: {r[3]} allocated again while live")
            live.add(r[3])
        elif r[2] == "free":
            expect(r[3] in live, f"line {n}: free of {r[3]}, which is not live")
            live.discard(r[3])
    return live


@case
def case_event_log_has_a_row_per_pooled_allocation_and_free(tmp):
    args = [program("demo"), "10", "65536"]
    native = run(args, False, tmp)
    shim = run(args, True, tmp, {"POOLSHIM_EVENTS": os.path.join(tmp, "events-%p.csv")})
    compare(args, native, shim)
    expect_equal([l for l in shim.err.splitlines() if l.startswith("poolshim")], [], "poolshim's stderr")
    ex, d = exit_device(one_log(tmp))
    pid, header, rows, _ = event_rows(tmp)
    expect_equal(header, "Thread,Time,Action,Pointer,Size,Stream,Device,Site,T", "header")
    allocs = [r for r in rows if r[2] == "allocate"]
    frees = [r for r in rows if r[2] == "free"]
    expect_equal(len(allocs) + len(frees), len(rows), "rows other than allocate and free")
    expect_equal(ex["pooled_allocs"], 71, "pooled allocations (7 a step and one kept)")
    expect_equal(len(allocs), ex["pooled_allocs"], "allocate rows = the exit record's pooled allocations")
    expect_equal(len(frees), d["frees"], "free rows = the exit record's frees")
    expect_equal(d["frees"], 70, "frees")
    expect_equal(d["passthrough_allocs"], 0, "pass-through allocations")
    expect_equal((ex["event_log_written"], ex["event_log_dropped"]), (141, 0), "written, dropped")
    expect_equal(sum(int(r[4]) for r in allocs), d["requested_bytes_total"], "bytes of the allocate rows")
    live = expect_frees_follow_allocations(rows)
    expect_equal(len(live), ex["leaks"]["count"], "allocations with no free row = leaks at exit")
    for n, r in enumerate(rows, start=2):
        expect_equal(len(r), 9, f"line {n}: cells")
        expect_equal(r[0], str(pid), f"line {n}: the demo's one thread is its main thread, tid = pid")
        expect(re.fullmatch(r"\d\d:\d\d:\d\d\.\d{6}", r[1]), f"line {n}: time {r[1]!r}")
        expect(re.fullmatch(r"0x[0-9a-f]+", r[3]) and r[3] != "0x0", f"line {n}: pointer {r[3]!r}")
        expect_equal((r[5], r[6], r[7]), ("0x0", "0", "0"), f"line {n}: stream, device, site")
        expect(re.fullmatch(r"\d+\.\d{9}", r[8]), f"line {n}: t {r[8]!r}")
    ts = [float(r[8]) for r in rows]
    expect(ts == sorted(ts), "t never goes back")


@case
def case_event_log_parses_as_rmm_replay_reads_it(tmp):
    # Streams (churn async on its own streams) and failures (oom_cases): every column RMM reads.
    runs = [([program("churn"), "200", "16", str(4 * MiB), "async"], {}, 0),
            ([program("oom_cases"), "exhausted"], {"CUDADOUBLE_MEM": "32M", "POOLSHIM_BACKTRACE": "8"}, 3)]
    for i, (args, extra, rc) in enumerate(runs):
        sub = os.path.join(tmp, str(i))
        os.mkdir(sub)
        env = dict(extra, POOLSHIM_EVENTS=os.path.join(sub, "events-%p.csv"))
        shim = run(args, True, sub, env)
        expect_equal(shim.rc, rc, f"exit status\n{shim.describe()}")
        pid, header, rows, path = event_rows(sub)
        expect(header.startswith(rmm_csv.RMM_HEADER + ","), f"RMM's columns first: {header!r}")
        try:
            events = rmm_csv.parse(path)
        except rmm_csv.RmmParseError as e:
            raise Failure(f"RMM's parser would refuse {path}: {e}")
        expect_equal(len(events), len(rows), "events")
        live = {}
        for e, r in zip(events, rows):
            expect_equal(e["pointer"], int(r[3], 16), "Pointer read as RMM reads it")
            expect_equal(e["stream"], 0, "Stream: RMM reads 0x... as decimal, 0")
            expect_equal(e["thread"], int(r[0]), "Thread")
            if e["action"] == "allocate":
                live[e["pointer"]] = e["size"]
            elif e["action"] == "free":
                # The replay finds a free's allocation by its pointer, of the same size.
                expect_equal(live.pop(e["pointer"], None), e["size"], f"the allocation freed at line {e['index'] + 2}")
        ex, d = exit_device(one_log(sub))
        counts = {a: sum(1 for e in events if e["action"] == a) for a in rmm_csv.ACTIONS}
        if i == 0:
            expect_equal(counts, {"allocate": 216, "free": 216, "allocate failure": 0}, "actions")
            expect_equal(d["async_allocs"], 216, "async allocations")
            streams = {r[5] for r in rows}
            expect(len(streams) >= 1 and "0x0" not in streams, f"the churn's own stream(s): {streams}")
        else:
            expect_equal(counts, {"allocate": 8, "free": 0, "allocate failure": 1}, "actions")
            fail = [r for r in rows if r[2] == "allocate failure"][0]
            expect_equal((fail[3], fail[4]), ("0x0", str(4 * MiB)), "the failure's pointer and request")
            expect_equal(d["failed_allocs"], 1, "failed allocations")
            sites = {r[7] for r in rows}
            expect(len(sites) == 1 and sites != {"0"}, f"one call site, recorded: {sites}")


@case
def case_peak_samples_and_peak_consumers_name_the_functions_that_held_the_peak(tmp):
    # peak_sites holds 32 MiB from two functions for 300 ms, frees it, then holds 4 MiB from a
    # third. The shim looks every 50 ms: the peak's sample and consumers, the sites' key in
    # the exit record for the event log's Site column.
    args = [program("peak_sites")]
    native = run(args, False, tmp)
    env = {"POOLSHIM_BACKTRACE": "8", "POOLSHIM_EVENTS": os.path.join(tmp, "events-%p.csv")}
    shim = run(args, True, tmp, env)
    compare(args, native, shim)
    records = one_log(tmp)
    samples = [r for r in records if r["type"] == "sample"]
    peaks = [r for r in samples if r["why"] == "peak"]
    expect(peaks, f"no peak sample in {[r['why'] for r in samples]}")
    expect_equal(max(r["requested_bytes"] for r in peaks), 32 * MiB, "the peak sample's requested bytes")
    expect_equal(samples[-1]["why"], "exit", "the last sample")
    expect(all(r["why"] in ("peak", "interval", "exit") for r in samples), [r["why"] for r in samples])
    ex, d = exit_device(records)
    expect_equal(d["requested_bytes_peak"], 32 * MiB, "requested peak")
    pc = d["peak_consumers"]
    expect_equal((pc["live_bytes"], pc["live_allocs"]), (32 * MiB, 4), "live at the peak's look")
    expect_equal([(g["count"], g["bytes"]) for g in pc["by_site"]], [(3, 24 * MiB), (1, 8 * MiB)], "groups")
    expect(top_function(pc["by_site"][0]["site"]).startswith("(anonymous namespace)::load_weights"),
           pc["by_site"][0])
    expect(top_function(pc["by_site"][1]["site"]).startswith("(anonymous namespace)::make_activations"),
           pc["by_site"][1])
    expect_equal([l["bytes"] for l in pc["largest"]], [8 * MiB] * 4, "largest")
    first_peak = min(r["t"] for r in peaks if r["requested_bytes"] == 32 * MiB)
    expect(first_peak <= pc["t"] < first_peak + 0.4, f"consumers at {pc['t']}, peak sample at {first_peak}")
    _, _, rows, _ = event_rows(tmp)
    ids = sorted({r[7] for r in rows}, key=int)
    expect_equal(sorted(ex["event_log_sites"], key=int), ids, "a key for every Site of the event log")
    names = sorted(top_function(ex["event_log_sites"][i]).split("::")[-1] for i in ids)
    expect_equal(names, ["load_weights()", "make_activations()", "scratch()"], "the sites' functions")


@case
def case_event_log_small_queue_drops_and_counts_exactly(tmp):
    # The test knob: a queue of 8 drained only at exit, so 141 records - 8 written = 133 dropped.
    args = [program("demo"), "10", "65536"]
    native = run(args, False, tmp)
    shim = run(args, True, tmp, {"POOLSHIM_EVENTS": os.path.join(tmp, "events-%p.csv"),
                                 "_POOLSHIM_TEST_EVENTS_QUEUE": "8"})
    compare(args, native, shim)
    ex, d = exit_device(one_log(tmp))
    _, header, rows, _ = event_rows(tmp)
    expect_equal(len(rows), 8, "rows")
    expect_equal((ex["event_log_written"], ex["event_log_dropped"]), (8, 133), "written, dropped")
    expect_equal(ex["event_log_written"] + ex["event_log_dropped"], ex["pooled_allocs"] + d["frees"],
                 "written + dropped = every allocation and free")
    # The demo's first allocation is kept to the end, then each step allocates 7.
    expect_equal([r[2] for r in rows], ["allocate"] * 8, "the first 8 records, in order")


@case
def case_event_log_that_cannot_be_opened_warns_once_and_the_program_runs(tmp):
    args = [program("demo"), "3", "65536"]
    native = run(args, False, tmp)
    shim = run(args, True, tmp, {"POOLSHIM_EVENTS": os.path.join(tmp, "no-such-dir", "events.csv")})
    compare(args, native, shim)
    warning = (f"poolshim: warning: POOLSHIM_EVENTS: cannot open log {tmp}/no-such-dir/events.csv: "
               "No such file or directory; the event log stops\n")
    expect_equal("".join(l + "\n" for l in shim.err.splitlines() if l.startswith("poolshim")), warning,
                 "poolshim's stderr")
    records = one_log(tmp)
    expect_equal([w["message"] for w in records_of(records, "warning")], [warning[len("poolshim: warning: "):-1]],
                 "warning records")
    ex = exit_record(records)
    expect_equal(ex["event_log_written"], 0, "written")
    expect_equal(event_files(tmp), [], "event logs")



# ---- NVTX markers for Nsight Systems (issue 17, pool/nvtx_marks.h) --------------------------
# The test tool (tests/programs/nvtx_recorder.c) stands in for Nsight Systems' injection library
# and writes each call of the domain API: one line, tab-separated.

NVTX_COLORS = {"oom": "ffd32f2f", "trim": "ff388e3c", "fence": "fff9a825", "wait": "ff1976d2"}
NVTX_CATEGORIES = {"oom": 1, "trim": 2, "fence": 3, "wait": 4}
# What the shim's start() declares before its first marker: the domain, its categories, its strings.
NVTX_HEADER = (["create\tpoolshim", "category\tpoolshim\t1\tout of memory", "category\tpoolshim\t2\ttrim",
                "category\tpoolshim\t3\tfence", "category\tpoolshim\t4\twait"]
               + ["register\tpoolshim\t" + text for text in (
                   "fence: synchronizing cudaFree", "fence: free memory waits for a fence",
                   "fence: out-of-memory retry", "fence: idle trim", "fence: legacy stream handout",
                   "wait: free on another context's stream", "wait: oom record written",
                   "trim: idle", "trim: out-of-memory retry", "trim: out of memory")])


def nvtx_event(call, kind, message, payload):
    return f"{call}\tpoolshim\t{NVTX_CATEGORIES[kind]}\t{NVTX_COLORS[kind]}\t{message}\t{payload}"


def nvtx_range(kind, message, device=0):
    return [nvtx_event("push", kind, message, f"i32:{device}"), "pop\tpoolshim"]


def nvtx_trim(why, released, human):
    return nvtx_range("trim", f"trim: {why}") + [
        nvtx_event("mark", "trim", f"trim: {why}: device 0, {released} bytes ({human}) released", f"u64:{released}")]


def nvtx_oom(request, human, verdict):
    return [nvtx_event("mark", "oom", f"out of memory: device 0, {request} bytes ({human}) requested, verdict {verdict}",
                       f"u64:{request}")]


def nvtx_run(tmp, args, extra, injected=True):
    """`args` under the shim, with the test tool as NVTX's injection library or with none (and
    NVTX_RECORDER_FILE set either way): the result and the path of the tool's file."""
    env = base_env(extra)
    env.pop("NVTX_INJECTION64_PATH", None)  # a suite run under nsys must not change the case
    markers = os.path.join(tmp, "nvtx.tsv")
    env["NVTX_RECORDER_FILE"] = markers
    if injected:
        env["NVTX_INJECTION64_PATH"] = os.path.join(BUILD, "programs", "libnvtx_recorder.so")
    env = with_shim(env, os.path.join(BUILD, "libpoolshim.so"), os.path.join(tmp, "log-%p.jsonl"))
    return run_process(args, env), markers


def nvtx_lines(path, domain):
    expect(os.path.exists(path), f"no marker file {path}")
    with open(path) as f:
        return [line for line in f.read().splitlines() if line.split("\t")[1] == domain]


@case
def case_nvtx_marks_an_oom_its_retry_fence_and_its_trims(tmp):
    # oom_cases fragmentation: 32 blocks of 1 MiB, every other one freed (16 synchronizing
    # frees), then 2 MiB: the retry synchronizes and trims (nothing: each segment is half used),
    # the pool gives back what it can before the real cudaMalloc (nothing), and the application
    # gets the error. No log, so no wait for the oom record (its range is in the next case).
    shim, markers = nvtx_run(tmp, [program("oom_cases"), "fragmentation"],
                             {"CUDADOUBLE_MEM": "32M", "POOLSHIM_LOG": "", "POOLSHIM_FREE": "sync"})
    expect_equal((shim.rc, shim.out), (3, "allocation of 2097152 bytes failed after 32: cudaErrorMemoryAllocation\n"),
                 f"exit status and output\n{shim.describe()}")
    expect_equal(nvtx_lines(markers, "poolshim"),
                 NVTX_HEADER + nvtx_range("fence", "fence: synchronizing cudaFree") * 16
                 + nvtx_range("fence", "fence: out-of-memory retry")
                 + nvtx_trim("out-of-memory retry", 0, "0 B") + nvtx_trim("out of memory", 0, "0 B")
                 + nvtx_oom(2 * MiB, "2.0 MiB", "fragmentation"),
                 "the poolshim domain's calls")


@case
def case_nvtx_marks_idle_trims_and_the_oom_record_wait_beside_the_application_domain(tmp):
    # free_then_idle: 8 blocks of 4 MiB in two 20 MiB segments (no pages), 8 synchronizing
    # frees, 2 s idle: each idle trim halves the excess, so the first gives one segment back to
    # the pool and the pool 20 MiB to the device, the second the other. Then 2 GiB on a 1 GiB
    # device: no retry (hopeless), the trim before the real call releases nothing, the error is
    # marked and its record waited for (the log is open by then). The program's own NVTX copy
    # marks its domain through the same tool.
    shim, markers = nvtx_run(tmp, [program("free_then_idle"), "8", "2000", str(2 << 30)],
                             {"POOLSHIM_PAGE": "0", "POOLSHIM_IDLE_TRIM_MS": "100", "POOLSHIM_FREE": "sync"})
    expect_equal((shim.rc, shim.out), (3, "free_then_idle: 8 blocks of 4 MiB freed, idle 2000 ms\n"
                                          "allocation of 2147483648 bytes: cudaErrorMemoryAllocation\n"),
                 f"exit status and output\n{shim.describe()}")
    cache_return = nvtx_event("mark", "trim", f"cache return: device 0, {20 * MiB} bytes (20.0 MiB)", f"u64:{20 * MiB}")
    expect_equal(nvtx_lines(markers, "poolshim"),
                 NVTX_HEADER + nvtx_range("fence", "fence: synchronizing cudaFree") * 8
                 + [cache_return] + nvtx_trim("idle", 20 * MiB, "20.0 MiB")
                 + [cache_return] + nvtx_trim("idle", 20 * MiB, "20.0 MiB")
                 + nvtx_trim("out of memory", 0, "0 B") + nvtx_oom(2 << 30, "2.0 GiB", "exhausted")
                 + nvtx_range("wait", "wait: oom record written"),
                 "the poolshim domain's calls")
    expect_equal(nvtx_lines(markers, "free_then_idle"),
                 ["create\tfree_then_idle", "mark\tfree_then_idle\t0\t-\tfreed\t-",
                  "mark\tfree_then_idle\t0\t-\tidle over\t-"], "the application's own domain")
    # The markers tell what the log tells.
    records = one_log(tmp)
    _, d = exit_device(records)
    expect_equal((d["idle_trims"], d["idle_trimmed_bytes"], d["cache_returns"]), (2, 40 * MiB, 2),
                 "idle_trims, idle_trimmed_bytes, cache_returns")
    o = records_of(records, "oom")[0]
    expect_equal((o["request_bytes"], o["verdict"]), (2 << 30, "exhausted"), "the oom record")


@case
def case_idle_trims_give_back_a_paged_arenas_last_page(tmp):
    """An idle trim that gives back only pages of a paged arena (straight to the driver, 0 bytes
    from the pool's own trim) is still progress: the next ticks go on until nothing is held.
    (Before, it read as 'nothing left' and 20 MiB, one page, stayed reserved to the end.)"""
    shim = run([program("free_then_idle"), "8", "1500"], True, tmp,
               {"POOLSHIM_PAGE": "20M", "POOLSHIM_IDLE_TRIM_MS": "100", "POOLSHIM_FREE": "sync"})
    expect_equal((shim.rc, shim.out), (0, "free_then_idle: 8 blocks of 4 MiB freed, idle 1500 ms\n"), "run")
    records = one_log(tmp)
    _, d = exit_device(records)
    # 32 MiB of blocks in two pages of 20 MiB: each tick halves the excess, a page at a time.
    expect_equal(d["reserved_bytes_peak"], 40 * MiB, "reserved peak: two pages")
    expect_equal((d["reserved_bytes"], d["cached_bytes"], d["cache_returns"]), (0, 0, 2),
                 "reserved, cached and cache returns at exit")


@case
def case_nvtx_without_a_tool_writes_no_marker_and_changes_nothing(tmp):
    # NVTX's first call finds no NVTX_INJECTION64_PATH: nothing is loaded, nothing marked, and
    # the program, its exit status and the log's figures are those of a run with the tool.
    args = [program("oom_exit")]
    extra = {}
    native = run(args, False, tmp, extra)
    expect_equal((native.rc, native.out), (3, "allocation failed: cudaErrorMemoryAllocation\n"), "native run")
    figures = {}
    for injected in (False, True):
        folder = os.path.join(tmp, "tool" if injected else "none")
        os.makedirs(folder)
        shim, markers = nvtx_run(folder, args, extra, injected)
        compare(args, native, shim)
        expect_equal(os.path.exists(markers), injected, f"a marker file, tool {injected}")
        if injected:
            expect(nvtx_oom(2 << 30, "2.0 GiB", "exhausted")[0] in nvtx_lines(markers, "poolshim"), "the oom mark")
        records = one_log(folder)
        _, d = exit_device(records)
        o = records_of(records, "oom")[0]
        figures[injected] = (o["request_bytes"], o["verdict"], o["live_bytes"], d["ooms"], d["oom_retries"],
                             d["failed_allocs"], d["cache_misses"])
    expect_equal(figures[False], figures[True], "the log's figures without and with the tool")
    expect_equal(figures[False][:4], (2 << 30, "exhausted", MiB, 1), "request, verdict, live bytes, ooms")


def main():
    global BUILD
    parser = argparse.ArgumentParser()
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--build")
    parser.add_argument("case", nargs="?")
    args = parser.parse_args()
    if args.list:
        print("\n".join(CASES))
        return 0
    BUILD = os.path.realpath(args.build)
    if args.case not in CASES:
        print(f"unknown case {args.case!r}; cases: {', '.join(CASES)}")
        return 2
    with tempfile.TemporaryDirectory(prefix="poolshim-e2e-") as tmp:
        try:
            CASES[args.case](tmp)
        except Failure as e:
            print(f"FAILED {args.case}: {e}")
            return 1
        except subprocess.TimeoutExpired as e:
            print(f"FAILED {args.case}: timed out (a hang?): {e.cmd}")
            return 1
    print(f"passed {args.case}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
