#!/usr/bin/env python3
"""Tests of scripts/poolshim-report (standard library only).

    python3 tests/report/test_report.py          # from the repository root (or anywhere)
    python3 tests/report/test_report.py -v

The fixtures are in tests/report/fixtures: synthetic logs written by make_fixtures.py (the
figures below follow from it), two real logs of the library before the new fields
(old_shape*.jsonl), one of the library with them (real_cap_oom.jsonl) and three of schema 2
(vmm_keep.jsonl, observe_oom.jsonl, pool_oom.jsonl; make_fixtures.py says how they were made).
The Chromium test is skipped, saying so, when neither `chromium` nor `chromium-browser` is on
PATH. tests/report/hostile holds one log per defect of issue 12
(written by make_hostile.py; HostileCorpus); Fuzz damages the fixtures with mutate.py, seeded
(REPORT_FUZZ_SEED and REPORT_FUZZ_COUNT change the seed and the number of logs, 500).
"""

import contextlib
import html.parser
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPTS = os.path.join(ROOT, "scripts")
TOOL = os.path.join(SCRIPTS, "poolshim-report")
FIXTURES = os.path.join(HERE, "fixtures")
HOSTILE = os.path.join(HERE, "hostile")
sys.path.insert(0, SCRIPTS)
sys.path.insert(0, HERE)

import mutate  # noqa: E402
import poolshim_log  # noqa: E402
from poolshim_report import cli, fmt, model  # noqa: E402

MiB = 1024 * 1024
GiB = 1024 * MiB


def fixture(name):
    return os.path.join(FIXTURES, name)


def run_tool(*args, timeout=120):
    # --no-lines: the fixtures name modules of the machine they were made on; whether addr2line
    # finds them here must not change the output (tests/e2e covers the line annotation).
    return subprocess.run([sys.executable, TOOL, "--no-lines"] + [str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def sections(output):
    """{header line: [lines]} of the summary's sections, in order (a list of pairs)."""
    out = []
    for line in output.splitlines():
        if line.startswith("== "):
            out.append((line, []))
        elif out:
            out[-1][1].append(line)
    return out


def cells(lines, label):
    """The cells (split at two or more spaces) of the first table row whose first cell is `label`."""
    for line in lines:
        parts = re.split(r"\s{2,}", line.strip())
        if parts and parts[0] == label:
            return parts[1:]
    raise AssertionError(f"no row {label!r} in:\n" + "\n".join(lines))


def owner_rows(lines):
    """{name: cells} of the rows under "memory by owner at the end" (indented by two more spaces)."""
    first = [line.strip() for line in lines].index("memory by owner at the end") + 1
    rows = {}
    for line in lines[first:]:
        if not line.startswith("    "):
            break
        parts = re.split(r"\s{2,}", line.strip())
        rows[parts[0]] = parts[1:]
    return rows


def write_temp(testcase, name, text, mode="w"):
    folder = tempfile.mkdtemp(prefix="poolshim-report-test-")
    testcase.addCleanup(shutil.rmtree, folder, True)
    path = os.path.join(folder, name)
    with open(path, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as f:
        f.write(text)
    return path


def open_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def lines_of(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def oom_with_vmm(testcase):
    """observe_oom.jsonl with VMM memory at its OOM: vmm_keep.jsonl's 8 MiB from make_physical."""
    records = lines_of(fixture("observe_oom.jsonl"))
    vmm = [r for r in lines_of(fixture("vmm_keep.jsonl")) if r["type"] == "exit"][0]["devices"][0]["vmm_by_site"]
    for r in records:
        if r["type"] == "oom":
            r.update(vmm_bytes=8 * MiB, vmm_by_site=vmm + [dict(vmm[0], bytes=MiB)], other_bytes=None)
    return write_temp(testcase, "oom_vmm.jsonl", "".join(json.dumps(r) + "\n" for r in records))


# ---- the terminal summary ------------------------------------------------------------------


class Summary(unittest.TestCase):
    def summary(self, *names, full=False):
        r = run_tool(*(["--full"] if full else []), *[fixture(n) for n in names])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        return r.stdout

    def test_normal_run_exact_figures(self):
        out = self.summary("normal.jsonl")
        (head, lines), = sections(out)
        self.assertEqual(head, "== pid 4242, rank 0, host gpu-node-07, poolshim 0.3.0")
        self.assertIn("  command  python3 train.py --epochs 3 --batch-size 64", lines)
        self.assertEqual(cells(lines, "ran"), ["12.3 s from 2026-12-03 12:13:20 UTC, 49 samples, exited normally"])
        self.assertEqual(cells(lines, "devices"), ["0: NVIDIA H200, 139.8 GiB; 1: NVIDIA H200, 139.8 GiB"])
        self.assertEqual(lines[5].split(), ["device", "0", "device", "1"])
        self.assertEqual(cells(lines, "peak reserved"), ["6.0 GiB", "1.5 GiB"])
        self.assertEqual(cells(lines, "peak used"), ["5.2 GiB", "770.0 MiB"])
        self.assertEqual(cells(lines, "peak requested"), ["5.1 GiB", "768.0 MiB"])
        self.assertEqual(cells(lines, "final reserved"), ["1.5 GiB", "1.5 GiB"])
        self.assertEqual(cells(lines, "final used"), ["768.0 MiB", "0 B"])
        self.assertEqual(cells(lines, "final requested"), ["767.5 MiB", "0 B"])
        self.assertEqual(cells(lines, "cap"), ["none", "none"])
        self.assertEqual(cells(lines, "pool slack (last/max/mean)"), ["50.0% / 87.5% / 40.5%", "100.0% / 100.0% / 66.6%"])
        # Device 1 has nothing live at the end: no rounding waste then, not 0.0%.
        self.assertEqual(cells(lines, "rounding waste (last/max/mean)"), ["0.1% / 0.3% / 0.2%", "- / 0.4% / 0.3%"])
        self.assertEqual(cells(lines, "allocations pooled"), ["3,141", "1,176"])
        self.assertEqual(cells(lines, "async"), ["775", "0"])
        self.assertEqual(cells(lines, "passed through"), ["3", "0"])
        self.assertEqual(cells(lines, "fallback (not pooled)"), ["0", "0"])
        self.assertEqual(cells(lines, "failed"), ["0", "0"])
        self.assertIn("  leaks at exit: 5 allocations, 767.5 MiB", lines)
        self.assertEqual(cells(lines, "512.0 MiB"), ["2", "NativeCachingAllocator::malloc (libc10_cuda.so) <- "
                                                          "native::empty_cuda (libtorch_cuda.so)"])
        self.assertEqual(cells(lines, "192.0 MiB"), ["2", "NativeCachingAllocator::malloc (libc10_cuda.so) <- "
                                                          "native::zeros_like_cuda (libtorch_cuda.so)"])
        self.assertEqual(cells(lines, "63.5 MiB"), ["1", "libmetrics.so+0x8e10"])
        self.assertIn("  warnings: 1", lines)
        self.assertIn("    t=0.022 s  POOLSHIM_RELEASE_THRESHOLD=2X: not a size (bytes with K/M/G/T, or % of device "
                      "memory); using 0", lines)
        self.assertNotIn("merged", out)

    def test_figures_match_the_log(self):
        """The peaks and final figures, recomputed here from the raw records."""
        records = lines_of(fixture("normal.jsonl"))
        out = self.summary("normal.jsonl")
        lines = sections(out)[0][1]
        exit_rec = [r for r in records if r["type"] == "exit"][0]
        for column, device in enumerate((0, 1)):
            rows = [r for r in records if r["type"] == "sample" and r["device"] == device]
            rows += [d for d in exit_rec["devices"] if d["device"] == device]
            for field in ("reserved_bytes", "used_bytes", "requested_bytes"):
                peak = max(max(r[field + "_peak"], r[field]) for r in rows)
                label = "peak " + field.split("_")[0]
                self.assertEqual(cells(lines, label)[column], fmt.fmt_bytes(peak), label)
                self.assertEqual(cells(lines, "final " + field.split("_")[0])[column], fmt.fmt_bytes(rows[-1][field]))
            samples = [r for r in records if r["type"] == "sample" and r["device"] == device]
            slack = [r["pool_slack"] for r in samples]
            want = f"{100 * rows[-1]['pool_slack']:.1f}% / {100 * max(slack):.1f}% / {100 * sum(slack) / len(slack):.1f}%"
            self.assertEqual(cells(lines, "pool slack (last/max/mean)")[column], want)
            self.assertEqual(cells(lines, "allocations pooled")[column], f"{rows[-1]['allocs']:,}")

    def test_ooms_of_each_verdict(self):
        out = self.summary("ooms.jsonl")
        lines = sections(out)[0][1]
        self.assertEqual(cells(lines, "cap"), ["6.0 GiB", "none"])
        self.assertEqual(cells(lines, "peak reserved"), ["6.0 GiB", "8.2 GiB"])
        self.assertEqual(cells(lines, "failed"), ["2", "1"])
        self.assertIn("  out of memory: 3 (exhausted 1, cap 1, fragmentation 1) + 4 repeats not logged", lines)
        self.assertEqual(cells(lines, "options"), ["sample_ms=250, backtrace=16, limit_0=6442450944 (6.0 GiB)"])
        self.assertEqual(cells(lines, "t=3.137 s"), ["device 0", "1.5 GiB", "cudaMalloc", "cap"])
        self.assertEqual(cells(lines, "t=5.612 s"), ["device 0", "2.0 GiB", "cudaMallocAsync", "fragmentation"])
        self.assertEqual(cells(lines, "t=7.048 s"), ["device 1", "12.0 GiB", "cudaMalloc", "exhausted"])
        text = "\n".join(lines)
        self.assertIn("      at    Grid::allocate_halo+0x2c (solver) <- Solver::step+0x1d0 (solver)", lines)
        # The first frame of this site is in libcudart: the one shown is the caller's.
        self.assertIn("      at    Workspace::scratch+0x3c (solver) <- Solver::step+0x2a8 (solver)", lines)
        self.assertIn("      at    Checkpoint::stage+0x64 (solver) <- Solver::step+0x3f0 (solver)", lines)
        self.assertIn("hint  the device is full (8.0 GiB live in 32 pooled allocations): reduce the working set", text)
        self.assertIn("hint  the cap (POOLSHIM_LIMIT, 6.0 GiB) leaves 1008.0 MiB for a request of 1.5 GiB", text)
        self.assertIn("hint  memory is free (2.5 GiB) but not in one piece of 2.0 GiB", text)
        self.assertIn("  leaks at exit: 6 allocations, 2.5 GiB", lines)
        self.assertEqual(cells(lines, "2.0 GiB"), ["4", "Field<...>::Field+0x48 (solver) <- "
                                                        "vector<...>::_M_realloc_insert<...>+0x7c (solver)"])

    def test_full_shows_whole_stacks_and_the_state_at_each_oom(self):
        out = self.summary("ooms.jsonl", full=True)
        self.assertIn("cudaMallocAsync+0x31 (libcudart.so.13)", out)
        self.assertIn("void std::vector<Field<double>, std::allocator<Field<double> > >::_M_realloc_insert<Field<double> "
                      "const&>(__gnu_cxx::__normal_iterator<Field<double>*, std::vector<Field<double>, "
                      "std::allocator<Field<double> > > >, Field<double> const&)+0x7c (solver)", out)
        self.assertIn("pool  reserved 5.5 GiB, used 5.0 GiB, unused 496.0 MiB, cap 6.0 GiB", out)
        self.assertRegex(out, r"live\s+3\.0 GiB in\s+12 at Grid::allocate_halo\+0x2c \(solver\)")
        self.assertIn("sizes >=256.0 MiB: 12, >=512.0 MiB: 4", out)
        self.assertGreater(len(out.splitlines()), len(self.summary("ooms.jsonl").splitlines()))

    def test_default_stays_within_40_lines_per_process(self):
        names = ["normal.jsonl", "ooms.jsonl", "rank0.jsonl", "rank1.jsonl", "appended.jsonl", "old_shape.jsonl",
                 "old_shape_oom.jsonl", "real_cap_oom.jsonl"]
        out = self.summary(*names)
        for head, lines in sections(out):
            if head.startswith("== merged"):
                continue
            while lines and not lines[-1]:
                lines = lines[:-1]
            self.assertLessEqual(len(lines) + 1, 40, head)

    def test_two_ranks_merged(self):
        out = self.summary("rank0.jsonl", "rank1.jsonl")
        heads = [h for h, _ in sections(out)]
        self.assertEqual(heads, [f"== pid 7001, rank 0, host node-a, poolshim 0.3.0  [log {fixture('rank0.jsonl')}]",
                                 f"== pid 7002, rank 1, host node-a, poolshim 0.3.0  [log {fixture('rank1.jsonl')}]",
                                 "== merged: 2 processes from 2 logs"])
        merged = sections(out)[2][1]
        self.assertEqual(cells(merged, "ranks"), ["0, 1"])
        self.assertEqual(cells(merged, "allocations"), ["10,221 pooled (0 async), 0 passed through, 0 fallback, 0 failed"])
        self.assertEqual(cells(merged, "leaks at exit"), ["5 allocations, 148.0 MiB"])
        rows = [re.split(r"\s{2,}", line.strip()) for line in merged]
        device_rows = [r for r in rows if len(r) == 11 and r[0] in ("0", "1")]
        self.assertEqual(device_rows, [
            ["0", "0", "node-a", "7001", "10.0 GiB", "8.1 GiB", "8.1 GiB", "2.0 GiB", "64.0 MiB", "5,010", "0"],
            ["0", "1", "node-a", "7002", "20.0 MiB", "20.0 MiB", "20.0 MiB", "20.0 MiB", "20.0 MiB", "1", "0"],
            ["1", "1", "node-a", "7002", "12.0 GiB", "9.7 GiB", "9.7 GiB", "2.0 GiB", "64.0 MiB", "5,210", "0"]])
        self.assertIn(["0", "2", "10.0 GiB (rank 0)", "20.0 MiB (rank 1)", "10.0 GiB", "0"], rows)
        self.assertIn(["1", "1", "12.0 GiB (rank 1)", "12.0 GiB (rank 1)", "12.0 GiB", "0"], rows)
        # The same NCCL call site leaked in both ranks: merged.
        self.assertIn(["128.0 MiB", "4", "2", "ncclCommInitRank (libnccl.so.2) <- "
                                             "ProcessGroupNCCL::getNCCLComm (libtorch_cuda.so)"], rows)
        self.assertIn(["20.0 MiB", "1", "1", "libmetrics.so+0x8e10"], rows)

    def test_several_processes_appended_to_one_file(self):
        out = self.summary("appended.jsonl")
        heads = [h for h, _ in sections(out)]
        self.assertEqual(heads, ["== pid 3001, rank 0, host ws-12, poolshim 0.3.0",
                                 "== pid 3002, rank 0, host ws-12, poolshim 0.3.0",
                                 "== pid 3001, rank 0, host ws-12, poolshim 0.3.0",
                                 "== merged: 3 processes from 1 log"])
        first, killed, again = (lines for _, lines in sections(out)[:3])
        self.assertEqual(cells(first, "command"), ["./bench --size 64M"])
        self.assertEqual(cells(again, "command"), ["./bench --size 1G"])
        self.assertEqual(cells(first, "peak reserved"), ["128.0 MiB"])
        self.assertEqual(cells(again, "peak reserved"), ["2.0 GiB"])
        # The log is from host ws-12, not this one: whether the process still runs cannot be told.
        self.assertEqual(cells(killed, "ended"), ["no exit record (other host: cannot tell), right after an "
                                                  "out-of-memory error"])
        self.assertIn("      at    (call site not recorded)", killed)
        self.assertEqual(cells(sections(out)[3][1], "leaks at exit"),
                         ["0 allocations, 0 B; 1 process without an exit record"])

    def test_old_shape_without_the_new_fields(self):
        out = self.summary("old_shape.jsonl")
        lines = sections(out)[0][1]
        self.assertEqual(cells(lines, "peak reserved"), ["84.0 MiB"])
        self.assertEqual(cells(lines, "peak used"), ["58.4 MiB"])
        self.assertEqual(cells(lines, "allocations pooled"), ["2,101"])
        self.assertEqual(cells(lines, "pool slack (last/max/mean)"), ["96.4% / 96.4% / 35.6%"])
        self.assertFalse(any(line.strip().startswith("cap ") for line in lines), "no cap row without cap_bytes")
        self.assertIn("  leaks at exit: 1 allocation, 3.0 MiB", lines)
        self.assertIn("    largest 3.0 MiB on device 0, age 3.4 s", lines)
        out = self.summary("old_shape_oom.jsonl")
        lines = sections(out)[0][1]
        self.assertEqual(cells(lines, "t=0.004 s"), ["device 0", "2.0 GiB", "cudaMalloc", "exhausted"])
        self.assertFalse(any(line.strip().startswith("at ") for line in lines), "no call site line without `site`")
        self.summary("old_shape.jsonl", "old_shape_oom.jsonl", full=True)

    def test_a_real_log_with_the_new_fields(self):
        """real_cap_oom.jsonl: the library under development (POOLSHIM_LIMIT=512M, POOLSHIM_BACKTRACE=8)
        running tests/programs/oom_exit over the CPU test double."""
        lines = sections(self.summary("real_cap_oom.jsonl"))[0][1]
        self.assertEqual(cells(lines, "cap"), ["512.0 MiB"])
        self.assertEqual(cells(lines, "t=0.006 s"), ["device 0", "667.6 MiB", "cudaMalloc", "cap"])
        self.assertIn("      at    main+0x6a (oom_exit) <- libc.so.6+0x27249", lines)
        self.assertEqual(cells(lines, "1.0 MiB"), ["1", "main+0x52 (oom_exit) <- libc.so.6+0x27249"])

    def test_the_peak_consumers_name_the_functions_that_held_the_peak(self):
        """peak_sites.jsonl: tests/programs/peak_sites (POOLSHIM_BACKTRACE=8, over the CPU test double):
        32 MiB held for 300 ms by load_weights (3 x 8 MiB) and make_activations (8 MiB)."""
        lines = sections(self.summary("peak_sites.jsonl"))[0][1]
        self.assertIn("  peak consumers on device 0: 32.0 MiB in 4 allocations at 0.080 s (requested peak 32.0 MiB)",
                      lines)
        self.assertEqual(cells(lines, "24.0 MiB"), ["3", "load_weights+0x2e (peak_sites) <- main+0xa (peak_sites)"])
        self.assertEqual(cells(lines, "8.0 MiB"), ["1", "make_activations+0x1f (peak_sites) <- main+0x13 (peak_sites)"])
        self.assertIn("    stack of the 24.0 MiB site:", sections(self.summary("peak_sites.jsonl", full=True))[0][1])

    def test_a_vmm_log_shows_memory_by_owner_and_the_vmm_call_sites(self):
        """vmm_keep.jsonl: three 8 MiB handles of cuMemCreate, one kept at exit (schema 2)."""
        lines = sections(self.summary("vmm_keep.jsonl"))[0][1]
        self.assertEqual(owner_rows(lines), {"pool reserved": ["0 B (peak 0 B)"], "passed through": ["0 B (peak 0 B)"],
                                             "VMM physical": ["8.0 MiB (peak 24.0 MiB)"], "other": ["0 B (peak 0 B)"]})
        self.assertIn("  VMM memory at exit on device 0: 8.0 MiB", lines)
        # GCC's clone suffixes and the anonymous namespace are left out of the one-line form.
        self.assertEqual(cells(lines, "8.0 MiB"), ["make_physical+0x19 (vmm_alloc) <- main+0x20b (vmm_alloc)"])
        self.assertEqual(cells(lines, "allocations pooled"), ["0"])

    def test_a_vmm_log_in_full_shows_mappings_calls_and_the_whole_stack(self):
        lines = sections(self.summary("vmm_keep.jsonl", full=True))[0][1]
        rows = owner_rows(lines)
        self.assertEqual(rows["VMM mapped"], ["8.0 MiB (peak 24.0 MiB)"])
        self.assertEqual(rows["VMM released, still mapped"], ["0 B (peak 8.0 MiB)"])
        self.assertEqual(rows["VMM creates/releases/maps/unmaps"], ["3 / 2 / 3 / 2"])
        stack = lines.index("    stack of the 8.0 MiB site:")
        self.assertEqual(lines[stack + 1:stack + 3], [
            "      (anonymous namespace)::make_physical((anonymous namespace)::Driver const&, unsigned long long*, "
            "unsigned long) [clone .constprop.0] [clone .isra.0]+0x19 (vmm_alloc)", "      main+0x20b (vmm_alloc)"])

    def test_observe_mode_says_so_and_shows_tracked_figures(self):
        """observe_oom.jsonl: POOLSHIM_MODE=observe, 4 MiB blocks until the 32 MiB device is full."""
        lines = sections(self.summary("observe_oom.jsonl"))[0][1]
        self.assertEqual(lines[0], "  observe mode: every allocation went to the real function; nothing was pooled")
        self.assertEqual(owner_rows(lines), {"tracked": ["32.0 MiB (peak 32.0 MiB)"],
                                             "VMM physical": ["0 B (peak 0 B)"], "other": ["0 B (peak 0 B)"]})
        self.assertEqual(cells(lines, "allocations tracked"), ["8"])
        self.assertEqual(cells(lines, "peak requested"), ["32.0 MiB"])
        labels = {re.split(r"\s{2,}", line.strip())[0] for line in lines}
        for pool_only in ("peak reserved", "final used", "pool slack (last/max/mean)", "rounding waste (last/max/mean)",
                          "fallback (not pooled)", "allocations pooled"):
            self.assertNotIn(pool_only, labels)
        self.assertEqual(cells(lines, "t=0.001 s"), ["device 0", "4.0 MiB", "cudaMalloc", "exhausted"])
        self.assertIn("      hint  the device is full (32.0 MiB live in 8 tracked allocations): reduce the working "
                      "set or free buffers earlier", lines)
        self.assertIn("      owner observe mode: 32.0 MiB in 8 tracked allocations, VMM 0 B, other 0 B", lines)
        self.assertIn("  leaks at exit: 8 allocations, 32.0 MiB", lines)

    def test_observe_mode_in_full_leaves_out_the_pool_state(self):
        lines = sections(self.summary("observe_oom.jsonl", full=True))[0][1]
        self.assertIn("      state cap none; device free 0 B of 32.0 MiB; live 32.0 MiB in 8", lines)
        self.assertFalse([line for line in lines if line.startswith("      pool  ")])
        labels = {re.split(r"\s{2,}", line.strip())[0] for line in lines}
        self.assertTrue({"frees tracked", "dropped by device reset"} <= labels)
        self.assertFalse({"frees pooled", "OOM retries (succeeded)", "idle trims (bytes)"} & labels)

    def test_a_pool_mode_oom_of_schema_2_names_who_held_the_memory(self):
        lines = sections(self.summary("pool_oom.jsonl"))[0][1]
        self.assertNotIn("observe mode", "\n".join(lines))
        self.assertIn("      owner pool mode: reserved 32.0 MiB, passed through 0 B, VMM 0 B, other 0 B", lines)
        self.assertEqual(owner_rows(lines)["pool reserved"], ["32.0 MiB (peak 32.0 MiB)"])
        self.assertEqual(cells(lines, "pool slack (last/max/mean)"), ["0.0% / 0.0% / 0.0%"])

    def test_an_oom_names_its_top_vmm_call_site(self):
        r = run_tool(oom_with_vmm(self))
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = sections(r.stdout)[0][1]
        self.assertIn("      owner observe mode: 32.0 MiB in 8 tracked allocations, VMM 8.0 MiB, other unknown", lines)
        self.assertEqual([line for line in lines if line.startswith("      vmm ")],
                         ["      vmm   8.0 MiB at make_physical+0x19 (vmm_alloc) <- main+0x20b (vmm_alloc)"])
        r = run_tool("--full", oom_with_vmm(self))
        self.assertEqual([line for line in r.stdout.splitlines() if line.startswith("      vmm ")],
                         ["      vmm   8.0 MiB at make_physical+0x19 (vmm_alloc) <- main+0x20b (vmm_alloc)",
                          "      vmm   1.0 MiB at make_physical+0x19 (vmm_alloc) <- main+0x20b (vmm_alloc)"])

    def test_observe_and_pool_runs_merged(self):
        out = self.summary("pool_oom.jsonl", "observe_oom.jsonl", "vmm_keep.jsonl")
        merged = sections(out)[3][1]
        self.assertEqual(cells(merged, "allocations"), ["8 pooled (0 async), 0 passed through, 0 fallback, 2 failed, "
                                                        "8 tracked in observe mode"])
        rows = [re.split(r"\s{2,}", line.strip()) for line in merged]
        pooled = {r[3]: r[9] for r in rows if len(r) == 11 and r[0] == "0"}
        observe_pid = str(lines_of(fixture("observe_oom.jsonl"))[0]["pid"])
        self.assertEqual(pooled.pop(observe_pid), "-")
        self.assertEqual(sorted(pooled.values()), ["0", "8"])
        self.assertIn(["8.0 MiB", "1", "make_physical+0x19 (vmm_alloc) <- main+0x20b (vmm_alloc)"], rows)

    def test_schema_2_logs_stay_within_40_lines_per_process(self):
        out = self.summary("vmm_keep.jsonl", "observe_oom.jsonl", "pool_oom.jsonl")
        for head, lines in sections(out)[:3]:
            self.assertLessEqual(len("\n".join(lines).rstrip("\n").splitlines()) + 1, 40, head)

    def test_output_into_a_closed_pipe(self):
        p = subprocess.Popen([sys.executable, TOOL, fixture("normal.jsonl"), fixture("ooms.jsonl")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
        p.stdout.readline()
        p.stdout.close()
        err = p.stderr.read().decode()
        p.wait(timeout=60)
        p.stderr.close()
        self.assertNotIn("Traceback", err)


# ---- bad input -----------------------------------------------------------------------------


class BadInput(unittest.TestCase):
    def fails(self, *args, status=2):
        r = run_tool(*args)
        self.assertEqual(r.returncode, status, r.stdout + r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertEqual(r.stdout, "")
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("poolshim-report: error: "), lines[0])
        return lines[0]

    def test_malformed_line_3(self):
        msg = self.fails(fixture("malformed.jsonl"))
        self.assertIn("malformed.jsonl:3: not JSON", msg)

    def test_foreign_json_log(self):
        self.assertIn("foreign.jsonl:1: not a poolshim record (no schema, type, t, pid)", self.fails(fixture("foreign.jsonl")))

    def test_empty_file(self):
        self.assertIn("empty.jsonl: empty: no poolshim records", self.fails(fixture("empty.jsonl")))

    def test_blank_lines_only(self):
        self.assertIn("empty: no poolshim records", self.fails(write_temp(self, "blank.jsonl", "\n  \n\n")))

    def test_missing_file(self):
        msg = self.fails(fixture("no-such-log.jsonl"))
        self.assertIn("no-such-log.jsonl: cannot read: No such file or directory", msg)

    def test_a_folder(self):
        self.assertIn("cannot read", self.fails(FIXTURES))

    def test_a_bad_log_among_good_ones(self):
        self.assertIn("malformed.jsonl:3:", self.fails(fixture("normal.jsonl"), fixture("malformed.jsonl")))

    def test_binary_file(self):
        path = write_temp(self, "binary.jsonl", b"\x7fELF\x02\x01\x01\x00\xff\xfe\n", mode="wb")
        self.assertIn("binary.jsonl:1: not UTF-8 text", self.fails(path))

    def test_newer_schema(self):
        path = write_temp(self, "v3.jsonl", '{"schema":3,"type":"start","t":0,"pid":1}\n')
        self.assertIn("v3.jsonl:1: schema 3; this tool reads schemas 1 and 2", self.fails(path))

    def test_a_field_of_the_wrong_type_names_its_line(self):
        with open(fixture("normal.jsonl"), encoding="utf-8") as f:
            good = f.read().splitlines()
        bad = json.loads(good[3])
        self.assertEqual(bad["type"], "sample")
        bad["device"] = "zero"
        path = write_temp(self, "typed.jsonl", "\n".join(good[:3] + ["", json.dumps(bad)] + good[4:]) + "\n")
        self.assertIn("typed.jsonl:5: bad sample record: device should be an integer, not 'zero'", self.fails(path))
        oom = [r for r in lines_of(fixture("ooms.jsonl")) if r["type"] == "oom"][0]
        oom["site"][1]["offset"] = "0x10"
        path = write_temp(self, "site.jsonl", json.dumps(oom) + "\n")
        self.assertIn("site.jsonl:1: bad oom record: site[1].offset should be an integer, not '0x10'", self.fails(path))
        path = write_temp(self, "t.jsonl", '{"schema":1,"type":"warning","t":"soon","pid":1,"message":"x"}\n')
        self.assertIn("t.jsonl:1: bad warning record: t should be a number", self.fails(path))

    def test_a_schema_2_field_of_the_wrong_type_names_its_line(self):
        records = lines_of(fixture("vmm_keep.jsonl"))
        self.assertEqual(records[2]["type"], "exit")
        records[2]["devices"][0]["vmm_by_site"][0]["bytes"] = "8M"
        path = write_temp(self, "vmm.jsonl", "".join(json.dumps(r) + "\n" for r in records))
        self.assertIn("vmm.jsonl:3: bad exit record: devices[0].vmm_by_site[0].bytes should be a number, not '8M'",
                      self.fails(path))
        # The launcher's summary (poolshim_log.summary_text) adds up the cache counters that this check passed.
        sample = dict(records[1], cache_hits="x")
        path = write_temp(self, "cache.jsonl", json.dumps(sample) + "\n")
        self.assertIn("cache.jsonl:1: bad sample record: cache_hits should be a number, not 'x'", self.fails(path))
        oom = [r for r in lines_of(fixture("observe_oom.jsonl")) if r["type"] == "oom"][0]
        oom["mode"] = 1
        path = write_temp(self, "mode.jsonl", json.dumps(oom) + "\n")
        self.assertIn("mode.jsonl:1: bad oom record: mode should be a string, not 1", self.fails(path))

    def test_unwritable_output(self):
        msg = self.fails("--html", os.path.join(FIXTURES, "no-such-folder", "r.html"), fixture("normal.jsonl"), status=1)
        self.assertIn("cannot write", msg)

    def test_an_output_over_a_log(self):
        path = write_temp(self, "run.jsonl", open_text(fixture("normal.jsonl")))
        msg = self.fails("--html", path, path)
        self.assertIn("refusing to overwrite", msg)
        self.assertEqual(open_text(path), open_text(fixture("normal.jsonl")))

    def test_usage(self):
        r = run_tool()
        self.assertEqual(r.returncode, 2)
        self.assertIn("usage: poolshim-report", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        r = run_tool("--bogus", fixture("normal.jsonl"))
        self.assertEqual(r.returncode, 2)
        self.assertNotIn("Traceback", r.stderr)

    def test_help(self):
        r = run_tool("--help")
        self.assertEqual(r.returncode, 0)
        for needle in ("--html FILE", "--perfetto FILE", "--full", "--align", "--quiet", "exit status:",
                       "self-contained", "pool slack", "rounding waste"):
            self.assertIn(needle, r.stdout)


# ---- the model ----------------------------------------------------------------------------


class Model(unittest.TestCase):
    def test_records_before_their_start_record_join_its_run(self):
        recs = [{"schema": 1, "type": "sample", "t": 0.001, "pid": 9, "device": 0},
                {"schema": 1, "type": "start", "t": 0.002, "pid": 9},
                {"schema": 1, "type": "exit", "t": 1.0, "pid": 9},
                {"schema": 1, "type": "start", "t": 0.002, "pid": 9},
                {"schema": 1, "type": "warning", "t": 0.5, "pid": 9, "message": "m"},
                {"schema": 1, "type": "warning", "t": 0.5, "pid": 10, "message": "m"}]
        runs = model.group_runs("x", recs)
        self.assertEqual([(r.pid, r.record_count, r.exit is not None) for r in runs],
                         [(9, 3, True), (9, 2, False), (10, 1, False)])

    def test_short_function_names(self):
        cases = {
            "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char)":
                "NativeCachingAllocator::malloc",
            "void std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>(int*, int const&)":
                "vector<...>::_M_realloc_insert<...>",
            "main": "main",
            "Solver::step(int) const": "Solver::step",
            "std::ostream::operator<<(int)": "std::ostream::operator<<(...)",
        }
        for name, want in cases.items():
            self.assertEqual(fmt.short_function(name), want)

    def test_site_text(self):
        site = [{"module": "/usr/local/cuda/lib64/libcudart.so.13", "offset": 1, "function": "cudaMalloc",
                 "function_offset": 4},
                {"module": "/app/bin/app", "offset": 0x1234, "function": None, "function_offset": None},
                {"module": "/app/bin/app", "offset": 0x99, "function": "main", "function_offset": 0x10}]
        self.assertEqual(fmt.site_text(site, callers=1), "app+0x1234 <- main+0x10 (app)")
        # The CUDA runtime linked into the program itself (nvcc's static runtime): skipped by name.
        static = [{"module": "/app/bin/app", "offset": 0x50, "function": "cudaMalloc", "function_offset": 0},
                  {"module": "/app/bin/app", "offset": 0x99, "function": "main", "function_offset": 0x10}]
        self.assertEqual(fmt.site_text(static), "main+0x10 (app)")
        self.assertEqual(fmt.site_text(None), "(call site not recorded)")
        self.assertEqual(fmt.site_text([]), "(no frames)")
        self.assertEqual(fmt.site_key(site), fmt.site_key(json.loads(json.dumps(site))))
        self.assertLessEqual(len(fmt.site_text(site * 20, callers=30, width=60)), 60)


    def test_short_function_names_of_clones_and_anonymous_namespaces(self):
        cases = {
            "(anonymous namespace)::make_physical((anonymous namespace)::Driver const&, unsigned long) "
            "[clone .constprop.0] [clone .isra.0]": "make_physical",
            "(anonymous namespace)::allocate_layer(unsigned long)": "allocate_layer",
            "ns::(anonymous namespace)::Arena::grow(int) [clone .cold]": "Arena::grow",
        }
        for name, want in cases.items():
            self.assertEqual(fmt.short_function(name), want)

    def test_who_held_the_memory_at_an_oom(self):
        self.assertIsNone(model.oom_owners_text({"device": 0, "reserved_bytes": 1}))   # schema 1
        self.assertEqual(model.oom_owners_text({"mode": "observe", "live_bytes": 4 * MiB, "live_allocs": 1,
                                                "vmm_bytes": 2 * MiB, "other_bytes": None}),
                         "observe mode: 4.0 MiB in 1 tracked allocation, VMM 2.0 MiB, other unknown")


# ---- the HTML page ---------------------------------------------------------------------------


class _Page(html.parser.HTMLParser):
    """The elements the tests look at: timelines with their polylines and markers, sections,
    tables, and every attribute that could load something."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.timelines = []
        self.sections = []
        self.tables = []
        self.loading_attrs = []
        self.scripts = 0
        self._svg = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        for name in ("src", "href", "xlink:href", "srcset", "poster", "data", "action", "formaction"):
            if name in a and not (name == "href" and (a[name] or "").startswith("#")):
                self.loading_attrs.append((tag, name, a[name]))
        if tag == "script":
            self.scripts += 1
        if tag == "section" and "process" in classes:
            self.sections.append(a)
        if tag == "table":
            self.tables.append(classes)
        if tag == "svg" and "timeline" in classes:
            self._svg = {"attrs": a, "series": {}, "ooms": []}
            self.timelines.append(self._svg)
        elif self._svg is not None:
            if tag == "polyline" and "series" in classes:
                name = [c for c in classes if c not in ("series", "off-scale")][0]
                self._svg["series"][name] = a.get("points") or ""
            if tag == "g" and "oom-marker" in classes:
                self._svg["ooms"].append(a)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag == "svg":
            self._svg = None

    def handle_endtag(self, tag):
        if tag == "svg":
            self._svg = None


def parse_points(text):
    points = []
    for pair in text.split():
        x, y = pair.split(",")
        points.append((float(x), float(y)))
    return points


class HtmlPage(unittest.TestCase):
    def page(self, *names, extra=()):
        folder = tempfile.mkdtemp(prefix="poolshim-report-test-")
        self.addCleanup(shutil.rmtree, folder, True)
        path = os.path.join(folder, "report.html")
        r = run_tool("--quiet", "--html", path, *extra, *[n if os.path.isabs(n) else fixture(n) for n in names])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        p = _Page()
        p.feed(text)
        p.close()
        return path, text, p

    def check_self_contained(self, text, page):
        self.assertNotIn("http://", text)
        self.assertNotIn("https://", text)
        self.assertNotRegex(text, r"(?i)url\s*\(")
        self.assertNotRegex(text, r"(?i)@import")
        self.assertEqual(page.loading_attrs, [])
        self.assertIn("Content-Security-Policy", text)

    def check_timeline(self, svg, series=("reserved", "used", "requested")):
        vb = [float(v) for v in svg["attrs"]["viewbox"].split()]
        for name in series:
            self.assertIn(name, svg["series"], f"no {name} polyline in {svg['attrs']}")
            points = parse_points(svg["series"][name])
            self.assertTrue(points, f"empty points for {name}")
            for x, y in points:
                self.assertTrue(vb[0] <= x <= vb[0] + vb[2] and vb[1] <= y <= vb[1] + vb[3], (name, x, y))
            xs = [x for x, _ in points]
            self.assertEqual(xs, sorted(xs), f"{name}: time goes backwards")

    def test_one_process_with_ooms_and_a_cap(self):
        _, text, page = self.page("ooms.jsonl")
        self.check_self_contained(text, page)
        self.assertEqual(len(page.sections), 1)
        self.assertEqual([(s["attrs"]["data-pid"], s["attrs"]["data-device"]) for s in page.timelines],
                         [("5151", "0"), ("5151", "1")])
        dev0, dev1 = page.timelines
        self.check_timeline(dev0, ("reserved", "used", "requested", "cap"))
        self.check_timeline(dev1)
        self.assertNotIn("cap", dev1["series"])
        self.assertEqual([o["data-verdict"] for o in dev0["ooms"]], ["cap", "fragmentation"])
        self.assertEqual([o["data-verdict"] for o in dev1["ooms"]], ["exhausted"])
        # the cap is a flat line at 6 GiB: one y for every point
        self.assertEqual(len({y for _, y in parse_points(dev0["series"]["cap"])}), 1)
        for cls in ("processes", "ooms", "leaks", "warnings"):
            self.assertIn(cls, [c for t in page.tables for c in t])
        for needle in ('<span class="verdict cap">cap</span>', '<span class="verdict fragmentation">fragmentation</span>',
                       '<span class="verdict exhausted">exhausted</span>',
                       "the device is full (8.0 GiB live in 32 pooled allocations)",
                       "Grid::allocate_halo+0x2c (solver) &lt;- Solver::step+0x1d0 (solver)",
                       "Field&lt;...&gt;::Field+0x48 (solver)", "cap 6.0 GiB",
                       "and 4 more of the same situations, not logged again"):
            self.assertIn(needle, text)

    def test_several_logs_one_page(self):
        _, text, page = self.page("rank0.jsonl", "rank1.jsonl", "normal.jsonl", "appended.jsonl", "old_shape.jsonl")
        self.check_self_contained(text, page)
        self.assertEqual([s["data-pid"] for s in page.sections], ["7001", "7002", "4242", "3001", "3002", "3001", "26662"])
        self.assertEqual(len({s["id"] for s in page.sections}), 7, "section ids are unique")
        self.assertEqual(len(page.timelines), 1 + 2 + 2 + 1 + 1 + 1 + 1)
        self.assertEqual(len({t["attrs"]["id"] for t in page.timelines}), len(page.timelines))
        for svg in page.timelines:
            self.check_timeline(svg)
        self.assertIn('class="merged"', text)
        self.assertIn("merged-devices", [c for t in page.tables for c in t])
        self.assertIn("merged-leaks", [c for t in page.tables for c in t])

    def test_the_overview_gives_an_observed_run_no_pool_figures(self):
        # Observe mode reserves nothing: "0 B" reserved would read as a figure; "-" as under pooled.
        _, text, _ = self.page("observe_oom.jsonl", "pool_oom.jsonl")
        table = re.search(r'<table class="processes">(.*?)</table>', text).group(1)
        rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)]
        observe_pid = str(lines_of(fixture("observe_oom.jsonl"))[0]["pid"])
        cells = {re.sub(r"<[^>]+>", "", row[0]): (row[5], row[6]) for row in rows if row}
        self.assertEqual(cells.pop(observe_pid), ("-", "-"))
        ((reserved, pooled),) = cells.values()
        self.assertNotEqual(reserved, "-")
        self.assertNotEqual(pooled, "-")

    def test_text_from_the_log_is_escaped(self):
        records = lines_of(fixture("ooms.jsonl"))
        records[0]["command_line"] = ["./evil", "</script><script>alert(1)</script>", "<b>x</b>"]
        records[0]["host"] = "<img src=x>"
        path = write_temp(self, "evil.jsonl", "".join(json.dumps(r) + "\n" for r in records))
        _, text, page = self.page(path)
        self.assertNotIn("<script>alert", text)
        self.assertNotIn("<img", text)
        self.assertEqual(page.scripts, 2)
        self.check_self_contained(text, page)

    def test_a_run_with_a_single_sample(self):
        _, text, page = self.page("old_shape_oom.jsonl")
        (svg,) = page.timelines
        self.check_timeline(svg)
        self.assertEqual([o["data-verdict"] for o in svg["ooms"]], ["exhausted"])


    def timeline_data(self, text):
        found = re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>', text)
        return json.loads(found.group(1))

    def test_a_short_run_draws_its_peak_sample_and_lists_the_peak_consumers(self):
        """peak_sites.jsonl ran 0.4 s: its curve is the peak sample at 0.080 s and the exit sample."""
        _, text, page = self.page("peak_sites.jsonl")
        self.check_self_contained(text, page)
        (svg,) = page.timelines
        self.check_timeline(svg)
        (data,) = self.timeline_data(text).values()
        self.assertEqual(data["requested"][:2], [32 * MiB, 0])
        self.assertIn(["peak-sites"], page.tables)
        for needle in ("Peak consumers on device 0 <span class=\"count\">32.0 MiB · 4 allocations at 0.080 s</span>",
                       "load_weights+0x2e (peak_sites) &lt;- main+0xa (peak_sites)",
                       "the requested peak was 32.0 MiB."):
            self.assertIn(needle, text)

    def test_a_vmm_log_draws_its_vmm_series_and_lists_the_vmm_call_sites(self):
        _, text, page = self.page("vmm_keep.jsonl")
        self.check_self_contained(text, page)
        (svg,) = page.timelines
        self.check_timeline(svg, ("reserved", "used", "requested", "vmm"))
        self.assertEqual(sorted(svg["series"]), ["requested", "reserved", "used", "vmm"])
        # 8 MiB at the exit sample and in the exit record, on an axis up to 10 MiB.
        self.assertEqual([y for _, y in parse_points(svg["series"]["vmm"])], [66.0, 66.0])
        (data,) = self.timeline_data(text).values()
        self.assertEqual(data["vmm"], [8 * MiB, 8 * MiB])
        self.assertIn(["figures", "owners"], page.tables)
        self.assertIn(["vmm-sites"], page.tables)
        for needle in ('<span class="key vmm"><i></i>VMM physical</span>',
                       "<tr><td>VMM physical</td><td class=num>8.0 MiB</td><td class=num>24.0 MiB</td></tr>",
                       "make_physical+0x19 (vmm_alloc) &lt;- main+0x20b (vmm_alloc)"):
            self.assertIn(needle, text)

    def test_an_oom_lists_its_vmm_call_sites(self):
        _, text, _ = self.page(oom_with_vmm(self))
        self.assertIn('<div class="holders"><span class="muted">VMM memory by call site:</span><ul><li>'
                      '<span class="amount">8.0 MiB</span><details class="site"><summary><code>make_physical+0x19 '
                      '(vmm_alloc)</code></summary>', text)

    def test_observe_mode_draws_tracked_bytes_and_no_pool_figures(self):
        _, text, page = self.page("observe_oom.jsonl")
        self.check_self_contained(text, page)
        (svg,) = page.timelines
        self.check_timeline(svg, ("requested", "native"))
        self.assertEqual(sorted(svg["series"]), ["native", "requested"])
        self.assertEqual([o["data-verdict"] for o in svg["ooms"]], ["exhausted"])
        (data,) = self.timeline_data(text).values()
        self.assertEqual(sorted(data), ["cap", "native", "plot", "requested", "t"])
        self.assertEqual(data["native"], [32 * MiB, 32 * MiB])   # the exit sample, then the exit record
        self.assertNotIn(["figures", "shares"], page.tables)
        for needle in ('<p class="mode observe">observe mode: every allocation went to the real function; nothing was '
                       'pooled</p>', "<tr><td>tracked</td><td class=num>8</td></tr>",
                       "<tr><td>tracked</td><td class=num>32.0 MiB</td><td class=num>32.0 MiB</td></tr>",
                       '<div class="muted small">device free 0 B</div>',
                       '<div class="muted small owners">observe mode: 32.0 MiB in 8 tracked allocations, VMM 0 B, '
                       'other 0 B</div>'):
            self.assertIn(needle, text)
        self.assertNotIn("<td>fallback</td>", text)


# ---- the Perfetto trace ----------------------------------------------------------------------


def trace_problems(trace):
    """What is wrong with a Chrome trace-event file in the JSON Object Format, as Perfetto's
    importer reads it: [] when nothing is."""
    problems = []
    if not isinstance(trace, dict):
        return ["the top level is not an object"]
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["traceEvents is not a list"]
    if "displayTimeUnit" in trace and trace["displayTimeUnit"] not in ("ms", "ns"):
        problems.append("displayTimeUnit is neither ms nor ns")

    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    for i, e in enumerate(events):
        where = f"event {i} ({e.get('ph') if isinstance(e, dict) else e!r})"
        if not isinstance(e, dict):
            problems.append(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if not isinstance(ph, str) or len(ph) != 1:
            problems.append(f"{where}: no one-letter ph")
            continue
        if not isinstance(e.get("name"), str) or not e["name"]:
            problems.append(f"{where}: no name")
        if not isinstance(e.get("pid"), int) or isinstance(e.get("pid"), bool) or not 0 <= e["pid"] < 2 ** 32:
            problems.append(f"{where}: pid is not an unsigned 32-bit integer")
        if "tid" in e and (not isinstance(e["tid"], int) or isinstance(e["tid"], bool)):
            problems.append(f"{where}: tid is not an integer")
        if ph != "M" or "ts" in e:
            if not number(e.get("ts")) or e["ts"] < 0:
                problems.append(f"{where}: ts is not a non-negative number")
        if "args" in e and not isinstance(e["args"], dict):
            problems.append(f"{where}: args is not an object")
        if ph == "C":
            args = e.get("args")
            if not isinstance(args, dict) or not args:
                problems.append(f"{where}: a counter without args")
            elif not all(number(v) for v in args.values()):
                problems.append(f"{where}: a counter arg is not a number")
        elif ph in ("i", "I"):
            if e.get("s", "t") not in ("g", "p", "t"):
                problems.append(f"{where}: s is not g, p or t")
            if e.get("s", "t") == "t" and "tid" not in e:
                problems.append(f"{where}: a thread-scoped instant without tid")
        elif ph == "M":
            name = e.get("name")
            if name in ("process_name", "thread_name"):
                if not isinstance((e.get("args") or {}).get("name"), str):
                    problems.append(f"{where}: {name} without args.name")
            elif name in ("process_sort_index", "thread_sort_index"):
                if not isinstance((e.get("args") or {}).get("sort_index"), int):
                    problems.append(f"{where}: {name} without an integer args.sort_index")
            else:
                problems.append(f"{where}: unknown metadata {name!r}")
        elif ph == "X":
            if not number(e.get("dur")) or e["dur"] < 0:
                problems.append(f"{where}: a complete event without dur")
        elif ph not in ("B", "E"):
            problems.append(f"{where}: phase {ph!r} is not one this tool writes")
    return problems


class PerfettoTrace(unittest.TestCase):
    def trace(self, *names, align=None):
        folder = tempfile.mkdtemp(prefix="poolshim-report-test-")
        self.addCleanup(shutil.rmtree, folder, True)
        path = os.path.join(folder, "trace.json")
        r = run_tool("-q", "--perfetto", path, *(["--align", align] if align else []), *[fixture(n) for n in names])
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    def test_the_schema_check_catches_mistakes(self):
        self.assertEqual(trace_problems([]), ["the top level is not an object"])
        bad = {"traceEvents": [{"ph": "C", "name": "c", "pid": 1, "ts": 1, "args": {"bytes": "many"}},
                               {"ph": "i", "name": "i", "pid": 1, "ts": -1, "s": "x"},
                               {"ph": "M", "name": "process_name", "pid": 1, "args": {}},
                               {"ph": "C", "pid": 1, "ts": 0, "args": {"v": 1}}]}
        self.assertEqual(len(trace_problems(bad)), 5, trace_problems(bad))

    def test_all_fixtures(self):
        trace = self.trace("normal.jsonl", "ooms.jsonl", "rank0.jsonl", "rank1.jsonl", "appended.jsonl",
                           "old_shape.jsonl", "old_shape_oom.jsonl")
        self.assertEqual(trace_problems(trace), [])
        self.assertEqual(trace["displayTimeUnit"], "ms")
        events = trace["traceEvents"]
        names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
        self.assertEqual(len(names), 9, "one trace process per run, pid reuse included")
        self.assertIn("pid 4242 rank 0 @gpu-node-07: python3 train.py --epochs 3 --batch-size 64", names.values())
        self.assertEqual(sum(1 for n in names.values() if n.startswith("pid 3001 ")), 2)

    def test_counters_and_ooms(self):
        events = self.trace("ooms.jsonl")["traceEvents"]
        counters = {e["name"] for e in events if e["ph"] == "C"}
        self.assertEqual(counters, {f"device {d} {s}" for d in (0, 1) for s in ("reserved", "used", "requested", "pool slack")}
                         | {"device 0 cap"})
        samples = [r for r in lines_of(fixture("ooms.jsonl")) if r["type"] == "sample" and r["device"] == 0]
        reserved = [e for e in events if e["ph"] == "C" and e["name"] == "device 0 reserved"]
        # A value is written when it changes (a counter holds it until the next one), and at the end.
        want = [r for i, r in enumerate(samples)
                if i == 0 or i == len(samples) - 1 or r["reserved_bytes"] != samples[i - 1]["reserved_bytes"]]
        self.assertEqual([e["args"]["bytes"] for e in reserved], [r["reserved_bytes"] for r in want])
        self.assertEqual([e["ts"] for e in reserved], [round(r["t"] * 1e6, 3) for r in want])
        self.assertLess(len(want), len(samples))
        used = [e["args"]["bytes"] for e in events if e["ph"] == "C" and e["name"] == "device 0 used"]
        self.assertEqual(max(used), max(r["used_bytes"] for r in samples))
        ooms = [e for e in events if e["ph"] == "i" and e.get("cat") == "oom"]
        self.assertEqual([(e["args"]["verdict"], e["args"]["request"], e["s"]) for e in ooms],
                         [("cap", "1.5 GiB", "p"), ("fragmentation", "2.0 GiB", "p"), ("exhausted", "12.0 GiB", "p")])
        self.assertTrue(all(e["args"]["hint"] for e in ooms))
        self.assertEqual(ooms[0]["args"]["site"].split(" <- ")[0], "Grid::allocate_halo+0x2c (solver)")
        self.assertEqual(ooms[0]["ts"], 3137000.0)

    def test_ranks_aligned_by_start_time(self):
        def first_counter(trace, pid):
            return min(e["ts"] for e in trace["traceEvents"] if e["ph"] == "C" and e["pid"] == pid)

        wall = self.trace("rank0.jsonl", "rank1.jsonl")
        self.assertEqual(first_counter(wall, 7001), 1e6)
        self.assertEqual(first_counter(wall, 7002), 2e6)      # started one second later
        zero = self.trace("rank0.jsonl", "rank1.jsonl", align="zero")
        self.assertEqual(first_counter(zero, 7002), 1e6)
        self.assertEqual(trace_problems(zero), [])

    def test_ranks_aligned_to_the_nanosecond_by_start_unix_ns(self):
        folder = tempfile.mkdtemp(prefix="poolshim-report-test-")
        self.addCleanup(shutil.rmtree, folder, True)
        logs = []
        for pid, ns in ((8001, 1796300000_100000000), (8002, 1796300000_350000000)):
            logs.append(os.path.join(folder, f"{pid}.jsonl"))
            with open(logs[-1], "w") as f:
                f.write(json.dumps({"schema": 2, "type": "start", "t": 0, "pid": pid, "start_unix_s": 1796300000,
                                    "start_unix_ns": ns}) + "\n")
                f.write(json.dumps({"schema": 2, "type": "sample", "t": 1, "pid": pid, "device": 0,
                                    "reserved_bytes": 1}) + "\n")
        path = os.path.join(folder, "trace.json")
        self.assertEqual(run_tool("-q", "--perfetto", path, *logs).returncode, 0)
        with open(path, encoding="utf-8") as f:
            events = json.load(f)["traceEvents"]
        first = {pid: min(e["ts"] for e in events if e["ph"] == "C" and e["pid"] == pid) for pid in (8001, 8002)}
        self.assertEqual(first, {8001: 1e6, 8002: 1.25e6})    # whole seconds alone: 1e6 both


    def test_a_vmm_log_has_a_vmm_counter_and_its_call_sites_at_exit(self):
        trace = self.trace("vmm_keep.jsonl")
        self.assertEqual(trace_problems(trace), [])
        events = trace["traceEvents"]
        counters = {e["name"]: e["args"] for e in events if e["ph"] == "C"}
        self.assertEqual(set(counters), {f"device 0 {s}" for s in ("reserved", "used", "requested", "pool slack",
                                                                   "cached", "cache hits", "VMM physical")})
        self.assertEqual((counters["device 0 cached"], counters["device 0 cache hits"]), ({"bytes": 0}, {"count": 0}))
        self.assertEqual(counters["device 0 VMM physical"], {"bytes": 8 * MiB})
        (exit_event,) = [e for e in events if e["name"] == "exit"]
        self.assertEqual(exit_event["args"]["vmm_by_site"],
                         ["device 0: 8.0 MiB: make_physical+0x19 (vmm_alloc) <- main+0x20b (vmm_alloc)"])

    def test_an_oom_has_its_vmm_call_sites(self):
        folder = tempfile.mkdtemp(prefix="poolshim-report-test-")
        self.addCleanup(shutil.rmtree, folder, True)
        path = os.path.join(folder, "trace.json")
        self.assertEqual(run_tool("-q", "--perfetto", path, oom_with_vmm(self)).returncode, 0)
        with open(path, encoding="utf-8") as f:
            (oom,) = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "oom"]
        self.assertEqual((oom["args"]["vmm"], "other" in oom["args"], oom["args"]["vmm_by_site"]),
                         ("8.0 MiB", False, ["8.0 MiB: make_physical+0x19 (vmm_alloc) <- main+0x20b (vmm_alloc)",
                                             "1.0 MiB: make_physical+0x19 (vmm_alloc) <- main+0x20b (vmm_alloc)"]))

    def test_observe_mode_has_native_and_no_pool_counters(self):
        trace = self.trace("observe_oom.jsonl")
        self.assertEqual(trace_problems(trace), [])
        events = trace["traceEvents"]
        self.assertEqual({e["name"]: e["args"] for e in events if e["ph"] == "C"},
                         {"device 0 requested": {"bytes": 32 * MiB}, "device 0 native": {"bytes": 32 * MiB}})
        (start,) = [e for e in events if e["name"] == "start"]
        self.assertEqual(start["args"]["mode"], "observe")
        (oom,) = [e for e in events if e.get("cat") == "oom"]
        self.assertEqual({k: oom["args"].get(k) for k in ("mode", "native", "vmm", "other", "reserved", "used")},
                         {"mode": "observe", "native": "32.0 MiB", "vmm": "0 B", "other": "0 B", "reserved": None,
                          "used": None})
        (oom,) = [e for e in self.trace("pool_oom.jsonl")["traceEvents"] if e.get("cat") == "oom"]
        self.assertEqual({k: oom["args"].get(k) for k in ("mode", "native", "reserved")},
                         {"mode": "pool", "native": "0 B", "reserved": "32.0 MiB"})


# ---- hostile logs -----------------------------------------------------------------------------


def hostile(name):
    return os.path.join(HOSTILE, name)


def run_all_outputs(testcase, path, *extra):
    """poolshim-report writing the summary, an HTML page and a Perfetto trace of `path` in one run:
    (the finished process, the page's path, the trace's path)."""
    folder = tempfile.mkdtemp(prefix="poolshim-report-test-")
    testcase.addCleanup(shutil.rmtree, folder, True)
    page, trace = os.path.join(folder, "report.html"), os.path.join(folder, "trace.json")
    return run_tool(*extra, "--html", page, "--perfetto", trace, path), page, trace


# What a terminal acts on (C0 controls but the line break, DEL, C1 controls) and what reorders
# or hides text (zero-width, bidirectional controls, line and paragraph separators).
TERMINAL_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")


def unsafe_characters(text):
    """The characters of `text` that a terminal would act on."""
    return TERMINAL_CONTROLS.findall(text)


class HostileCorpus(unittest.TestCase):
    """One log per defect of issue 12: those a reader must refuse, with the line and the reason,
    and those it must read and then render in every output."""

    REFUSED = {
        "integer_5000_digits.jsonl":
            (5, "leaks.largest[0].stream: 5000-digit integer out of range (poolshim writes -2^63 to 2^64-1)"),
        "reserved_bytes_400_digits.jsonl":
            (2, "reserved_bytes: 400-digit integer out of range (poolshim writes -2^63 to 2^64-1)"),
        "arrays_nested_5000_deep.jsonl": (3, "arrays or objects nested more than 32 deep"),
        "objects_nested_5000_deep.jsonl": (5, "arrays or objects nested more than 32 deep"),
        "arrays_nested_40_deep.jsonl": (3, "arrays or objects nested more than 32 deep"),
        "time_1e308.jsonl": (4, "bad sample record: t should be a number of seconds from 0 to 2^31, not 1e+308"),
        "age_1e308.jsonl":
            (5, "leaks.largest[0].age_s: number 1e+308 out of range (poolshim writes finite numbers within +-2^64)"),
        "pool_slack_nan.jsonl": (2, "pool_slack: NaN is not a number poolshim writes"),
        "lone_surrogate.jsonl": (3, "message: a lone UTF-16 surrogate (\\ud800) in a string: not Unicode text"),
        "lone_surrogate_in_a_key.jsonl":
            (1, "config['\\udc80']: a lone UTF-16 surrogate (\\udc80) in a string: not Unicode text"),
    }
    READ = ("exit_without_samples.jsonl", "figures_at_the_bounds.jsonl", "control_characters.jsonl",
            "warning_100_kb.jsonl")

    def test_the_corpus_is_what_make_hostile_writes(self):
        import make_hostile
        written = make_hostile.hostile_logs()
        self.assertEqual(sorted(written), sorted(list(self.REFUSED) + list(self.READ)))
        self.assertEqual(sorted(written), sorted(os.listdir(HOSTILE)))
        for name, text in written.items():
            with open(hostile(name), encoding="utf-8") as f:
                self.assertEqual(f.read(), text, name)

    def test_refused_with_file_line_and_why_in_every_output(self):
        for name, (line, why) in self.REFUSED.items():
            with self.subTest(name):
                path = hostile(name)
                r, page, trace = run_all_outputs(self, path)
                self.assertEqual((r.returncode, r.stdout), (2, ""))
                self.assertEqual(r.stderr, f"poolshim-report: error: {path}:{line}: {why}\n")
                self.assertFalse(os.path.exists(page) or os.path.exists(trace))
                # The launcher's summary reads logs the same way.
                with self.assertRaises(poolshim_log.LogError) as refused:
                    model.read_records(path)
                self.assertEqual(str(refused.exception), f"{path}:{line}: {why}")

    def check_read(self, name, *extra):
        r, page, trace = run_all_outputs(self, hostile(name), *extra)
        self.assertEqual((r.returncode, r.stderr.count("\n")), (0, 2), r.stderr)
        with open(trace, encoding="utf-8") as f:
            events = json.load(f)
        self.assertEqual(trace_problems(events), [])
        self.assertEqual(unsafe_characters(r.stdout), [])
        p = _Page()
        with open(page, encoding="utf-8") as f:
            p.feed(f.read())
        self.assertEqual(p.scripts, 2)
        for svg in p.timelines:
            HtmlPage.check_timeline(self, svg)
        return r.stdout, p, events["traceEvents"]

    def test_an_exit_record_without_samples_is_drawn_at_its_time(self):
        out, page, events = self.check_read("exit_without_samples.jsonl")
        lines = sections(out)[0][1]
        self.assertEqual(cells(lines, "ran"), ["1.2 s from 2026-12-03 12:13:20 UTC, 0 samples, exited normally"])
        self.assertEqual(cells(lines, "peak reserved"), ["8.0 MiB"])
        self.assertEqual(cells(lines, "final used"), ["2.0 MiB"])
        counters = {e["name"]: (e["ts"], e["args"]) for e in events if e["ph"] == "C"}
        self.assertEqual(counters, {"device 0 reserved": (1.2e6, {"bytes": 8 * MiB}),
                                    "device 0 used": (1.2e6, {"bytes": 2 * MiB}),
                                    "device 0 requested": (1.2e6, {"bytes": 2 * MiB}),
                                    "device 0 pool slack": (1.2e6, {"percent": 75.0})})
        (svg,) = page.timelines
        self.assertEqual({name: parse_points(points) for name, points in svg["series"].items()},
                         {"reserved": [(882.0, 66.0)], "used": [(882.0, 216.0)], "requested": [(882.0, 216.0)]})

    def test_figures_at_the_bounds_render_in_every_output(self):
        out, _, events = self.check_read("figures_at_the_bounds.jsonl", "--full")
        lines = sections(out)[0][1]
        self.assertEqual(cells(lines, "peak reserved"), ["16384.0 PiB"])
        self.assertEqual(cells(lines, "ran"), ["596523 h 14 min from 2106-02-07 06:28:16 UTC, 2 samples, exited normally"])
        self.assertIn("    large  1 x   2.0 MiB on device 0, age 18446744073709551616.0 s at Solver::step+0x40 (app)",
                      lines)
        self.assertEqual(max(e["ts"] for e in events if "ts" in e), 2 ** 31 * 1e6)

    def test_control_characters_are_escaped_in_the_terminal_summary(self):
        out, page, events = self.check_read("control_characters.jsonl")
        lines = out.splitlines()
        self.assertEqual(lines[0], "== pid 4100, rank 0, host node\\x1b[31m-1, poolshim 0.3.0")
        self.assertEqual(lines[1], "  command  './app\\x1b]0;owned\\x07' '--steps\\r\\x1b[2K10'")
        self.assertEqual(lines[3], "  devices  0: NVIDIA\\x08\\x08H100, 139.8 GiB")
        self.assertIn("    2.0 MiB      1  evil\\x1b[5m+0x40 (\\x9b31mlib.so)", lines)
        self.assertIn("    t=0.600 s  \\x1b[2J\\x1b[Hscreen cleared\\x07 and \\u202eright-to-left", lines)
        self.assertEqual(lines[-1], "  note: note\\nwith a line break")
        # The trace keeps the text, as JSON escapes (its file is plain ASCII).
        names = [e["args"]["name"] for e in events if e["name"] == "process_name"]
        self.assertEqual(names, ["pid 4100 rank 0 @node\x1b[31m-1: './app\x1b]0;owned\x07' '--steps\r\x1b[2K10'"])
        self.assertEqual([e["args"]["message"] for e in events if e["name"] == "warning"],
                         ["\x1b[2J\x1b[Hscreen cleared\x07 and \u202eright-to-left"])

    def test_a_100_kb_warning_is_cut_in_the_terminal_summary(self):
        out, _, events = self.check_read("warning_100_kb.jsonl")
        lines = sections(out)[0][1]
        first = lines.index("  warnings: 1") + 1
        shown = lines[first:first + 10]
        self.assertEqual(lines[first + 10:], [])
        self.assertTrue(shown[0].startswith("    t=0.600 s  "))
        self.assertEqual("".join(line[15:] for line in shown),
                         "0123456789" * 100 + "... [99,000 more characters]")
        # The page and the trace have room for all of it.
        self.assertEqual([len(e["args"]["message"]) for e in events if e["name"] == "warning"], [100_000])


class TerminalText(unittest.TestCase):
    def test_control_characters_are_escaped_and_long_text_cut(self):
        self.assertEqual(poolshim_log.terminal_text("a\x1b[0m\tb\r\n\x00\x7f\x9b\u200b\u202e\U000e0041 é ü 日本"),
                         "a\\x1b[0m\\tb\\r\\n\\x00\\x7f\\x9b\\u200b\\u202e\\U000e0041 é ü 日本")
        self.assertEqual(poolshim_log.terminal_text("abcdef", limit=4), "abcd... [2 more characters]")


class LauncherSummary(unittest.TestCase):
    """poolshim_log's summary for the launcher (scripts/poolshim) and its choice of records."""

    def test_records_missing_fields_are_summarized_with_question_marks(self):
        records = [{"schema": 1, "type": "start", "t": 0, "pid": 7},
                   {"schema": 1, "type": "sample", "t": 1, "pid": 7, "device": 0},
                   {"schema": 1, "type": "oom", "t": 2, "pid": 7, "device": 0},
                   {"schema": 1, "type": "exit", "t": 3, "pid": 7, "leaks": {"count": 2, "largest": [{}]}}]
        self.assertEqual(poolshim_log.summary_text("run.jsonl", records).splitlines(), [
            "poolshim: pid 7 (), log run.jsonl",
            "  device 0 (?): ? allocations pooled (? async), ? freed; ? allocations and ? frees passed through",
            "    peak reserved ?, peak used ?, peak requested ?",
            "    pool slack ? of reserved at the end; rounding waste ?",
            "    out of memory: ? (? with enough unused pool memory), retried after a trim ? (? succeeded)",
            "  leaks at exit: 2 allocations, ? (largest ? on device ?, age ? s)",
            "  OOM at t=2.000s on device 0: ? requested, verdict ?: ?"])

    def test_text_from_the_log_is_escaped_and_cut(self):
        records = [{"schema": 1, "type": "start", "t": 0, "pid": 7, "command_line": ["./a\x1b[2J", "x" * 2000]},
                   {"schema": 1, "type": "exit", "t": 3, "pid": 7, "notes": ["\rdone\x07"]}]
        self.assertEqual(poolshim_log.summary_text("run\x1b.jsonl", records).splitlines(), [
            "poolshim: pid 7 (./a\\x1b[2J " + "x" * 1000 + "... [1,000 more characters]), log run\\x1b.jsonl",
            "  no device memory was pooled", "  leaks at exit: ?", "  note: \\rdone\\x07"])

    def test_the_records_of_the_command_and_of_processes_started_during_it(self):
        def start(pid, unix_s):
            return {"schema": 1, "type": "start", "t": 0, "pid": pid, "start_unix_s": unix_s}

        def warning(pid, message):
            return {"schema": 1, "type": "warning", "t": 1, "pid": pid, "message": message}

        records = [start(50, 1000), warning(50, "the command's pid, used before"),
                   start(60, 1999), warning(60, "started before the launcher"),
                   start(50, 2000), warning(50, "the command"),
                   start(70, 2001), warning(70, "started during the run"),
                   warning(80, "no start record"),
                   {"schema": 1, "type": "start", "t": 0, "pid": 90}, warning(90, "no start time")]
        chosen = poolshim_log.records_of_run(records, 50, 2000.7)
        self.assertEqual([(r["pid"], r["type"], r.get("message")) for r in chosen],
                         [(50, "start", None), (50, "warning", "the command"),
                          (70, "start", None), (70, "warning", "started during the run")])
        self.assertEqual(poolshim_log.records_of_run(records, 90, 3000)[1]["message"], "no start time")

    def test_a_sanitizer_runtime_stays_first_in_the_preload_list(self):
        import importlib.machinery
        import importlib.util
        loader = importlib.machinery.SourceFileLoader("poolshim_launcher", os.path.join(SCRIPTS, "poolshim"))
        launcher = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
        loader.exec_module(launcher)
        self.assertEqual(launcher.preload_list("/p/libpoolshim.so", None), "/p/libpoolshim.so")
        self.assertEqual(launcher.preload_list("/p/libpoolshim.so", "/x/libmine.so"), "/p/libpoolshim.so:/x/libmine.so")
        self.assertEqual(launcher.preload_list("/p/libpoolshim.so", "/usr/lib/libasan.so.8:/x/libmine.so"),
                         "/usr/lib/libasan.so.8:/p/libpoolshim.so:/x/libmine.so")
        self.assertEqual(launcher.preload_list("/p/libpoolshim.so", "libclang_rt.tsan-x86_64.so"),
                         "libclang_rt.tsan-x86_64.so:/p/libpoolshim.so")


class Fuzz(unittest.TestCase):
    """Every log the reader accepts renders in all three outputs; any other is refused with
    `poolshim-report: error: PATH:LINE: ...` (or `PATH: ...`) and status 2; never a traceback.
    The logs are the fixtures with one to three damages each (mutate.py), the same on every run."""

    SEED = int(os.environ.get("REPORT_FUZZ_SEED", "12"))
    COUNT = int(os.environ.get("REPORT_FUZZ_COUNT", "500"))
    SOURCES = [fixture(n) for n in ("normal.jsonl", "ooms.jsonl", "rank0.jsonl", "appended.jsonl",
                                    "old_shape_oom.jsonl", "real_cap_oom.jsonl")]

    def report(self, argv):
        """cli.main in this process (a subprocess each would take minutes): (status, stdout,
        stderr). An exception escaping it is what a traceback would be."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = cli.main(argv)
        return status, out.getvalue(), err.getvalue()

    def check_mutant(self, name, path, folder, full):
        page, trace = os.path.join(folder, name + ".html"), os.path.join(folder, name + ".trace.json")
        status, out, err = self.report(["--no-lines"] + (["--full"] if full else []) +
                                       ["--html", page, "--perfetto", trace, path])
        self.assertIn(status, (0, 2), err)
        if status == 2:
            self.assertEqual(out, "")
            self.assertRegex(err, r"\Apoolshim-report: error: " + re.escape(path) + r"(:[0-9]+)?: \S[^\n]*\n\Z")
            return False
        self.assertEqual(unsafe_characters(out), [])
        # A line of the summary holds a few strings of the log, each cut to 1000 characters
        # (poolshim_log.TEXT_LIMIT; most characters stay one once escaped), and a mutant has at
        # most 3 damages.
        self.assertLessEqual(max(len(line) for line in out.splitlines()), 4000)
        with open(trace, encoding="utf-8") as f:
            self.assertEqual(trace_problems(json.load(f)), [])
        p = _Page()
        with open(page, encoding="utf-8") as f:
            p.feed(f.read())
        p.close()
        self.assertEqual((p.scripts, p.loading_attrs), (2, []))
        # The launcher's summary of the same log (every process taken as the command's).
        summary = poolshim_log.summary_text(path, poolshim_log.records_of_run(model.read_records(path), -1, 0))
        self.assertEqual(unsafe_characters(summary), [])
        return True

    def test_mutated_fixtures_render_or_are_refused_with_file_and_line(self):
        folder = tempfile.mkdtemp(prefix="poolshim-report-fuzz-")
        self.addCleanup(shutil.rmtree, folder, True)
        self.addCleanup(setattr, model, "ANNOTATE_LINES", model.ANNOTATE_LINES)
        read = 0
        for n, (name, data) in enumerate(mutate.mutants(self.SEED, self.COUNT, self.SOURCES)):
            path = os.path.join(folder, name + ".jsonl")
            with open(path, "wb") as f:
                f.write(data)
            with self.subTest(name):
                read += self.check_mutant(name, path, folder, full=n % 2 == 1)
                if n % 50 == 0:   # and now and then the real command, in a process of its own
                    r = run_tool(path)
                    self.assertIn(r.returncode, (0, 2))
                    self.assertNotIn("Traceback", r.stderr)
        # Neither side is empty: the damages are not all fatal, nor all harmless.
        self.assertGreater(read, self.COUNT // 4)
        self.assertLess(read, self.COUNT * 3 // 4)


    def test_mutated_schema_2_logs_render_or_are_refused_with_file_and_line(self):
        """The same over the schema 2 fixtures (their cache, native and VMM fields, observe mode), half as many."""
        folder = tempfile.mkdtemp(prefix="poolshim-report-fuzz-")
        self.addCleanup(shutil.rmtree, folder, True)
        self.addCleanup(setattr, model, "ANNOTATE_LINES", model.ANNOTATE_LINES)
        sources = [fixture(n) for n in ("vmm_keep.jsonl", "observe_oom.jsonl", "pool_oom.jsonl")]
        read = 0
        for n, (name, data) in enumerate(mutate.mutants(self.SEED, self.COUNT // 2, sources)):
            path = os.path.join(folder, name + ".jsonl")
            with open(path, "wb") as f:
                f.write(data)
            with self.subTest(name):
                read += self.check_mutant(name, path, folder, full=n % 2 == 1)
        self.assertGreater(read, self.COUNT // 8)
        self.assertLess(read, self.COUNT * 3 // 8)

# ---- a real browser ---------------------------------------------------------------------------


# ---- issue 17: the cache, the size histogram, why reserved is high, runs still running, short runs ----


def crafted(testcase, rows, exit_t=0.5, exit_row=None, start=None, name="crafted.jsonl"):
    """A log of one run: a start record (host "other-host", pid 9100 unless `start` says
    otherwise), one sample per (t, figures) of `rows` on device 0, and an exit record at `exit_t`
    whose device row is `exit_row` (the last sample's figures by default; None: no exit record
    when exit_t is None)."""
    base = {"schema": 2, "pid": 9100}
    first = dict(base, type="start", t=0.01, version="0.2.0", host="other-host", rank="0",
                 start_unix_s=1796600000, command_line=["./app"],
                 config={"mode": "pool", "cache": "64M", "free": "auto", "release_threshold": "0"},
                 config_sources={"mode": "default", "cache": "default", "free": "default",
                                 "release_threshold": "default"}, devices=[{"device": 0, "name": "GPU", "total_bytes": GiB}])
    first.update(start or {})
    base["pid"] = first["pid"]
    records = [first] + [dict(base, type="sample", t=t, device=0, **figures) for t, figures in rows]
    if exit_t is not None:
        row = dict(rows[-1][1] if exit_row is None else exit_row, device=0)
        records.append(dict(base, type="exit", t=exit_t, pooled_allocs=row.get("allocs", 0), devices=[row],
                            leaks={"count": 0, "bytes": 0, "largest": []}, events_dropped=0))
    return write_temp(testcase, name, "".join(json.dumps(r) + "\n" for r in records))


def pool_row(reserved, used, cached, requested, live, hits=0, misses=0, histogram=None, **more):
    """Figures of one sample as the library writes them (pool_slack and rounding_waste follow)."""
    out = {"reserved_bytes": reserved, "reserved_bytes_peak": reserved, "used_bytes": used, "used_bytes_peak": used,
           "cached_bytes": cached, "cached_bytes_peak": cached, "requested_bytes": requested,
           "requested_bytes_peak": requested, "live_allocs": live, "allocs": hits + misses, "frees": 0,
           "cache_hits": hits, "cache_misses": misses, "cache_returns": 0, "fences": 0, "ordered_frees": 0,
           "pool_slack": 0 if not reserved else 1 - (used - cached) / reserved,
           "rounding_waste": 0 if used - cached == 0 else 1 - requested / (used - cached),
           "size_histogram": histogram or {}}
    out.update(more)
    return out


# 238 MiB reserved for a peak of 58 MiB requested, most of it in the heap's free blocks.
CACHED_ROWS = [(0.25, pool_row(64 * MiB, 64 * MiB, 6 * MiB, 58 * MiB, 4, hits=10, misses=2,
                               histogram={"2097152": 2, "16777216": 2})),
               (0.499, pool_row(238 * MiB, 230 * MiB, 226 * MiB, 4 * MiB, 1, hits=90, misses=10, cache_returns=1,
                                fences=3, histogram={"4194304": 1}))]


class Issue17(unittest.TestCase):
    def text(self, path, full=False):
        r = run_tool(*(["--full"] if full else []), path)
        self.assertEqual(r.returncode, 0, r.stderr)
        return sections(r.stdout)[0][1]

    def html(self, path):
        return HtmlPage.page(self, path)

    def test_the_cache_and_the_split_slack_in_the_summary(self):
        lines = self.text(crafted(self, CACHED_ROWS))
        self.assertEqual(cells(lines, "cached free blocks"), ["226.0 MiB (peak 226.0 MiB)"])
        self.assertEqual(cells(lines, "cache hits"), ["90 of 100 (90.0%)"])
        # Slack 1 - (230 - 226) / 238 at the end, 1 - 58 / 64 before; cached 226 / 238 and 6 / 64;
        # other (238 - 230) / 238 and 0.
        self.assertEqual(cells(lines, "pool slack (last/max/mean)"), ["98.3% / 98.3% / 53.8%"])
        self.assertEqual(cells(lines, "cached, reusable at once"), ["95.0% / 95.0% / 52.2%"])
        self.assertEqual(cells(lines, "other (the driver pool's)"), ["3.4% / 3.4% / 1.7%"])
        self.assertEqual(cells(lines, "rounding waste (last/max/mean)"), ["0.0% / 0.0% / 0.0%"])
        full = self.text(crafted(self, CACHED_ROWS), full=True)
        self.assertEqual(cells(full, "misses/returns/fences"), ["10 / 1 / 3"])

    def test_no_share_of_nothing(self):
        # Nothing reserved, then nothing live: no slack and no rounding waste, not 0% or 100%.
        rows = [(0.1, pool_row(0, 0, 0, 0, 0)), (0.2, pool_row(2 * MiB, 2 * MiB, 2 * MiB, 0, 0, hits=5, misses=1))]
        lines = self.text(crafted(self, rows))
        self.assertEqual(cells(lines, "pool slack (last/max/mean)"), ["100.0% / 100.0% / 100.0%"])
        self.assertEqual(cells(lines, "cached, reusable at once"), ["100.0% / 100.0% / 100.0%"])
        self.assertEqual(cells(lines, "rounding waste (last/max/mean)"), ["-"])
        lines = self.text(crafted(self, rows[:1]))
        self.assertEqual(cells(lines, "pool slack (last/max/mean)"), ["-"])
        self.assertEqual(cells(lines, "cache hits"), ["0 of 0"])

    def test_reserved_far_above_requested_names_the_cache(self):
        lines = self.text(crafted(self, CACHED_ROWS))
        start = lines.index("  reserved far above requested on device 0: peak reserved 238.0 MiB for a peak of 58.0 MiB "
                            "requested; at t=0.500 s it is")
        self.assertEqual(lines[start + 1:start + 3], [
            "    mostly the heap's cache (226.0 MiB of free blocks kept for reuse, served again without a driver call):",
            "    POOLSHIM_CACHE (now 64M) bounds its whole free segments; the rest are free blocks in segments still partly in use"])
        _, text, _ = self.html(crafted(self, CACHED_ROWS))
        self.assertIn('<p class="hint gap" data-cause="cache"><b>reserved far above requested:</b> peak reserved 238.0 MiB '
                      "for a peak of 58.0 MiB requested; at t=0.500 s it is mostly the heap&#x27;s cache (226.0 MiB of "
                      "free blocks kept for reuse, served again without a driver call): POOLSHIM_CACHE (now 64M) bounds "
                      "its whole free segments; the rest are free blocks in segments still partly in use</p>", text)

    def test_reserved_far_above_requested_each_cause(self):
        config = {"cache": "64M", "release_threshold": "0"}

        def gap(row, ordered=0, peak_requested=58 * MiB):
            return model.reserve_gap(dict(row, t=1.0), row["reserved_bytes"], peak_requested, ordered, config)

        ordered = gap(pool_row(238 * MiB, 230 * MiB, 226 * MiB, 4 * MiB, 1), ordered=50)
        self.assertEqual((ordered["cause"], ordered["bytes"]), ("fences", 226 * MiB))
        self.assertEqual(ordered["text"].split(": ", 1)[1],
                         "POOLSHIM_FREE=sync makes each cudaFree's block reusable at once")
        self.assertIn("mostly freed blocks waiting for their fences (226.0 MiB in the heap's free blocks, beyond the "
                      "64M cache; 50 cudaFree calls were ordered, not synchronized)", ordered["text"])
        # Under the cache's bound with ordered frees: the cache, not fences.
        self.assertEqual(gap(pool_row(100 * MiB, 100 * MiB, 60 * MiB, 4 * MiB, 1), ordered=50,
                             peak_requested=20 * MiB)["cause"], "cache")
        pool = gap(pool_row(238 * MiB, 30 * MiB, 26 * MiB, 4 * MiB, 1))
        self.assertEqual((pool["cause"], pool["bytes"]), ("pool", 208 * MiB))
        self.assertEqual(pool["text"], "peak reserved 238.0 MiB for a peak of 58.0 MiB requested; at t=1.000 s it is "
                         "mostly free memory the driver pool holds (208.0 MiB reserved but not in the heap's segments, "
                         "given back only when the pool is idle, down to the release threshold): "
                         "POOLSHIM_RELEASE_THRESHOLD (now 0) sets what it keeps, POOLSHIM_IDLE_TRIM_MS when it trims")
        rounding = gap(pool_row(238 * MiB, 238 * MiB, 0, 20 * MiB, 1))
        self.assertEqual((rounding["cause"], rounding["bytes"]), ("rounding", 218 * MiB))
        # Not far above: under twice the peak requested, or less than 16 MiB more.
        self.assertIsNone(gap(pool_row(60 * MiB, 60 * MiB, 57 * MiB, 3 * MiB, 1), peak_requested=int(58.4 * MiB)))
        self.assertIsNone(gap(pool_row(30 * MiB, 30 * MiB, 28 * MiB, 2 * MiB, 1), peak_requested=15 * MiB))

    def test_a_healthy_cache_gets_no_hint(self):
        rows = [(0.2, pool_row(60 * MiB, 60 * MiB, 2 * MiB, 58 * MiB, 8)),
                (0.4, pool_row(60 * MiB, 60 * MiB, 57 * MiB, 3 * MiB, 1))]
        lines = self.text(crafted(self, rows))
        self.assertEqual([line for line in lines if "far above" in line], [])
        _, text, _ = self.html(crafted(self, rows))
        self.assertNotIn('class="hint gap"', text)

    def test_the_size_histogram_as_a_table(self):
        lines = self.text(crafted(self, CACHED_ROWS), full=True)
        start = lines.index("  live allocations by size on device 0 at t=0.250 s (the most bytes requested, 58.0 MiB)")
        self.assertEqual(lines[start + 1:start + 3], ["    from   2.0 MiB  16.0 MiB", "    count        2         2"])
        # Nine sizes: eight a row, then the ninth.
        hist = {str(512 << i): i + 1 for i in range(9)}
        lines = self.text(crafted(self, [(0.2, pool_row(8 * MiB, 8 * MiB, 0, 4 * MiB, 45, histogram=hist))]),
                          full=True)
        start = lines.index("  live allocations by size on device 0 at t=0.500 s (the most bytes requested, 4.0 MiB)")
        self.assertEqual(lines[start + 1:start + 5], [
            "    from   512 B  1.0 KiB  2.0 KiB  4.0 KiB  8.0 KiB  16.0 KiB  32.0 KiB  64.0 KiB",
            "    count      1        2        3        4        5         6         7         8",
            "    from   128.0 KiB", "    count          9"])

    def test_the_size_histogram_as_bars(self):
        _, text, _ = self.html(crafted(self, CACHED_ROWS))
        found = re.findall(r'<g class="bucket" data-from="(\d+)" data-count="(\d+)"><title>([^<]*)</title>'
                           r'<rect class="bar" x="[\d.]+" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)"/>', text)
        # Two buckets of two allocations: both bars the full height of the plot (170 - 18 - 34).
        self.assertEqual(found, [("2097152", "2", "2 from 2.0 MiB up to 4.0 MiB", "18.0", "60.0", "118.0"),
                                 ("16777216", "2", "2 from 16.0 MiB up to 32.0 MiB", "18.0", "60.0", "118.0")])
        self.assertIn('<figcaption>live allocations by size at t=0.250 s (the most bytes requested, 58.0 MiB)'
                      '</figcaption><svg class="histogram" data-device="0" data-t="0.25"', text)
        # No live allocation in any sample: no chart.
        _, text, _ = self.html(crafted(self, [(0.2, pool_row(2 * MiB, 2 * MiB, 2 * MiB, 0, 0))]))
        self.assertNotIn('class="histogram"', text)

    def test_the_cache_in_the_trace(self):
        trace = PerfettoTrace.trace(self, crafted(self, CACHED_ROWS))
        self.assertEqual(trace_problems(trace), [])
        counters = [(e["name"], e["ts"], e["args"]) for e in trace["traceEvents"]
                    if e["ph"] == "C" and "cache" in e["name"]]
        self.assertEqual(counters, [("device 0 cached", 250000.0, {"bytes": 6 * MiB}),
                                    ("device 0 cache hits", 250000.0, {"count": 10}),
                                    ("device 0 cached", 499000.0, {"bytes": 226 * MiB}),
                                    ("device 0 cache hits", 499000.0, {"count": 90})])

    def test_the_cache_in_the_page(self):
        _, text, page = self.html(crafted(self, CACHED_ROWS))
        self.assertIn(["figures", "cache"], page.tables)
        for row in ("<tr><td>cached, final</td><td class=num>226.0 MiB</td></tr>",
                    "<tr><td>hits</td><td class=num>90 of 100 (90.0%)</td></tr>",
                    "<tr><td>misses</td><td class=num>10</td></tr>",
                    "<tr><td>segments given back</td><td class=num>1</td></tr>",
                    "<tr><td>· cached</td><td class=num>95.0%</td><td class=num>95.0%</td><td class=num>52.2%</td></tr>",
                    "<tr><td>· other</td><td class=num>3.4%</td><td class=num>3.4%</td><td class=num>1.7%</td></tr>"):
            self.assertIn(row, text)

    def test_a_run_still_running_on_this_host(self):
        import socket
        import time
        start = {"host": socket.gethostname(), "pid": os.getpid(), "start_unix_s": int(time.time())}
        path = crafted(self, CACHED_ROWS, exit_t=None, start=start)
        lines = self.text(path)
        self.assertEqual(cells(lines, "ended"), [f"still running (no exit record yet; pid {os.getpid()} is alive on "
                                                 "this host)"])
        _, text, _ = self.html(path)
        self.assertIn('<span class="tag running">still running</span>', text)
        self.assertIn('<td><span class="running">still running</span></td></tr>', text)
        # The same pid, but the process started after the log's start: another process now.
        lines = self.text(crafted(self, CACHED_ROWS, exit_t=None, start=dict(start, start_unix_s=1000)))
        self.assertEqual(cells(lines, "ended"), ["no exit record (killed, _exit, abort or a fatal signal)"])

    def test_a_run_that_ended_without_an_exit_record(self):
        import socket
        gone = subprocess.Popen(["true"])
        gone.wait()
        lines = self.text(crafted(self, CACHED_ROWS, exit_t=None,
                                  start={"host": socket.gethostname(), "pid": gone.pid}))
        self.assertEqual(cells(lines, "ended"), ["no exit record (killed, _exit, abort or a fatal signal)"])
        lines = self.text(crafted(self, CACHED_ROWS, exit_t=None))
        self.assertEqual(cells(lines, "ended"), ["no exit record (other host: cannot tell)"])

    def test_a_run_under_a_second_is_drawn(self):
        # One sample at 0.0207 s and the exit record at 0.0209 s (threads over the double): the two
        # points 7.8 units apart, at x = 70 + t / 0.0209 * 812, get a dot at the last; 2 MiB on an
        # axis up to 2.5 MiB is y = 16 + 250 - 0.8 * 250.
        rows = [(0.0207, pool_row(2 * MiB, 2 * MiB, 2 * MiB, 0, 0))]
        _, text, page = self.html(crafted(self, rows, exit_t=0.0209))
        (svg,) = page.timelines
        self.assertEqual(parse_points(svg["series"]["reserved"]), [(874.2, 66.0), (882.0, 66.0)])
        self.assertIn('<circle class="dot reserved" cx="882.0" cy="66.0" r="5"/>', text)
        # Samples at any spacing, then the exit record's figures as the last point.
        rows = [(0.1, pool_row(MiB, MiB, 0, MiB, 1)), (0.15, pool_row(2 * MiB, 2 * MiB, 0, 2 * MiB, 2)),
                (0.9, pool_row(4 * MiB, 4 * MiB, 0, 4 * MiB, 4))]
        _, text, page = self.html(crafted(self, rows, exit_t=1.0, exit_row=pool_row(3 * MiB, 3 * MiB, 0, 3 * MiB, 3)))
        (svg,) = page.timelines
        self.assertEqual([x for x, _ in parse_points(svg["series"]["requested"])], [151.2, 191.8, 800.8, 882.0])
        self.assertEqual(self.timeline_data(text)[svg["attrs"]["id"]]["requested"], [MiB, 2 * MiB, 4 * MiB, 3 * MiB])
        self.assertNotIn('<circle class="dot', text)

    timeline_data = HtmlPage.timeline_data

    def test_the_launcher_summary_does_not_call_the_cache_fragmentation(self):
        records = lines_of(crafted(self, CACHED_ROWS))
        text = poolshim_log.summary_text("run.jsonl", records).splitlines()
        self.assertIn("    pool slack 98.3% of reserved at the end (226.0 MiB cached, reusable at once; 8.0 MiB other), "
                      "highest sampled 98.3%; rounding waste 0.0%", text)
        records = lines_of(crafted(self, [(0.2, pool_row(2 * MiB, 2 * MiB, 2 * MiB, 0, 0))]))
        self.assertIn("    pool slack 100.0% of reserved at the end (2.0 MiB cached, reusable at once; 0 B other), "
                      "highest sampled 100.0%; rounding waste: nothing live at the end",
                      poolshim_log.summary_text("run.jsonl", records).splitlines())
        records = lines_of(crafted(self, [(0.2, pool_row(0, 0, 0, 0, 0))]))
        self.assertIn("    pool slack: nothing reserved at the end; rounding waste: nothing live at the end",
                      poolshim_log.summary_text("run.jsonl", records).splitlines())


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def render_page(test, logs, poke=None, window=None):
    """Writes the HTML report of `logs`, with the script `poke` run at the end of its body, and
    returns headless Chromium's run of it (its stdout is the DOM after the page's scripts ran)."""
    folder = tempfile.mkdtemp(prefix="poolshim-report-test-")
    test.addCleanup(shutil.rmtree, folder, True)
    page = os.path.join(folder, "report.html")
    r = run_tool("-q", "--html", page, *[fixture(name) for name in logs])
    test.assertEqual(r.returncode, 0, r.stderr)
    if poke is not None:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        with open(page, "w", encoding="utf-8") as f:
            f.write(text.replace("</body>", f"<script>{poke}</script></body>"))
    size = [f"--window-size={window}"] if window else []
    return subprocess.run([find_chromium(), "--headless", "--disable-gpu", "--no-sandbox",
                           f"--user-data-dir={os.path.join(folder, 'profile')}", *size, "--dump-dom",
                           "file://" + page], capture_output=True, text=True, timeout=180)


@unittest.skipUnless(find_chromium(), "chromium (or chromium-browser) is not on PATH: the headless render test is "
                                      "skipped (apt-get install chromium)")
class Browser(unittest.TestCase):
    def test_page_renders_with_its_script(self):
        done = render_page(self, ["ooms.jsonl", "normal.jsonl"])
        dom = done.stdout
        self.assertIn('class="timeline"', dom, done.stderr[-2000:])
        p = _Page()
        p.feed(dom)
        self.assertEqual(len(p.timelines), 4)
        for svg in p.timelines:
            for name in ("reserved", "used", "requested"):
                self.assertTrue(parse_points(svg["series"].get(name, "")), (svg["attrs"], name))
            # The inline script ran to its end for every chart (it marks each one).
            self.assertEqual(svg["attrs"].get("data-interactive"), "1", svg["attrs"])
        self.assertTrue(parse_points(p.timelines[0]["series"]["cap"]))

    def test_hover_readout(self):
        """A mouse move over the first chart shows the read-out of the nearest sample."""
        poke = ("var s = document.querySelector('svg.timeline'), b = s.getBoundingClientRect();"
                "s.dispatchEvent(new MouseEvent('mousemove', {clientX: b.left + b.width / 2, "
                "clientY: b.top + b.height / 2, bubbles: true}));")
        done = render_page(self, ["ooms.jsonl"], poke, "1400,1800")
        match = re.search(r'<div class="readout"[^>]*>(.*?)</div>', done.stdout)
        self.assertIsNotNone(match, done.stdout[-2000:])
        self.assertNotIn("hidden", match.group(0).split(">")[0])
        self.assertRegex(match.group(1), r"<b>t = \d+\.\d{3} s</b>.*reserved \d+\.\d (MiB|GiB).*used .*requested .*cap 6\.0 GiB")

    def test_schema_2_pages_read_out_the_new_series(self):
        """A mouse move over each chart of a VMM and an observe-mode log: the read-out names the
        new series, and the observe chart's has no pool figures (its data has none)."""
        poke = ("document.querySelectorAll('svg.timeline').forEach(function (s) {"
                "var b = s.getBoundingClientRect(); s.dispatchEvent(new MouseEvent('mousemove', "
                "{clientX: b.left + b.width / 2, clientY: b.top + b.height / 2, bubbles: true}));});")
        done = render_page(self, ["vmm_keep.jsonl", "observe_oom.jsonl"], poke, "1400,3000")
        p = _Page()
        p.feed(done.stdout)
        self.assertEqual([svg["attrs"].get("data-interactive") for svg in p.timelines], ["1", "1"], done.stderr[-2000:])
        vmm, observe = re.findall(r'<div class="readout"[^>]*>(.*?)</div>', done.stdout)
        self.assertIn("VMM physical 8.0 MiB", vmm)
        self.assertIn("pool slack", vmm)
        self.assertIn("native 32.0 MiB", observe)
        self.assertNotIn("reserved", observe)
        self.assertNotIn("pool slack", observe)


if __name__ == "__main__":
    unittest.main()
