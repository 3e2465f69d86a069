#!/usr/bin/env python3
"""The benchmark suite of issue 6 (DESIGN §6.4), run by scripts/bench on a machine with an
NVIDIA GPU.

Builds the library, hot_path_bench, backtrace_bench and the call timer (scripts/build) while nvcc compiles the benchmark
programs (shared runtime), then runs every workload with each of its contenders side by side,
in rounds (round 1: A, B, C; round 2: A, B, C; ...), so that drift on a shared GPU hits every
contender alike. Prints a table (median, spread min-max, ratios from medians, the issue's
targets met or not) and writes OUT/bench.txt and OUT/bench.json (every raw run, the GPU, the
commit, the date). Shim runs of workloads 1-4 write a log holding only the exit record
(POOLSHIM_SAMPLE_MS=0: nothing is written while they are timed), so that every one of them is
checked to have pooled its allocations and the pool's peaks and cache counters can be shown.

    run_bench.py --build BUILD [--out DIR] [--quick] [--only NAME[,NAME]] [--no-build]

Workloads: churn, async, threads, torch, observability, observe; with churn or torch (or alone: --only
profile) a call profile runs them once more under the call timer (tests/perf/call_timer.cpp), to
show where their allocation time goes. The memory sections of issue 13 (memory_sections.py):
footprint (NVML peaks of GPT-2, torch_train.py and churn under every allocator) and capacity
(the largest GPT-2 batch within a 6 GB budget). Exit status 0 when every selected
workload ran (targets not met are no failure), 1 when one broke: a non-zero exit status, an
output line it could not parse, a shim run that pooled nothing, or PyTorch losses that differ.
"""

import argparse
import concurrent.futures
import dataclasses
import datetime
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from harness import (ROOT, Failure, clean_environment, exit_device, exit_record, logs_in, parse_fields,  # noqa: E402
                     poolshim_log, run_process, with_shim)
import bench_table as bt  # noqa: E402
import memory_sections  # noqa: E402

CUDA = os.environ.get("CUDA_HOME", "/usr/local/cuda")
PROGRAMS = {"churn_bench": "tests/bench/churn_bench.cu", "threads_bench": "tests/bench/threads_bench.cu"}
WORKLOADS = ("churn", "async", "threads", "torch", "observability", "observe")
NEEDS = {"churn": "churn_bench", "async": "churn_bench", "observability": "churn_bench", "observe": "churn_bench",
         "threads": "threads_bench",
         "profile": "churn_bench", "footprint": "churn_bench"}
# Sections that are not workloads of the table: --only profile runs the call profile alone;
# footprint and capacity (issue 13, tests/bench/memory_sections.py) run only when named.
SECTIONS = ("profile", "footprint", "capacity")
MiB = 1 << 20
DIRECT_POOL_NOTE = ("direct pool: cudaMallocFromPoolAsync on a pool the program creates as poolshim creates its own "
                    "(pinned device memory, release threshold UINT64_MAX, so it behaves as a warmed pool; reuse "
                    "following events and opportunistic, not through internal dependencies), without the shim")
# Per-device figures of the exit record kept with each shim run; the cache counters are newer
# than the others and are shown only when the library writes them.
POOL_FIELDS = ("allocs", "frees", "async_allocs", "async_frees", "ordered_frees", "passthrough_allocs",
               "passthrough_frees", "fallback_allocs", "failed_allocs", "reserved_bytes_peak", "used_bytes_peak",
               "cached_bytes", "cache_hits", "cache_misses", "legacy_reuses", "fences")


@dataclasses.dataclass
class Settings:
    rounds: int              # churn, async and the observability churn
    thread_rounds: int
    torch_rounds: int        # each PyTorch process spends 5-10 s starting
    churn_iterations: int
    churn_warmup: int
    async_iterations: int
    async_warmup: int
    thread_pairs: int        # per thread
    torch_steps: int
    torch_warmup: int
    observe_iterations: int  # long enough for several 100 ms samples under the shim
    gpt2_steps: int          # the footprint section's GPT-2 loop
    gpt2_warmup: int
    footprint_rounds: int
    footprint_torch_steps: int
    capacity_steps: int


FULL = Settings(rounds=5, thread_rounds=3, torch_rounds=3, churn_iterations=10000, churn_warmup=5000,
                async_iterations=50000, async_warmup=5000, thread_pairs=20000, torch_steps=60, torch_warmup=10,
                observe_iterations=300000, gpt2_steps=24, gpt2_warmup=4, footprint_rounds=2,
                footprint_torch_steps=30, capacity_steps=6)
QUICK = Settings(rounds=2, thread_rounds=1, torch_rounds=1, churn_iterations=1000, churn_warmup=100,
                 async_iterations=5000, async_warmup=500, thread_pairs=2000, torch_steps=8, torch_warmup=2,
                 observe_iterations=5000, gpt2_steps=6, gpt2_warmup=2, footprint_rounds=1,
                 footprint_torch_steps=8, capacity_steps=3)


class Broken(Exception):
    """A workload that cannot be measured: the run's output says why. `groups`: the groups it
    spoils (None: all of the workload's)."""

    def __init__(self, message, groups=None):
        super().__init__(message)
        self.groups = groups


@dataclasses.dataclass
class Run:
    """One contender of a workload: what each round runs once."""
    label: str
    contender: str
    argv: list
    env: dict              # on top of the clean environment
    parse: object          # Result -> [(group, {metric: value})]
    shim: bool = False
    peak_from: str = None  # "torch" (its max_memory_reserved), "log" (the pool's reserved peak), None: n/a
    losses: bool = False   # PyTorch: keep the loss lines; uncached runs must agree
    rounds: int = None     # takes part in rounds 1..rounds (None: all of the workload's)


@dataclasses.dataclass
class Workload:
    name: str
    groups: list
    runs: list
    rounds: int
    status: str = "not run"
    error: str = ""
    notes: list = dataclasses.field(default_factory=list)        # shown under the last group
    group_notes: dict = dataclasses.field(default_factory=dict)  # group -> notes shown under it
    broken_groups: set = dataclasses.field(default_factory=set)


# ---- parsing what the programs print -------------------------------------------------------------

def result_lines(text, prefix):
    return [line for line in text.splitlines() if line.startswith(prefix)]


def churn_parser(group):
    def parse(result):
        lines = result_lines(result.out, "churn_bench:")
        if len(lines) != 1:
            raise Broken(f"expected one 'churn_bench:' line, found {len(lines)}")
        return [(group, {"us_per_pair": float(parse_fields(lines[0])["us_per_pair"])})]
    return parse


def threads_parser(result):
    found = []
    for line in result_lines(result.out, "threads_bench:"):
        fields = parse_fields(line)
        found.append((bt.threads_group(int(fields["threads"])), {"mpairs_per_s": float(fields["mpairs_per_s"])}))
    wanted = [bt.threads_group(n) for n in bt.THREAD_COUNTS]
    if [g for g, _ in found] != wanted:
        raise Broken(f"expected one 'threads_bench:' line for each of {wanted}, found {[g for g, _ in found]}")
    return found


def torch_parser(group):
    def parse(result):
        fields = dict(line.split()[:2] for line in result.err.splitlines()
                      if line.startswith(("median_step_ms ", "max_reserved_mb ")))
        if "median_step_ms" not in fields:
            raise Broken("no 'median_step_ms' line on stderr")
        metrics = {"step_ms": float(fields["median_step_ms"])}
        if "max_reserved_mb" in fields:
            metrics["torch_max_reserved_mb"] = float(fields["max_reserved_mb"])
        return [(group, metrics)]
    return parse


# ---- the workloads -------------------------------------------------------------------------------

def shim_env(free="sync", log=True, **more):
    """A shim run's options. log=True: a log with the exit record only (no sampling while timed)."""
    env = {"POOLSHIM_FREE": free}
    if log:
        env["POOLSHIM_SAMPLE_MS"] = "0"
    else:
        env["POOLSHIM_LOG"] = ""
    env.update(more)
    return env


def make_workloads(s, bins, only):
    churn, threads = os.path.join(bins, "churn_bench"), os.path.join(bins, "threads_bench")
    torch_train = [sys.executable, os.path.join(ROOT, "tests", "gpu", "torch_train.py"), str(s.torch_steps),
                   str(s.torch_warmup)]
    churn_contenders = [bt.NATIVE, bt.SHIM_SYNC, bt.SHIM_ORDERED]
    out = []

    groups, runs = [], []
    for live, touch, name in ((64, "none", bt.CHURN_64), (64, "kernel", bt.CHURN_64_KERNEL),
                              (1, "none", bt.CHURN_1), (1, "kernel", bt.CHURN_1_KERNEL)):
        groups.append(bt.Group(name, "churn", "us_per_pair", "us per cudaMalloc+cudaFree pair, sizes 256 B-128 MiB"
                               + (", a kernel writes each new buffer" if touch == "kernel" else "")
                               + f", {s.churn_iterations} pairs timed after {s.churn_warmup} untimed",
                               bt.NATIVE, bt.BASE_OVER_THIS, churn_contenders))
        argv = [churn, "malloc", str(s.churn_iterations), str(live), str(128 * MiB), touch, str(s.churn_warmup)]
        runs += [Run(f"{name} / {bt.NATIVE}", bt.NATIVE, argv, {}, churn_parser(name)),
                 Run(f"{name} / {bt.SHIM_SYNC}", bt.SHIM_SYNC, argv, shim_env("sync"), churn_parser(name), shim=True),
                 Run(f"{name} / {bt.SHIM_ORDERED}", bt.SHIM_ORDERED, argv, shim_env("ordered"), churn_parser(name),
                     shim=True)]
    out.append(Workload("churn", groups, runs, s.rounds))

    def async_argv(api):
        return [churn, api, str(s.async_iterations), "64", str(128 * MiB), "none", str(s.async_warmup)]
    group = bt.Group(bt.ASYNC_64, "async", "us_per_pair",
                     "us per cudaMallocAsync+cudaFreeAsync pair, one non-blocking stream, 64 live, "
                     "sizes 256 B-128 MiB", bt.DIRECT_POOL, bt.THIS_OVER_BASE,
                     [bt.DIRECT_POOL, bt.SHIM_SYNC, bt.NATIVE_DEFAULT_POOL, bt.NATIVE_DEFAULT_POOL_KEEP], digits=3)
    parse = churn_parser(bt.ASYNC_64)
    out.append(Workload("async", [group], [
        Run(bt.DIRECT_POOL, bt.DIRECT_POOL, async_argv("pool"), {}, parse),
        Run(bt.SHIM_SYNC, bt.SHIM_SYNC, async_argv("async"), shim_env("sync"), parse, shim=True),
        Run(bt.NATIVE_DEFAULT_POOL, bt.NATIVE_DEFAULT_POOL, async_argv("async"), {}, parse),
        Run(bt.NATIVE_DEFAULT_POOL_KEEP, bt.NATIVE_DEFAULT_POOL_KEEP, async_argv("async_keep"), {}, parse)],
        s.rounds, notes=[DIRECT_POOL_NOTE, "native default pool, threshold max: the device's default pool with "
                         "its release threshold set to UINT64_MAX (it keeps what it reserved, like the others)"]))

    counts = ",".join(str(n) for n in bt.THREAD_COUNTS)
    thread_contenders = [bt.DIRECT_POOL, bt.SHIM_SYNC, bt.NATIVE_DEFAULT_POOL]
    groups = [bt.Group(bt.threads_group(n), "threads", "mpairs_per_s",
                       f"aggregate M pairs/s, {n} thread(s), each its own non-blocking stream, 16 live, "
                       f"sizes 256 B-4 MiB", bt.DIRECT_POOL, bt.THIS_OVER_BASE, thread_contenders, digits=3,
                       higher_is_better=True) for n in bt.THREAD_COUNTS]

    def threads_argv(api):
        return [threads, api, counts, str(s.thread_pairs), "16", str(4 * MiB)]
    out.append(Workload("threads", groups, [
        Run(bt.DIRECT_POOL, bt.DIRECT_POOL, threads_argv("pool"), {}, threads_parser),
        Run(bt.SHIM_SYNC, bt.SHIM_SYNC, threads_argv("async"), shim_env("sync"), threads_parser, shim=True),
        Run(bt.NATIVE_DEFAULT_POOL, bt.NATIVE_DEFAULT_POOL, threads_argv("async"), {}, threads_parser)],
        s.thread_rounds, notes=[DIRECT_POOL_NOTE + ", one for all threads",
                                f"{s.thread_pairs} pairs per thread, timed from the barrier to the last join"]))

    uncached = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    group = bt.Group(bt.TORCH, "torch", "step_ms", f"median ms per training step (tests/gpu/torch_train.py), {s.torch_steps} steps after {s.torch_warmup} warm-up",
                     bt.TORCH_CACHING, bt.THIS_OVER_BASE,
                     [bt.TORCH_CACHING, bt.TORCH_ASYNC_BACKEND, bt.TORCH_UNCACHED, bt.TORCH_UNCACHED_SYNC,
                      bt.TORCH_UNCACHED_ORDERED],
                     extras=(("peak_reserved_mb", "peak reserved MB", 0),))
    parse = torch_parser(bt.TORCH)
    out.append(Workload("torch", [group], [
        Run(bt.TORCH_CACHING, bt.TORCH_CACHING, torch_train, {}, parse, peak_from="torch", losses=True),
        Run(bt.TORCH_ASYNC_BACKEND, bt.TORCH_ASYNC_BACKEND, torch_train,
            {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, parse, peak_from="torch", losses=True),
        Run(bt.TORCH_UNCACHED, bt.TORCH_UNCACHED, torch_train, uncached, parse, losses=True),
        Run(bt.TORCH_UNCACHED_SYNC, bt.TORCH_UNCACHED_SYNC, torch_train, dict(uncached, **shim_env("sync")), parse,
            shim=True, peak_from="log", losses=True),
        Run(bt.TORCH_UNCACHED_ORDERED, bt.TORCH_UNCACHED_ORDERED, torch_train,
            dict(uncached, **shim_env("ordered")), parse, shim=True, peak_from="log", losses=True)],
        s.torch_rounds))

    observe = [bt.LOG_OFF, bt.LOG_100MS, bt.BACKTRACE_8, bt.EVENT_LOG]
    # The event log's file goes into the run's own folder ({folder}: see Bench.prepare).
    options = {bt.LOG_OFF: {"POOLSHIM_LOG": ""},
               bt.LOG_100MS: {"POOLSHIM_SAMPLE_MS": "100"},
               bt.BACKTRACE_8: {"POOLSHIM_LOG": "", "POOLSHIM_BACKTRACE": "8"},
               bt.EVENT_LOG: {"POOLSHIM_LOG": "", "POOLSHIM_EVENTS": "{folder}/events-%p.csv"}}
    groups = [bt.Group(bt.OBSERVE_CHURN, "observability", "us_per_pair",
                       "us per cudaMalloc+cudaFree pair under the shim (sync), 64 live; delta = us per allocation",
                       bt.LOG_OFF, bt.COST_PERCENT, observe, show_delta=True),
              bt.Group(bt.OBSERVE_TORCH, "observability", "step_ms",
                       "median ms per PyTorch step, uncached + shim ordered", bt.LOG_OFF, bt.COST_PERCENT, observe,
                       show_delta=True)]
    churn_argv = [churn, "malloc", str(s.observe_iterations), "64", str(128 * MiB), "none", str(s.churn_warmup)]
    runs = []
    for name in observe:
        runs.append(Run(f"churn / {name}", name, churn_argv, dict(options[name], POOLSHIM_FREE="sync"),
                        churn_parser(bt.OBSERVE_CHURN), shim=True, rounds=s.rounds))
    # PyTorch takes part in the first rounds only: each of its processes spends seconds starting.
    for name in observe:
        runs.append(Run(f"torch / {name}", name, torch_train, dict(uncached, POOLSHIM_FREE="ordered", **options[name]),
                        torch_parser(bt.OBSERVE_TORCH), shim=True, losses=True, rounds=s.torch_rounds))
    out.append(Workload("observability", groups, runs, max(s.rounds, s.torch_rounds)))

    # Observe mode's cost over the native run (issue 15): the same calls, each also tracked.
    contenders = [bt.NATIVE, bt.OBSERVE_MODE, bt.OBSERVE_MODE_BT]
    modes = {bt.NATIVE: None, bt.OBSERVE_MODE: {"POOLSHIM_MODE": "observe"},
             bt.OBSERVE_MODE_BT: {"POOLSHIM_MODE": "observe", "POOLSHIM_BACKTRACE": "8"}}
    groups = [bt.Group(bt.OBSERVE_MODE_CHURN, "observe", "us_per_pair",
                       "us per cudaMalloc+cudaFree pair, 64 live, every call native", bt.NATIVE, bt.COST_PERCENT,
                       contenders, show_delta=True),
              bt.Group(bt.OBSERVE_MODE_TORCH, "observe", "step_ms",
                       "median ms per PyTorch step, uncached (PYTORCH_NO_CUDA_MEMORY_CACHING=1)", bt.NATIVE,
                       bt.COST_PERCENT, contenders, show_delta=True)]
    churn_argv = [churn, "malloc", str(s.churn_iterations), "64", str(128 * MiB), "none", str(s.churn_warmup)]
    runs = [Run(f"churn / {name}", name, churn_argv, env or {}, churn_parser(bt.OBSERVE_MODE_CHURN),
                shim=env is not None, rounds=s.rounds) for name, env in modes.items()]
    runs += [Run(f"torch / {name}", name, torch_train, dict(uncached, **(env or {})),
                 torch_parser(bt.OBSERVE_MODE_TORCH), shim=env is not None, losses=True, rounds=s.torch_rounds)
             for name, env in modes.items()]
    out.append(Workload("observe", groups, runs, max(s.rounds, s.torch_rounds)))
    return [w for w in out if w.name in only]


# ---- running -------------------------------------------------------------------------------------

def slug(text):
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


class Bench:
    def __init__(self, args, settings):
        self.build = os.path.realpath(args.build)
        self.out = os.path.realpath(args.out)
        self.library = os.path.join(self.build, "libpoolshim.so")
        self.settings = settings
        self.started = time.time()
        self.runs = []      # every raw run, for bench.json
        self.samples = []   # one figure of one run each (bench_table)
        self.reference_losses = None  # the first uncached PyTorch run's
        self.root = ROOT
        self.slug = slug

    def progress(self, text):
        print(f"[{time.time() - self.started:6.1f} s] {text}", flush=True)

    def environment(self, extra):
        env = clean_environment()
        for name in ("PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_CUDA_ALLOC_CONF"):  # the contenders set these
            env.pop(name, None)
        paths = [os.path.join(CUDA, "lib64")] + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else [])
        env["LD_LIBRARY_PATH"] = ":".join(paths)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra)
        return env

    def pool_figures(self, folder):
        """The exit record's figures of the one process that pooled allocations (in observe mode,
        which pools none: that tracked them)."""
        def served(log):
            ex = exit_record(log)
            return ex["pooled_allocs"] > 0 or any(d.get("native_allocs", 0) > 0 or d.get("allocs", 0) > 0
                                                  for d in ex["devices"])
        try:
            logs = [poolshim_log.read_log(p) for p in logs_in(folder)]
            pooled = [log for log in logs if served(log)]
            if len(pooled) != 1:
                raise Broken(f"expected one log with pooled allocations in {folder}, found {len(pooled)} "
                             f"(of {len(logs)}): the shim did not serve this run")
            ex, device = exit_device(pooled[0])
        except (Failure, poolshim_log.LogError) as e:
            raise Broken(f"log in {folder}: {e}") from None
        figures = {k: device[k] for k in POOL_FIELDS if k in device}
        figures["pooled_allocs"] = ex["pooled_allocs"]
        figures["paths"] = ex.get("paths")
        return figures

    def prepare(self, folder, extra, shim, preload=()):
        """A run's own empty log folder and its environment: `extra` on top of the clean one,
        `preload` libraries in front, then the shim (logging into the folder) when `shim`."""
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        env = self.environment({k: v.replace("{folder}", folder) if isinstance(v, str) else v
                                for k, v in extra.items()})
        if shim:
            return with_shim(env, ":".join(list(preload) + [self.library]), os.path.join(folder, "log-%p.jsonl"))
        if preload:
            env["LD_PRELOAD"] = ":".join(preload)
        return env

    def execute(self, workload, run, round_number):
        folder = os.path.join(self.out, "logs", workload.name, f"r{round_number}-{slug(run.label)}")
        env = self.prepare(folder, run.env, run.shim)
        record = {"workload": workload.name, "label": run.label, "contender": run.contender, "round": round_number,
                  "argv": run.argv, "env": {k: v for k, v in run.env.items()}, "shim": run.shim}
        started = time.time()
        try:
            result = run_process(run.argv, env, timeout=600)
        except subprocess.TimeoutExpired:
            raise Broken(f"{run.label}: no result within 600 s") from None
        record.update(rc=result.rc, wall_s=round(time.time() - started, 3), stdout_tail=result.out[-4000:],
                      stderr_tail=result.err[-4000:])
        self.runs.append(record)
        if result.rc != 0:
            raise Broken(f"{run.label}: exit status {result.rc}\n{result.describe()[-3000:]}")
        try:
            figures = run.parse(result)
        except (KeyError, ValueError, IndexError) as e:
            raise Broken(f"{run.label}: cannot parse its output ({e!r})\n{result.describe()[-3000:]}") from None
        logged = run.shim and env.get("POOLSHIM_LOG") != ""
        if logged:
            record["pool"] = self.pool_figures(folder)
        for group, metrics in figures:
            if run.peak_from == "torch":
                metrics["peak_reserved_mb"] = metrics.get("torch_max_reserved_mb")
            elif run.peak_from == "log":
                metrics["peak_reserved_mb"] = record["pool"]["reserved_bytes_peak"] / MiB
            elif group == bt.TORCH:
                metrics["peak_reserved_mb"] = None  # uncached without the shim: nothing reserves
            for metric, value in metrics.items():
                self.samples.append({"group": group, "contender": run.contender, "metric": metric, "value": value,
                                     "round": round_number, "workload": workload.name})
        record["metrics"] = figures
        record["groups"] = [group for group, _ in figures]
        if run.losses:
            record["losses"] = [line for line in result.out.splitlines() if line.startswith("loss ")]
            expected = self.settings.torch_steps + self.settings.torch_warmup
            if len(record["losses"]) != expected:
                raise Broken(f"{run.label}: {len(record['losses'])} loss lines, expected {expected}")
        return record

    def describe(self, record):
        parts = []
        for group, metrics in record["metrics"]:
            shown = ", ".join(f"{k} {v:.3f}" for k, v in metrics.items()
                              if v is not None and k != "torch_max_reserved_mb")
            parts.append(f"{group}: {shown}" if len(record["metrics"]) > 1 else shown)
        pool = record.get("pool")
        if pool:
            parts.append(f"pooled {pool['pooled_allocs']}")
            if "cache_hits" in pool:
                parts.append(f"cache hits {pool['cache_hits']} misses {pool.get('cache_misses')}")
        return "; ".join(parts)

    def run_workload(self, workload):
        self.progress(f"{workload.name}: {len(workload.runs)} contender runs a round, {workload.rounds} rounds")
        workload.status = "running"
        try:
            for r in range(1, workload.rounds + 1):
                for run in workload.runs:
                    if run.rounds is not None and r > run.rounds:
                        continue
                    record = self.execute(workload, run, r)
                    self.progress(f"{workload.name} round {r}/{workload.rounds}: {run.label}: {self.describe(record)}")
            self.check_losses(workload)
            workload.status = "ok"
        except Broken as e:
            workload.status, workload.error = "BROKEN", str(e)
            workload.broken_groups = set(e.groups or [g.name for g in workload.groups])
            self.progress(f"{workload.name}: BROKEN: {e}")
        for group, note in self.pool_notes(workload):
            workload.group_notes.setdefault(group, []).append(note)

    def check_losses(self, workload):
        """Uncached PyTorch runs (with and without the shim, any free mode or log option) must
        print the same losses, bit for bit; the caching allocators' are compared for the record."""
        runs = [r for r in self.runs if r["workload"] == workload.name and "losses" in r]
        if not runs:
            return
        uncached = [r for r in runs if r["env"].get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"]
        if self.reference_losses is None and uncached:
            self.reference_losses = (uncached[0]["label"], uncached[0]["round"], uncached[0]["losses"])
        if self.reference_losses is None:
            return
        label, round_number, reference = self.reference_losses
        for r in uncached:
            if r["losses"] != reference:
                first = next(i for i, (a, b) in enumerate(zip(r["losses"], reference)) if a != b)
                raise Broken(f"LOSSES DIFFER: {r['label']} (round {r['round']}) from {label} (round {round_number}) "
                             f"at step {first}: {r['losses'][first]!r} vs {reference[first]!r}",
                             groups={g for run in runs for g in run["groups"]})
        others = [r for r in runs if r not in uncached]
        if others:
            same = all(r["losses"] == reference for r in others)
            workload.notes.append(f"uncached losses identical across {len(uncached)} runs; the caching allocators' "
                                  f"losses {'equal them too' if same else 'differ from them (allowed)'}")
        else:
            workload.notes.append(f"uncached losses identical across {len(uncached)} runs")

    def pool_notes(self, workload):
        """(group, note): what the last logged run of each shim contender says about the pool,
        under the (last) group that run measured."""
        notes = []
        seen = {}
        for r in self.runs:
            if r["workload"] == workload.name and r.get("pool") and r.get("groups"):
                seen[r["label"]] = (r["groups"][-1], r["contender"], r["pool"])
        for group, contender, pool in seen.values():
            notes.append((group, f"{contender}: {pool_summary(pool)}"))
        return notes


def pool_summary(pool):
    """One line of what a shim run's exit record says about its pool (Bench.pool_figures)."""
    text = (f"pooled {pool['pooled_allocs']}, passed through {pool.get('passthrough_allocs')}, "
            f"reserved peak {poolshim_log.fmt_bytes(pool.get('reserved_bytes_peak'))}")
    if pool.get("ordered_frees"):
        text += f", ordered frees {pool['ordered_frees']} of {pool.get('frees')}"
    if "cache_hits" in pool or "cached_bytes" in pool:
        text += (f"; cache hits {pool.get('cache_hits', '?')}, misses {pool.get('cache_misses', '?')}, "
                 f"cached {poolshim_log.fmt_bytes(pool.get('cached_bytes'))} at exit")
        if pool.get("legacy_reuses") or pool.get("fences"):
            text += f"; legacy-barrier reuses {pool.get('legacy_reuses')}, fences {pool.get('fences')}"
    return text


# ---- building ------------------------------------------------------------------------------------

# Only what the bench runs: the unit tests would double the build's time.
BUILD_TARGETS = ("poolshim", "hot_path_bench", "backtrace_bench", "call_timer")


def build(bench, args, programs):
    """The library (scripts/build) and the nvcc programs, all at once."""
    bins = os.path.join(bench.build, "bench-bin")
    os.makedirs(bins, exist_ok=True)
    library = None
    build_log = os.path.join(bench.out, "build.log")
    if not args.no_build:
        bench.progress("building libpoolshim.so, hot_path_bench, backtrace_bench and the call timer (scripts/build) and the "
                       "benchmark programs")
        with open(build_log, "w") as log:
            library = subprocess.Popen([os.path.join(ROOT, "scripts", "build"), "-DPOOLSHIM_TESTS=ON"], cwd=ROOT,
                                       env=dict(os.environ, POOLSHIM_BUILD_DIR=bench.build,
                                                POOLSHIM_BUILD_TARGETS=" ".join(BUILD_TARGETS)), stdout=log,
                                       stderr=subprocess.STDOUT)
    jobs = [[os.path.join(CUDA, "bin", "nvcc"), "-O2", "-std=c++17", "-arch=sm_90", "-cudart", "shared",
             "-Itests/programs", PROGRAMS[name], "-o", os.path.join(bins, name), "-lpthread"] for name in programs]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        done = list(pool.map(lambda cmd: subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True), jobs))
    failed = False
    for cmd, d in zip(jobs, done):
        if d.returncode != 0:
            print(d.stdout + d.stderr, flush=True)
            print(f"poolshim bench: nvcc failed: {' '.join(cmd)}", flush=True)
            failed = True
    if library is not None and library.wait() != 0:
        with open(build_log) as log:
            print(log.read()[-6000:], flush=True)
        print(f"poolshim bench: the library build failed (log above, whole log in {build_log})", flush=True)
        failed = True
    if not failed and not os.path.exists(bench.library):
        print(f"poolshim bench: no library at {bench.library}", flush=True)
        failed = True
    if failed:
        return None
    bench.progress(f"built {len(jobs)} benchmark programs" + ("" if args.no_build else " and the library"))
    return bins


def cpu_bench(bench, program, args, prefix, what, timeout):
    """Runs one of the CPU benchmarks the build made (no GPU involved) and keeps its result lines;
    None when it was not built, one failure line when it failed."""
    path = os.path.join(bench.build, "tests", program)
    if not os.path.exists(path):
        return None
    bench.progress(what)
    result = run_process([path] + [str(a) for a in args], clean_environment(), timeout)
    lines = result_lines(result.out, prefix)
    return lines if result.rc == 0 and lines else [f"{program} failed: {result.describe()[:400]}"]


def hot_path(bench, settings):
    """The Router's own cost per pair and its scaling on this machine's cores (no GPU involved):
    what bounds the threads workload once the driver is out of the hot path."""
    return cpu_bench(bench, "hot_path_bench", [settings.thread_pairs * 10, 16], "hot_path ",
                     "hot path: the Router alone over the CPU double, 1-16 threads", 300)


def backtrace_cost(bench):
    """One call-site capture (POOLSHIM_BACKTRACE) on this machine's CPU: glibc backtrace() as the shim
    called it before, the unwind it makes now, and a repeated site answered by the per-thread cache."""
    return cpu_bench(bench, "backtrace_bench", [200000], "depth=",
                     "backtrace: one call-site capture, 8 frames, at two stack depths", 120)


# ---- the call profile ----------------------------------------------------------------------------

TIMED_FUNCTIONS = ("cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cudaStreamSynchronize",
                   "cudaDeviceSynchronize")


def call_profile(bench, bins, s, only):
    """Where the allocation time of a run goes: churn (64 live) and the uncached PyTorch loop run
    once more, natively and under the shim in each free mode, with the call timer
    (tests/perf/call_timer.cpp) preloaded in front of everything. It times each runtime call
    the program makes, whatever answers it, over the timed part only (the programs reset it
    after their warm-up). Returns the section's lines."""
    timer = os.path.join(bench.build, "programs", "libcall_timer.so")
    if not os.path.exists(timer):
        return [f"no call timer at {timer}: not built"]
    cases = []
    if "churn" in only:
        argv = [os.path.join(bins, "churn_bench"), "malloc", str(s.churn_iterations), "64", str(128 * MiB), "none",
                str(s.churn_warmup)]
        cases += [(f"churn 64 live / {name}", argv, env, s.churn_iterations, "pair")
                  for name, env in ((bt.NATIVE, {}), (bt.SHIM_SYNC, shim_env("sync")),
                                    (bt.SHIM_ORDERED, shim_env("ordered")))]
    if "torch" in only:
        argv = [sys.executable, os.path.join(ROOT, "tests", "gpu", "torch_train.py"), str(s.torch_steps),
                str(s.torch_warmup)]
        uncached = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
        cases += [(f"torch / {name}", argv, dict(uncached, **env), s.torch_steps, "step")
                  for name, env in ((bt.TORCH_UNCACHED, {}), (bt.TORCH_UNCACHED_SYNC, shim_env("sync")),
                                    (bt.TORCH_UNCACHED_ORDERED, shim_env("ordered")),
                                    (bt.TORCH_UNCACHED_ORDERED + ", legacy_reuse 1",
                                     shim_env("ordered", POOLSHIM_LEGACY_REUSE="1")))]
    header = (f"{'run':<50} {'function':<22} {'calls/unit':>10} {'us/unit':>9} {'p50 us':>8} {'p99 us':>8} "
              f"{'>=10us calls/unit':>17} {'>=10us us/unit':>14}")
    lines = [header]
    for label, argv, env, units, unit in cases:
        shim = "POOLSHIM_FREE" in env
        folder = os.path.join(bench.out, "logs", "profile", slug(label))
        out = os.path.join(folder, "call_timer.txt")
        run_env = bench.prepare(folder, dict(env, CALL_TIMER_OUT=out), shim, preload=[timer])
        bench.progress(f"profile: {label}")
        try:
            result = run_process(argv, run_env, timeout=300)
        except subprocess.TimeoutExpired:
            lines.append(f"{label}: no result within 300 s")
            continue
        if result.rc != 0 or not os.path.exists(out):
            lines.append(f"{label}: exit status {result.rc}, no timer output: {result.describe()[-300:]}")
            continue
        with open(out) as f:
            timed = {fields["fn"]: fields for fields in (parse_fields(line) for line in f
                                                          if line.startswith("call_timer: "))}
        in_calls_us = 0.0
        for fn in TIMED_FUNCTIONS:
            if fn not in timed:
                continue
            t = timed[fn]
            in_calls_us += float(t["total_us"])
            lines.append(f"{label:<50} {fn:<22} {int(t['calls']) / units:>10.2f} {float(t['total_us']) / units:>9.2f} "
                         f"{float(t['p50_us']):>8.2f} {float(t['p99_us']):>8.2f} "
                         f"{int(t['slow_calls']) / units:>17.2f} {float(t['slow_us']) / units:>14.2f}")
        summary = f"{label:<50} all timed calls: {in_calls_us / units:.2f} us per {unit}"
        if shim:
            try:
                lines.append(f"{label:<50} pool: {pool_summary(bench.pool_figures(folder))}")
            except Broken as e:
                lines.append(f"{label:<50} pool: no figures ({e})")
        if unit == "step":
            mean = re.search(r"^mean_step_ms ([0-9.]+)", result.err, re.M)
            if mean:
                step_us = float(mean.group(1)) * 1000
                summary += f" of a mean step of {step_us / 1000:.2f} ms ({100 * in_calls_us / units / step_us:.1f}%)"
        lines.append(summary)
    return lines


# ---- the report ----------------------------------------------------------------------------------

def source_digest():
    """A digest of the library's sources (pool/, shim/): a copy of the tree made without its
    .git (as on a lent GPU machine) still names the code it measured. `python3
    tests/bench/run_bench.py --digest` prints it for the tree at hand."""
    digest = hashlib.sha256()
    for folder in ("pool", "shim"):
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            path = os.path.join(ROOT, folder, name)
            if os.path.isfile(path):
                digest.update(name.encode() + b"\0")
                with open(path, "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()[:12]


def command_output(args):
    try:
        done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=30)
        return done.stdout.strip() if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


SECTION_HEADINGS = (
    ("profile", "== call profile (tests/perf/call_timer.cpp preloaded in front): the timed part of each run once more; "
                "per timed pair (churn) or step (PyTorch): calls, microseconds inside each runtime function, "
                "median and 99th percentile of one call, and the calls of 10 us or more"),
    ("hot_path", "== hot path: the Router alone (tests/perf/hot_path.cpp): cudaMallocAsync/cudaFreeAsync cache hits "
                 "over the CPU driver double, no driver call, each thread its own stream, 16 live, 256 B-4 MiB"),
    ("footprint", "== footprint (issue 13): device memory as nvidia-smi sees it (NVML, the process's peak, sampled "
                  "every ms), the pool's reserved peak and the program's live peak; medians of interleaved rounds"),
    ("capacity", "== capacity (issue 13): the largest GPT-2 batch that trains within a fixed device-memory budget"),
    ("backtrace", "== call-site capture (tests/perf/backtrace_bench.cpp): ns per capture of 8 frames on this host's "
                  "CPU; old = glibc backtrace(n+16) as before, capture_frames = the unwind a new site costs, "
                  "capture_site_hit = a repeated site"),
)


def report(bench, workloads, facts):
    groups = [g for w in workloads for g in w.groups]
    rows = bt.all_rows(groups, bench.samples)
    broken = {g for w in workloads for g in w.broken_groups}
    verdicts = bt.evaluate_targets(bt.ISSUE_TARGETS, rows, broken)
    dirty = " (uncommitted changes)" if facts["dirty"] else ""
    lines = [f"poolshim bench: {facts['gpu']}, commit {facts['commit']}{dirty}, "
             f"library source {facts['library_source']}, "
             f"{facts['date_utc']}{', --quick' if facts['quick'] else ''}",
             "medians over rounds; spread = min-max of the rounds; ratios from medians", ""]
    for w in workloads:
        for i, g in enumerate(w.groups):
            status = f"{w.status}: {w.error.splitlines()[0]}" if g.name in w.broken_groups else None
            notes = w.group_notes.get(g.name, []) + (w.notes if i == len(w.groups) - 1 else [])
            lines.append(bt.render_group(g, [rows[(g.name, c)] for c in g.contenders], status, notes))
            lines.append("")
    for key, heading in SECTION_HEADINGS:
        if facts.get(key):
            lines.append(heading)
            lines += ["   " + line for line in facts[key]]
            lines.append("")
    lines.append(bt.render_targets(verdicts))
    text = "\n".join(lines) + "\n"
    result = dict(facts, settings=dataclasses.asdict(bench.settings),
                  workloads={w.name: {"status": w.status, "error": w.error, "rounds": w.rounds, "notes": w.notes,
                                      "group_notes": w.group_notes, "broken_groups": sorted(w.broken_groups)}
                             for w in workloads},
                  groups=[dataclasses.asdict(g) for g in groups], rows=list(rows.values()), targets=verdicts,
                  runs=bench.runs, samples=bench.samples, wall_s=round(time.time() - bench.started, 1))
    with open(os.path.join(bench.out, "bench.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(bench.out, "bench.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", required=True, help="build folder of the library (POOLSHIM_BUILD_DIR)")
    parser.add_argument("--out", help="where bench.txt, bench.json and the logs go (default BUILD/bench)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and iterations: a smoke run")
    parser.add_argument("--only", help="comma-separated workloads: " + ", ".join(WORKLOADS)
                        + " (the call profile runs with churn or torch; 'profile' runs it alone), and the "
                        "memory sections footprint and capacity (run only when named)")
    parser.add_argument("--no-build", action="store_true", help="use the library already in BUILD")
    parser.add_argument("--digest", action="store_true", help="print the library sources' digest and exit")
    if "--digest" in sys.argv[1:]:
        print(source_digest())
        return 0
    args = parser.parse_args()
    only = (WORKLOADS + ("footprint", "capacity") if not args.only
            else tuple(n.strip() for n in args.only.split(",") if n.strip()))
    unknown = [n for n in only if n not in WORKLOADS + SECTIONS]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS + SECTIONS)}")
    args.out = args.out or os.path.join(args.build, "bench")
    os.makedirs(args.out, exist_ok=True)
    settings = QUICK if args.quick else FULL
    bench = Bench(args, settings)
    gpu = command_output(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    facts = {"suite": "poolshim bench (issue 6)", "gpu": gpu or "unknown GPU",
             "commit": command_output(["git", "rev-parse", "HEAD"]) or "unknown",
             "dirty": bool(command_output(["git", "status", "--porcelain", "--untracked-files=no"])),
             "library_source": source_digest(),
             "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "host": socket.gethostname(), "quick": args.quick, "only": list(only)}
    bench.progress(f"GPU: {facts['gpu']}; workloads: {', '.join(only)}{' (quick)' if args.quick else ''}")
    bins = build(bench, args, sorted({NEEDS[n] for n in only if n in NEEDS}))
    if bins is None:
        return 1
    facts["build_s"] = round(time.time() - bench.started, 1)
    workloads = make_workloads(settings, bins, only)
    for w in workloads:
        bench.run_workload(w)
    if "footprint" in only:
        facts["footprint"], facts["footprint_raw"] = memory_sections.footprint(
            bench, bins, settings, shim_env, bench.pool_figures, Broken)
    if "capacity" in only:
        facts["capacity"], facts["capacity_raw"] = memory_sections.capacity(bench, settings, shim_env)
    if {"churn", "torch", "profile"} & set(only):
        facts["profile"] = call_profile(bench, bins, settings, ("churn", "torch") if "profile" in only else only)
    facts["hot_path"] = hot_path(bench, settings)
    facts["backtrace"] = backtrace_cost(bench)
    text = report(bench, workloads, facts)
    print("\n" + text, end="", flush=True)
    broken = [w.name for w in workloads if w.status != "ok"]
    print(f"poolshim bench: {time.time() - bench.started:.0f} s in all (build {facts['build_s']:.0f} s); "
          f"{os.path.join(bench.out, 'bench.txt')}, {os.path.join(bench.out, 'bench.json')}"
          + (f"; BROKEN: {', '.join(broken)}" if broken else ""), flush=True)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
