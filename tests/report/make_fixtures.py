#!/usr/bin/env python3
"""Writes the synthetic fixture logs of tests/report/fixtures (deterministic; run it again after
changing it, and update the figures test_report.py expects).

    python3 tests/report/make_fixtures.py

The records have the shape of README.md "The log" (schema 1) with the fields being added:
`cap_bytes` in samples, exit devices and OOMs; OOM `verdict` exhausted/cap/fragmentation,
`site`, `largest`, `by_site`, `size_histogram`; exit `leaks.by_site` (and `stream`, `site` in
`leaks.largest`) and `oom_repeats`; per-device limits as `limit_<device>` in the start record's
`config` (with no `config_sources` entry). old_shape.jsonl and
old_shape_oom.jsonl are real logs of the library before those fields (the bundled demo, and
tests/programs/oom_exit, over the CPU test double), and real_cap_oom.jsonl one of the library
with them (oom_exit with POOLSHIM_LIMIT=512M POOLSHIM_BACKTRACE=8); they are not written here.
Nor are the real logs of schema 2, each with POOLSHIM_BACKTRACE=8 over the CPU test double
(LD_LIBRARY_PATH=build/double CUDADOUBLE_DEVICES=1 CUDADOUBLE_MEM=32M): vmm_keep.jsonl
(`vmm_alloc keep`: the application's own cuMemCreate memory, 8 MiB of it kept at exit),
observe_oom.jsonl (`oom_cases exhausted` with POOLSHIM_MODE=observe), pool_oom.jsonl
(`oom_cases exhausted` in pool mode) and, with CUDADOUBLE_MEM=64M, peak_sites.jsonl
(tests/programs/peak_sites: a peak sample and the exit record's peak consumers).
"""

import json
import os

HERE = os.path.dirname(os.path.realpath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
H200_TOTAL = 150_102_114_304  # 139.8 GiB

CONFIG_KEYS = ["enable", "log", "sample_ms", "release_threshold", "idle_trim_ms", "reuse_follow_event_deps",
               "reuse_opportunistic", "reuse_internal_deps", "free", "oom_retry", "limit", "backtrace", "prom_file",
               "verbose", "strict"]
CONFIG_DEFAULTS = {"enable": "1", "log": "poolshim-%p.jsonl", "sample_ms": "1000", "release_threshold": "0",
                   "idle_trim_ms": "5000", "reuse_follow_event_deps": "1", "reuse_opportunistic": "1",
                   "reuse_internal_deps": "0", "free": "sync", "oom_retry": "1", "limit": "0", "backtrace": "0",
                   "prom_file": "", "verbose": "0", "strict": "0"}

# ---- call sites ----------------------------------------------------------------------------

TORCH = "/opt/conda/lib/python3.11/site-packages/torch/lib/"
PY = "/opt/conda/bin/python3.11"
SOLVER = "/opt/solver/bin/solver"
CUDART = "/usr/local/cuda/lib64/libcudart.so.13"


def frame(module, offset, function=None, function_offset=None):
    return {"module": module, "offset": offset, "function": function,
            "function_offset": function_offset if function else None}


def torch_site(op, op_offset, py_offset):
    return [
        frame(TORCH + "libc10_cuda.so", 0x5F2A0,
              "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, "
              "unsigned long, CUstream_st*)", 0x1E0),
        frame(TORCH + "libtorch_cuda.so", 0x1A2B3C0 + op_offset,
              "at::native::" + op + "(c10::ArrayRef<long>, std::optional<c10::ScalarType>, "
              "std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, "
              "std::optional<c10::MemoryFormat>)", 0x94 + op_offset),
        frame(TORCH + "libtorch_cpu.so", 0x2C0FFE0, "at::_ops::empty_memory_format::call(c10::ArrayRef<c10::SymInt>, "
              "std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, "
              "std::optional<bool>, std::optional<c10::MemoryFormat>)", 0x5C),
        frame(PY, 0x1F5A10 + py_offset),
        frame(PY, 0x22B7C4),
    ]


SITE_WEIGHTS = torch_site("empty_cuda", 0, 0)
SITE_ACTIVATIONS = torch_site("empty_strided_cuda", 0x40, 0x120)
SITE_OPTIMIZER = torch_site("zeros_like_cuda", 0x88, 0x360)
SITE_STATS = [frame("/opt/app/lib/libmetrics.so", 0x8E10)]  # not symbolized: no function names

SITE_HALO = [
    frame(SOLVER, 0x41A2C, "Grid::allocate_halo(unsigned long)", 0x2C),
    frame(SOLVER, 0x43F10, "Solver::step(int)", 0x1D0),
    frame(SOLVER, 0x1F2E0, "main", 0x8A),
]
SITE_FIELDS = [
    frame(SOLVER, 0x40F88, "Field<double>::Field(Grid const&, unsigned long)", 0x48),
    frame(SOLVER, 0x4A000, "void std::vector<Field<double>, std::allocator<Field<double> > >::"
          "_M_realloc_insert<Field<double> const&>(__gnu_cxx::__normal_iterator<Field<double>*, "
          "std::vector<Field<double>, std::allocator<Field<double> > > >, Field<double> const&)", 0x7C),
    frame(SOLVER, 0x43C00, "Solver::setup()", 0x110),
    frame(SOLVER, 0x1F2E0, "main", 0x52),
]
SITE_SCRATCH_ASYNC = [
    frame(CUDART, 0x6B3D0, "cudaMallocAsync", 0x31),
    frame(SOLVER, 0x45A10, "Workspace::scratch(unsigned long, CUstream_st*)", 0x3C),
    frame(SOLVER, 0x43F10, "Solver::step(int)", 0x2A8),
    frame(SOLVER, 0x1F2E0, "main", 0x8A),
]
SITE_RESTART = [
    frame(SOLVER, 0x47000, "Checkpoint::stage(Field<double> const&)", 0x64),
    frame(SOLVER, 0x43F10, "Solver::step(int)", 0x3F0),
    frame(SOLVER, 0x1F2E0, "main", 0x8A),
]
SITE_NCCL = [
    frame("/usr/lib/x86_64-linux-gnu/libnccl.so.2", 0x1B2C40, "ncclCommInitRank", 0x4F2),
    frame(TORCH + "libtorch_cuda.so", 0x3B00010,
          "c10d::ProcessGroupNCCL::getNCCLComm(std::__cxx11::basic_string<char, std::char_traits<char>, "
          "std::allocator<char> > const&, c10::Device&, c10d::OpType, int, bool)", 0x3A0),
    frame(PY, 0x1F5A10),
]


# ---- a process -----------------------------------------------------------------------------

def pool_slack(reserved, used):
    return 0.0 if reserved == 0 or used >= reserved else round(1.0 - used / reserved, 9)


def rounding_waste(used, requested):
    return 0.0 if used == 0 or requested >= used else round(1.0 - requested / used, 9)


def histogram(sizes):
    h = {}
    for s in sizes:
        if s > 0:
            k = 1 << (s.bit_length() - 1)
            h[str(k)] = h.get(str(k), 0) + 1
    return dict(sorted(h.items(), key=lambda kv: int(kv[0])))


class Dev:
    def __init__(self, device, total=H200_TOTAL, cap=None, new_fields=True):
        self.device = device
        self.total = total
        self.cap = cap
        self.new_fields = new_fields
        self.reserved = self.used = self.requested = 0
        self.reserved_peak = self.used_peak = self.requested_peak = 0
        self.requested_total = 0
        self.live = []            # sizes of live allocations (requested bytes)
        self.live_peak = 0
        self.live_total = 0
        self.c = {k: 0 for k in ("allocs", "frees", "async_allocs", "async_frees", "ordered_frees", "app_pool_allocs",
                                 "passthrough_allocs", "passthrough_frees", "failed_allocs", "ooms", "oom_with_slack",
                                 "oom_retries", "oom_retry_successes", "fallback_allocs", "idle_trims",
                                 "idle_trimmed_bytes", "reset_dropped")}
        self.other_process_bytes = 0

    def set(self, reserved, used, live, churn=0, async_share=0.0, peak_extra=0):
        """Gauges now: `live` = sizes of the live allocations (their sum is `requested`); `churn`
        allocations made and freed since the last sample; `peak_extra` bytes of a short peak of
        used/requested between samples."""
        requested = sum(live)
        assert requested <= used <= reserved or reserved == 0, (requested, used, reserved)
        made = max(len(live) - len(self.live), 0) + churn
        freed = made - (len(live) - len(self.live))
        self.c["allocs"] += made
        self.c["frees"] += freed
        self.c["async_allocs"] += int(made * async_share)
        self.c["async_frees"] += int(freed * async_share)
        self.requested_total += sum(live[len(self.live):]) if len(live) > len(self.live) else 0
        self.requested_total += churn * (requested // max(len(live), 1))
        self.live_total += made
        self.reserved, self.used, self.requested, self.live = reserved, used, requested, list(live)
        self.reserved_peak = max(self.reserved_peak, reserved)
        self.used_peak = max(self.used_peak, used + peak_extra)
        self.requested_peak = max(self.requested_peak, requested + peak_extra)
        self.live_peak = max(self.live_peak, len(live))

    def row(self):
        r = {"device": self.device,
             "reserved_bytes": self.reserved, "reserved_bytes_peak": self.reserved_peak,
             "used_bytes": self.used, "used_bytes_peak": self.used_peak,
             "requested_bytes": self.requested, "requested_bytes_peak": self.requested_peak,
             "requested_bytes_total": self.requested_total,
             "live_allocs": len(self.live), "live_allocs_peak": self.live_peak, "live_allocs_total": self.live_total}
        r.update(self.c)
        r["pool_slack"] = pool_slack(self.reserved, self.used)
        r["rounding_waste"] = rounding_waste(self.used, self.requested)
        r["device_free"] = self.total - self.reserved - self.other_process_bytes - 512 * MiB
        r["device_total"] = self.total
        r["size_histogram"] = histogram(self.live)
        if self.new_fields:
            r["cap_bytes"] = self.cap
        return r


class Proc:
    def __init__(self, pid, host, rank, command, start_unix_s, config=None, sources=None, devices=(),
                 version="0.3.0", log=None):
        self.pid = pid
        self.host = host
        self.rank = rank
        self.command = command
        self.start_unix_s = start_unix_s
        self.config = dict(CONFIG_DEFAULTS, **(config or {}))
        self.sources = {k: "default" for k in CONFIG_KEYS}
        self.sources.update(sources or {})
        self.devices = {d.device: d for d in devices}
        self.version = version
        self.log = log or f"/scratch/logs/poolshim-{pid}.jsonl"
        self.records = []

    def rec(self, kind, t, **fields):
        r = {"schema": 1, "type": kind, "t": round(t, 6), "pid": self.pid}
        r.update(fields)
        self.records.append(r)
        return r

    def start(self, t, visible=None):
        visible = visible if visible is not None else sorted(self.devices)
        extra = {k: v for k, v in self.config.items() if k not in CONFIG_KEYS}   # limit_<device>
        return self.rec("start", t, version=self.version, host=self.host, rank=self.rank,
                        start_unix_s=self.start_unix_s, log=self.log, command_line=self.command,
                        config=dict({k: self.config[k] for k in CONFIG_KEYS}, **extra),
                        config_sources={k: self.sources[k] for k in CONFIG_KEYS},
                        devices=[{"device": d, "name": "NVIDIA H200", "total_bytes": H200_TOTAL} for d in visible])

    def sample(self, t, device):
        return self.rec("sample", t, **self.devices[device].row())

    def warning(self, t, message):
        return self.rec("warning", t, message=message)

    def oom(self, t, device, request, api, verdict, hint, site, largest, by_site, released=0, retried=True,
            stream=0):
        d = self.devices[device]
        d.c["ooms"] += 1
        d.c["failed_allocs"] += 1
        if verdict == "fragmentation":
            d.c["oom_with_slack"] += 1
        if retried:
            d.c["oom_retries"] += 1
        r = self.rec("oom", t, device=device, request_bytes=request, api=api, stream=stream,
                     device_free=d.total - d.reserved - d.other_process_bytes - 512 * MiB, device_total=d.total,
                     reserved_bytes=d.reserved, used_bytes=d.used, pool_unused_bytes=d.reserved - d.used,
                     released_bytes=released, live_bytes=d.requested, live_allocs=len(d.live), retried=retried,
                     verdict=verdict, hint=hint)
        if d.new_fields:
            r.update(cap_bytes=d.cap, site=site, largest=[dict({"device": device}, **a) for a in largest],
                     by_site=by_site, size_histogram=histogram(d.live))
        return r

    def exit(self, t, leaks, by_site, notes=(), paths=None, events_dropped=0, oom_repeats=0):
        for d in self.devices.values():
            self.sample(t - 0.004, d.device)
        rows = [d.row() for d in self.devices.values()]
        leaks = [dict({"device": l["device"], "bytes": l["bytes"], "age_s": l["age_s"], "async": l["async"],
                       "stream": l.get("stream", 0)}, site=l.get("site")) for l in leaks]
        leak_obj = {"count": len(leaks), "bytes": sum(l["bytes"] for l in leaks),
                    "largest": sorted(leaks, key=lambda l: -l["bytes"])[:10]}
        if by_site is not None:
            leak_obj["by_site"] = by_site
        return self.rec("exit", t, pooled_allocs=sum(d.c["allocs"] for d in self.devices.values()), devices=rows,
                        leaks=leak_obj, events_dropped=events_dropped, oom_repeats=oom_repeats,
                        paths=paths or {"runtime_hooks": sum(d.c["allocs"] + d.c["frees"] for d in self.devices.values()),
                                        "driver_hooks": 0, "dlsym": 1, "cuGetProcAddress": 19},
                        notes=list(notes))


def by_site(entries):
    """[(site, [sizes])] -> by_site rows, largest bytes first."""
    rows = [{"site": site, "count": len(sizes), "bytes": sum(sizes)} for site, sizes in entries]
    return sorted(rows, key=lambda r: -r["bytes"])


def write(name, records):
    with open(os.path.join(FIXTURES, name), "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


# ---- normal.jsonl: a training run, two devices, leaks by call site -------------------------

def normal():
    d0, d1 = Dev(0), Dev(1)
    p = Proc(4242, "gpu-node-07", "0", ["python3", "train.py", "--epochs", "3", "--batch-size", "64"],
             1796300000, config={"sample_ms": "500", "log": "/scratch/logs/poolshim-%p.jsonl",
                                 "backtrace": "8"},
             sources={"sample_ms": "environment", "log": "environment", "backtrace": "POOLSHIM_CONF"},
             devices=[d0, d1])
    p.start(0.021)
    p.warning(0.022, "POOLSHIM_RELEASE_THRESHOLD=2X: not a size (bytes with K/M/G/T, or % of device memory); using 0")
    weights = [256 * MiB, 256 * MiB]
    optim = [96 * MiB, 96 * MiB]
    stats = [63 * MiB + 512 * KiB]
    for i in range(1, 25):                                    # t = 0.5 .. 12.0
        t = 0.5 * i
        if i <= 4:                                             # warm-up: the pool grows
            reserved = [1024, 2048, 4096, 6144][i - 1] * MiB
            act = [128 * MiB] * (2 * i)
            live0 = weights + optim + act
            used0 = sum(live0) + 2 * MiB * len(live0) // 4
            d0.set(reserved, used0, live0, churn=40, async_share=0.25)
        elif i <= 20:                                          # steady training: a sawtooth
            k = (i - 5) % 4
            act = [160 * MiB] * (16 + 4 * k)
            live0 = weights + optim + stats + act
            used0 = sum(live0) + 4 * MiB * (k + 1)
            d0.set(6144 * MiB, used0, live0, churn=180, async_share=0.25, peak_extra=(12 * MiB if k == 3 else 0))
        else:                                                  # evaluation done, idle trims
            live0 = weights + optim + stats
            used0 = 768 * MiB
            reserved = {21: 6144, 22: 6144, 23: 3072, 24: 1536}[i] * MiB
            if i >= 23:
                d0.c["idle_trims"] += 1
                d0.c["idle_trimmed_bytes"] += d0.reserved - reserved
            d0.set(reserved, used0, live0, churn=8)
        p.sample(t, 0)
        if i >= 2:                                             # device 1: a smaller model shard
            if i <= 20:
                live1 = [64 * MiB] * (8 + (i % 3) * 2)
                d1.set(1536 * MiB, sum(live1) + 2 * MiB, live1, churn=60)
            else:
                d1.set(1536 * MiB, 0, [], churn=0)
            p.sample(t, 1)
    d0.c["passthrough_allocs"] = 3
    d0.c["passthrough_frees"] = 1
    leaks = [{"device": 0, "bytes": s, "age_s": round(12.3 - a, 3), "async": False, "site": site}
             for s, a, site in [(256 * MiB, 1.2, SITE_WEIGHTS), (256 * MiB, 1.2, SITE_WEIGHTS),
                                (96 * MiB, 2.4, SITE_OPTIMIZER), (96 * MiB, 2.4, SITE_OPTIMIZER),
                                (63 * MiB + 512 * KiB, 2.9, SITE_STATS)]]
    p.exit(12.32, leaks, by_site([(SITE_WEIGHTS, weights), (SITE_OPTIMIZER, optim), (SITE_STATS, stats)]))
    write("normal.jsonl", p.records)


# ---- ooms.jsonl: a cap, and one OOM of each verdict ----------------------------------------

def ooms():
    cap = 6 * GiB
    d0, d1 = Dev(0, cap=cap), Dev(1)
    d1.other_process_bytes = 120 * GiB                         # another job holds most of device 1
    p = Proc(5151, "gpu-node-03", "0", ["/opt/solver/bin/solver", "--grid", "4096", "--steps", "40"], 1796301000,
             config={"limit_0": str(6 * GiB), "backtrace": "16", "sample_ms": "250"},
             sources={"backtrace": "environment", "sample_ms": "environment"},
             devices=[d0, d1])
    p.start(0.004)
    fields = [512 * MiB] * 4
    halo = []
    scratch = []
    oom_cap = oom_frag = oom_exh = None
    for i in range(1, 33):                                     # t = 0.25 .. 8.0
        t = 0.25 * i
        if i <= 12:                                            # growing halos up to the cap
            halo = [256 * MiB] * min(i, 13)
            live = fields + halo
            used = sum(live) + 1 * MiB * len(live)
            reserved = min(cap, max(used + 256 * MiB, 1 * GiB))
            reserved = min(cap, -(-reserved // (256 * MiB)) * 256 * MiB)
            d0.set(reserved, used, live, churn=12, async_share=0.5)
        elif i <= 22:                                          # after the cap OOM: scratch buffers
            halo = [256 * MiB] * 6
            scratch = [320 * MiB] * (2 + (i % 3))
            live = fields + halo + scratch
            used = sum(live) + 20 * MiB
            d0.set(cap, used, live, churn=30, async_share=0.5)
        else:
            live = fields + [256 * MiB] * 2 + [320 * MiB]
            used = sum(live) + 2 * MiB
            d0.set(cap, used, live, churn=6, async_share=0.5)
        p.sample(t, 0)
        if i >= 4:
            n = min(4 + 2 * i, 32)
            live1 = [256 * MiB] * n
            d1.set(n * 256 * MiB + 256 * MiB, n * 256 * MiB, live1, churn=4)
            p.sample(t, 1)
        if i == 12:                                            # t = 3.0 .. 3.25: the cap
            largest = [{"bytes": 512 * MiB, "age_s": 2.91, "async": False, "stream": 0, "site": SITE_FIELDS}
                       for _ in range(4)] + \
                      [{"bytes": 256 * MiB, "age_s": round(2.9 - 0.25 * k, 2), "async": False, "stream": 0,
                        "site": SITE_HALO} for k in range(6)]
            oom_cap = p.oom(3.137, 0, 1536 * MiB, "cudaMalloc", "cap",
                            f"the cap (POOLSHIM_LIMIT, 6.0 GiB) leaves {(cap - d0.used) / MiB:.1f} MiB for a request of "
                            "1.5 GiB: this is the out-of-memory a device of that size would give; raise or unset the cap "
                            "to go on",
                            SITE_HALO, largest, by_site([(SITE_HALO, halo), (SITE_FIELDS, fields)]))
        if i == 22:                                            # t = 5.5 .. 5.75: fragmentation
            scratch = [320 * MiB, 96 * MiB, 96 * MiB]
            d0.set(cap, 3586 * MiB, fields + [256 * MiB] * 4 + scratch, churn=0, async_share=0.5)
            largest = [{"bytes": 512 * MiB, "age_s": 5.6, "async": False, "stream": 0, "site": SITE_FIELDS}
                       for _ in range(4)] + \
                      [{"bytes": 320 * MiB, "age_s": 0.41, "async": True, "stream": 94558331502592,
                        "site": SITE_SCRATCH_ASYNC}] + \
                      [{"bytes": 256 * MiB, "age_s": 3.1, "async": False, "stream": 0, "site": SITE_HALO}
                       for _ in range(4)] + \
                      [{"bytes": 96 * MiB, "age_s": 0.2, "async": True, "stream": 94558331502592,
                        "site": SITE_SCRATCH_ASYNC}]
            oom_frag = p.oom(5.612, 0, 2 * GiB, "cudaMallocAsync", "fragmentation",
                             "memory is free (2.5 GiB) but not in one piece of 2.0 GiB even after a trim: allocate "
                             "the largest buffers first and reuse them",
                             SITE_SCRATCH_ASYNC, largest,
                             by_site([(SITE_FIELDS, fields), (SITE_HALO, [256 * MiB] * 4),
                                      (SITE_SCRATCH_ASYNC, scratch)]),
                             stream=94558331502592)
        if i == 28:                                            # t = 7.0: device 1 exhausted
            largest = [{"bytes": 256 * MiB, "age_s": round(6.2 - 0.1 * k, 2), "async": False, "stream": 0,
                        "site": SITE_RESTART} for k in range(10)]
            oom_exh = p.oom(7.048, 1, 12 * GiB, "cudaMalloc", "exhausted",
                            f"the device is full ({d1.requested / GiB:.1f} GiB live in {len(d1.live)} pooled "
                            "allocations): reduce the working set or free buffers earlier",
                            SITE_RESTART, largest, by_site([(SITE_RESTART, d1.live)]))
    p.warning(3.138, "device 0: the pool reached its cap (POOLSHIM_LIMIT_0, 6.0 GiB): allocations beyond it fail")
    # Leaks: the fields and two halo buffers on device 0, nothing on device 1.
    d1.set(d1.reserved, 0, [], churn=0)
    d0.set(cap, 2 * GiB + 512 * MiB + 2 * MiB, fields + [256 * MiB] * 2, churn=0)
    leaks = [{"device": 0, "bytes": 512 * MiB, "age_s": 8.3, "async": False, "site": SITE_FIELDS} for _ in range(4)] + \
            [{"device": 0, "bytes": 256 * MiB, "age_s": 6.0, "async": False, "site": SITE_HALO} for _ in range(2)]
    p.exit(8.41, leaks, by_site([(SITE_FIELDS, fields), (SITE_HALO, [256 * MiB] * 2)]), oom_repeats=4)
    assert oom_cap and oom_frag and oom_exh
    # The warning was written at its time: keep records in the order of t within the file's
    # writer, as the library's background thread does (it writes in event order).
    records = sorted(p.records, key=lambda r: (r["type"] != "start", r["type"] == "exit", r["t"]))
    write("ooms.jsonl", records)


# ---- rank0.jsonl, rank1.jsonl: two ranks of one job ----------------------------------------

def ranks():
    out = {}
    for rank in (0, 1):
        mine = Dev(rank)
        devs = [mine]
        stray = None
        if rank == 1:
            stray = Dev(0)                                     # rank 1 also touches device 0
            devs = [stray, mine]
        p = Proc(7001 + rank, "node-a", str(rank), ["python3", "-m", "trainer", "--dist", "--nproc", "2"],
                 1796302000 + rank, config={"free": "ordered", "backtrace": "8"},
                 sources={"free": "environment", "backtrace": "environment"}, devices=devs)
        p.start(0.3 + 0.05 * rank, visible=[0, 1])
        comm = [48 * MiB, 16 * MiB]
        for i in range(1, 21):                                 # t = 1 .. 20
            t = float(i)
            peak_gib = 10 if rank == 0 else 12
            n = min(i, 8)
            act = [peak_gib * GiB // 10] * n if i <= 16 else []
            live = comm + act
            used = sum(live) + 2 * MiB * len(live)
            reserved = max(used, (peak_gib * GiB * min(i, 9)) // 9 if i < 9 else peak_gib * GiB)
            if i > 16:
                reserved = 2 * GiB
                mine.c["idle_trims"] += 1
            mine.set(reserved, used, live, churn=250 + 10 * rank, async_share=0.0)
            p.sample(t, rank)
            if stray is not None and i >= 3:
                stray.set(20 * MiB, 20 * MiB, [20 * MiB], churn=0)
                p.sample(t, 0)
        if rank == 1:
            p.warning(2.95, "cudaFree mode ordered: another device's context is active (device 0); frees on device 1 "
                            "synchronize as in mode sync")
        leaks = [{"device": rank, "bytes": s, "age_s": 19.5, "async": False, "site": SITE_NCCL} for s in comm]
        sites = [(SITE_NCCL, comm)]
        if rank == 1:
            leaks.append({"device": 0, "bytes": 20 * MiB, "age_s": 17.0, "async": False, "site": SITE_STATS})
            sites.append((SITE_STATS, [20 * MiB]))
        p.exit(20.5, leaks, by_site(sites))
        out[rank] = p.records
        write(f"rank{rank}.jsonl", p.records)
    return out


# ---- appended.jsonl: several processes appended into one file ------------------------------

def appended():
    a1, b = Dev(0), Dev(0)
    pa = Proc(3001, "ws-12", "0", ["./bench", "--size", "64M"], 1796303000, devices=[a1],
              config={"log": "bench.jsonl"}, sources={"log": "environment"}, log="/home/u/bench.jsonl")
    pb = Proc(3002, "ws-12", "0", ["./bench", "--size", "8G"], 1796303000, devices=[b],
              config={"log": "bench.jsonl"}, sources={"log": "environment"}, log="/home/u/bench.jsonl")
    pa.start(0.01)
    pb.start(0.012)
    for i in range(1, 5):
        a1.set(128 * MiB, 64 * MiB * (i % 2 + 1), [64 * MiB] * (i % 2 + 1), churn=100)
        pa.sample(i * 0.5, 0)
        b.set(8 * GiB, 8 * GiB, [8 * GiB], churn=0)
        pb.sample(i * 0.5 + 0.01, 0)
    pb.oom(2.2, 0, 8 * GiB, "cudaMalloc", "exhausted",
           "the device is full (8.0 GiB live in 1 pooled allocations): reduce the working set or free buffers earlier",
           None, [{"bytes": 8 * GiB, "age_s": 2.1, "async": False, "stream": 0, "site": None}],
           [{"site": None, "count": 1, "bytes": 8 * GiB}])
    a1.set(128 * MiB, 0, [], churn=0)
    pa.exit(2.5, [], [])
    # pb was killed: no exit record. Interleave the two processes' records by time.
    first = sorted(pa.records + pb.records, key=lambda r: r["t"])
    # Later, the same pid again (pid reuse), a second run appended to the same file.
    a2 = Dev(0)
    pc = Proc(3001, "ws-12", "0", ["./bench", "--size", "1G"], 1796303600, devices=[a2],
              config={"log": "bench.jsonl"}, sources={"log": "environment"}, log="/home/u/bench.jsonl")
    pc.start(0.009)
    for i in range(1, 4):
        a2.set(2 * GiB, 1 * GiB, [1 * GiB], churn=50)
        pc.sample(i * 0.5, 0)
    a2.set(2 * GiB, 0, [], churn=0)
    pc.exit(1.8, [], [])
    write("appended.jsonl", first + pc.records)


# ---- damaged and foreign logs --------------------------------------------------------------

def bad():
    lines = open(os.path.join(FIXTURES, "normal.jsonl"), encoding="utf-8").read().splitlines()
    broken = lines[:2] + [lines[2][:57]] + lines[3:6]   # line 3 cut in the middle: not JSON
    with open(os.path.join(FIXTURES, "malformed.jsonl"), "w", encoding="utf-8") as f:
        f.write("\n".join(broken) + "\n")
    foreign = [
        {"ts": "2026-12-02T15:28:20.120Z", "level": "info", "logger": "trainer", "msg": "starting epoch 1"},
        {"ts": "2026-12-02T15:28:21.480Z", "level": "info", "logger": "trainer", "msg": "loss 2.3017"},
        {"ts": "2026-12-02T15:28:22.902Z", "level": "warn", "logger": "trainer", "msg": "grad norm 41.2"},
    ]
    write("foreign.jsonl", foreign)
    open(os.path.join(FIXTURES, "empty.jsonl"), "w").close()


if __name__ == "__main__":
    os.makedirs(FIXTURES, exist_ok=True)
    normal()
    ooms()
    ranks()
    appended()
    bad()
    print("fixtures written to", FIXTURES)
