#!/usr/bin/env python3
"""Tests of poolshim-report --memory-viz (scripts/poolshim_report/memory_viz.py): the event log
(POOLSHIM_EVENTS) as the PyTorch memory snapshot that pytorch.org/memory_viz reads.

    python3 tests/report/test_memory_viz.py [-v] [Class.test]

A small event log and its JSON log are written here; the snapshot's exact content is checked,
then read as MemoryViz.js reads it (tests/gpu/memory_viz_check.py: its unpickler's opcodes and
its two views replayed), and through torch.cuda._memory_viz when torch is importable (skipped,
saying so, otherwise). fixtures/events_oom.csv and events_oom.jsonl are a real event log and its
log (`oom_cases exhausted` over the CPU test double; RealLog says how they were made).
"""

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPTS = os.path.join(ROOT, "scripts")
TOOL = os.path.join(SCRIPTS, "poolshim-report")
sys.path.insert(0, SCRIPTS)
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))

import memory_viz_check  # noqa: E402
from poolshim_report import memory_viz  # noqa: E402

MiB = 1024 * 1024
HEADER = "Thread,Time,Action,Pointer,Size,Stream,Device,Site,T"
START_NS = 1_700_000_000_250_000_000
STREAM = 0x55550000AA00
APP = "/opt/app/bin/train"
SHIM = "/usr/lib/x86_64-linux-gnu/libpoolshim.so.0"
METRICS = "/opt/app/lib/libmetrics.so"

ROWS = [
    # A 1 MiB and a 4 KiB block on device 0, 2 MiB on device 1's own stream.
    "100,10:00:00.250100,allocate,0x7f0000000000,1048576,0x0,0,1,0.000100000",
    "100,10:00:00.250200,allocate,0x7f0000100000,4096,0x0,0,2,0.000200000",
    "101,10:00:00.250300,allocate,0x7f1000000000,2097152,0x55550000aa00,1,1,0.000300500",
    "100,10:00:00.250400,free,0x7f0000000000,1048576,0x0,0,1,0.000400000",
    # A failure on device 1, with an oom record 2 ms later.
    "101,10:00:00.750500,allocate failure,0x0,4194304,0x55550000aa00,1,2,0.500000001",
    # The free of an allocation from before the first row.
    "100,10:00:00.850600,free,0x7f2000000000,512,0x0,0,0,0.600000000",
    # The freed 1 MiB address again, 8 KiB this time.
    "100,10:00:00.950700,allocate,0x7f0000000000,8192,0x0,0,2,0.700000000",
]

SITES = {
    "1": [{"module": SHIM, "offset": 0x1234, "function": "cudaMalloc", "function_offset": 0x10},
          {"module": APP, "offset": 0x41A2C, "function": "Model::forward()", "function_offset": 0x2C}],
    "2": [{"module": METRICS, "offset": 0x8E10, "function": None, "function_offset": None}],
}
FRAMES_1 = [{"filename": SHIM, "line": 0, "name": "cudaMalloc"},
            {"filename": APP, "line": 0, "name": "Model::forward()"}]
FRAMES_2 = [{"filename": METRICS, "line": 0, "name": "0x8e10"}]


def records(**exit_fields):
    start = {"schema": 2, "type": "start", "t": 0.0, "pid": 4242, "version": "0.3.0", "host": "node1",
             "rank": "0", "start_unix_s": START_NS // 10 ** 9, "start_unix_ns": START_NS, "log": "poolshim-4242.jsonl",
             "command_line": ["train"], "config": {"events": "events-%p.csv"},
             "devices": [{"device": 0, "name": "H200", "total_bytes": 100 * MiB},
                         {"device": 1, "name": "H200", "total_bytes": 100 * MiB}]}
    sample = {"schema": 2, "type": "sample", "t": 0.3, "pid": 4242, "device": 1, "device_free": 7 * MiB}
    oom = {"schema": 2, "type": "oom", "t": 0.502, "pid": 4242, "device": 1, "request_bytes": 4 * MiB,
           "device_free": 3 * MiB, "verdict": "exhausted"}
    exit_ = {"schema": 2, "type": "exit", "t": 1.0, "pid": 4242, "event_log_written": len(ROWS),
             "event_log_dropped": 0, "event_log_sites": SITES}
    exit_.update(exit_fields)
    return [start, sample, oom, exit_]


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def us(t_ns):
    return (START_NS + t_ns) // 1000


def entry(action, addr, size, t_ns, frames, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": us(t_ns), "frames": frames}


def segment(device, address, size, frames, stream=0):
    return {"device": device, "address": address, "total_size": size, "allocated_size": size, "active_size": size,
            "requested_size": size, "stream": stream, "segment_type": "large" if size > MiB else "small",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames,
            "blocks": [{"address": address, "size": size, "requested_size": size, "state": "active_allocated",
                        "frames": frames}]}


class Files:
    """A temporary folder with the log and the event log of a test."""

    def __init__(self, testcase, rows=ROWS, recs=None, header=HEADER):
        self.dir = tempfile.mkdtemp(prefix="poolshim-memviz-test-")
        testcase.addCleanup(shutil.rmtree, self.dir, True)
        self.log = os.path.join(self.dir, "poolshim-4242.jsonl")
        self.events = os.path.join(self.dir, "events-4242.csv")
        self.out = os.path.join(self.dir, "snapshot.pickle")
        with open(self.log, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in (records() if recs is None else recs))
        with open(self.events, "w") as f:
            f.write("".join(line + "\n" for line in [header] + list(rows)))

    def run(self, *extra):
        return subprocess.run([sys.executable, TOOL, "--no-lines", "--quiet", "--memory-viz", self.out,
                               "--events", self.events, *extra, self.log], capture_output=True, text=True,
                              timeout=120)

    def snapshot(self, testcase, *extra):
        done = self.run(*extra)
        testcase.assertEqual((done.returncode, done.stderr), (0, ""))
        with open(self.out, "rb") as f:
            return f.read()


EXPECTED_TRACES = [
    [
        entry("segment_alloc", 0x7F0000000000, MiB, 100_000, FRAMES_1),
        entry("alloc", 0x7F0000000000, MiB, 100_000, FRAMES_1),
        entry("segment_alloc", 0x7F0000100000, 4096, 200_000, FRAMES_2),
        entry("alloc", 0x7F0000100000, 4096, 200_000, FRAMES_2),
        entry("free_requested", 0x7F0000000000, MiB, 400_000, FRAMES_1),
        entry("free_completed", 0x7F0000000000, MiB, 400_000, FRAMES_1),
        entry("segment_free", 0x7F0000000000, MiB, 400_000, FRAMES_1),
        entry("free_requested", 0x7F2000000000, 512, 600_000_000, []),
        entry("free_completed", 0x7F2000000000, 512, 600_000_000, []),
        entry("segment_free", 0x7F2000000000, 512, 600_000_000, []),
        entry("segment_alloc", 0x7F0000000000, 8192, 700_000_000, FRAMES_2),
        entry("alloc", 0x7F0000000000, 8192, 700_000_000, FRAMES_2),
    ],
    [
        entry("segment_alloc", 0x7F1000000000, 2 * MiB, 300_500, FRAMES_1, STREAM),
        entry("alloc", 0x7F1000000000, 2 * MiB, 300_500, FRAMES_1, STREAM),
        {"action": "oom", "size": 4 * MiB, "stream": STREAM, "device_free": 3 * MiB, "time_us": us(500_000_001),
         "frames": FRAMES_2},
    ],
]
EXPECTED_SEGMENTS = [
    segment(0, 0x7F0000000000, 8192, FRAMES_2),
    segment(0, 0x7F0000100000, 4096, FRAMES_2),
    segment(1, 0x7F1000000000, 2 * MiB, FRAMES_1, STREAM),
]


class Snapshot(unittest.TestCase):
    def test_exact_content_of_a_small_log(self):
        """Every entry of both devices' traces (allocs with their segment, frees as
        free_requested + free_completed + segment_free with the allocation's frames, the
        failure as oom with the oom record's device_free) and one segment per live block."""
        files = Files(self)
        snap = pickle.loads(files.snapshot(self))
        self.assertEqual(sorted(snap), ["device_traces", "poolshim", "segments"])
        self.assertEqual(snap["device_traces"], EXPECTED_TRACES)
        self.assertEqual(snap["segments"], EXPECTED_SEGMENTS)
        self.assertEqual(snap["poolshim"], {
            "pid": 4242, "log": files.log, "events": files.events, "rows": 7,
            "segments": "one per allocation: the pool's segments are not in the event log",
            "event_log_written": 7, "event_log_dropped": 0, "call_sites": True,
            "zero_size_allocations": 0, "frees_without_allocation": 1, "frees_inferred": 0})

    def test_pickle_protocol_4_and_only_opcodes_memoryviz_js_reads(self):
        data = Files(self).snapshot(self)
        self.assertEqual(data[:2], b"\x80\x04")
        opcodes = memory_viz_check.check_opcodes(data)
        self.assertLessEqual(opcodes, memory_viz_check.VIEWER_OPCODES)
        self.assertIn("TUPLE2", opcodes)   # segment_pool_id

    def test_both_views_replay_as_memoryviz_js_draws_them(self):
        """The Active Memory Timeline's figures per device (the 512-byte block freed without an
        allocation row counts from the start: 512 + 1 MiB + 4 KiB at the peak), and the
        Allocator State History undone to its first event with every block inside a segment."""
        snap, lines = memory_viz_check.check_viewer(Files(self).snapshot(self))
        self.assertEqual(lines[1:], [
            "device 0: Active Memory Timeline 4 allocations, peak 1053184 bytes, 12288 at the end; Active Cached "
            "Segment Timeline peak 1053184 bytes; Allocator State History 10 events, up to 3 segments and 3 blocks",
            "device 1: Active Memory Timeline 1 allocations, peak 2097152 bytes, 2097152 at the end; Active Cached "
            "Segment Timeline peak 2097152 bytes; Allocator State History 3 events, up to 1 segments and 1 blocks"])

    def test_free_requested_and_completed_are_adjacent_so_the_viewer_makes_one_free(self):
        trace = memory_viz_check._annotated(EXPECTED_TRACES[0])
        self.assertEqual([e["action"] for e in trace],
                         ["segment_alloc", "alloc", "segment_alloc", "alloc", "free", "segment_free", "free",
                          "segment_free", "segment_alloc", "alloc"])

    def test_time_us_is_the_start_plus_t_in_microseconds_without_start_unix_ns_whole_seconds(self):
        recs = records()
        del recs[0]["start_unix_ns"]
        snap = pickle.loads(Files(self, recs=recs).snapshot(self))
        self.assertEqual(snap["device_traces"][0][0]["time_us"], (START_NS // 10 ** 9) * 10 ** 6 + 100)

    def test_without_event_log_sites_frames_are_empty_and_a_warning_says_so(self):
        files = Files(self, recs=records(event_log_sites=None))
        done = subprocess.run([sys.executable, TOOL, "--no-lines", "--memory-viz", files.out, "--events",
                               files.events, files.log], capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("poolshim-report: warning: --memory-viz: the exit record of pid 4242 has no event_log_sites: "
                      "no call-site frames\n", done.stderr)
        self.assertIn(f"poolshim-report: wrote memory snapshot {files.out}\n", done.stderr)
        snap = load(files.out)
        self.assertEqual({str(e["frames"]) for t in snap["device_traces"] for e in t}, {"[]"})
        self.assertEqual({str(s["frames"]) for s in snap["segments"]}, {"[]"})
        self.assertFalse(snap["poolshim"]["call_sites"])

    def test_lost_free_is_inferred_at_the_reuse_of_its_address(self):
        """Two allocations at one address with no free between (the free's row dropped): the
        first ends where the second begins, marked poolshim_inferred, so that the state view
        never holds two blocks at one address."""
        rows = ["7,10:00:00.000001,allocate,0x7f0000000000,4096,0x0,0,0,0.000001000",
                "7,10:00:00.000002,allocate,0x7f0000000000,2048,0x0,0,0,0.000002000"]
        recs = records(event_log_written=2, event_log_dropped=1)
        files = Files(self, rows=rows, recs=recs)
        done = files.run()
        self.assertEqual(done.returncode, 0, done.stderr)
        snap = load(files.out)
        self.assertEqual([(e["action"], e["size"], e.get("poolshim_inferred", False)) for e in snap["device_traces"][0]],
                         [("segment_alloc", 4096, False), ("alloc", 4096, False), ("free_requested", 4096, True),
                          ("free_completed", 4096, True), ("segment_free", 4096, True), ("segment_alloc", 2048, False),
                          ("alloc", 2048, False)])
        self.assertEqual(snap["poolshim"]["frees_inferred"], 1)
        self.assertEqual([s["total_size"] for s in snap["segments"]], [2048])
        memory_viz_check.check_viewer(pickle.dumps(snap, protocol=4))

    def test_zero_byte_allocation_is_left_out_and_counted(self):
        rows = ["7,10:00:00.000001,allocate,0x7f0000000000,0,0x0,0,0,0.000001000",
                "7,10:00:00.000002,free,0x7f0000000000,0,0x0,0,0,0.000002000"]
        files = Files(self, rows=rows, recs=records(event_log_written=2))
        snap = pickle.loads(files.snapshot(self))
        self.assertEqual(snap["device_traces"], [[], []])
        self.assertEqual(snap["poolshim"]["zero_size_allocations"], 2)

    def test_failure_without_an_oom_record_takes_the_last_sample_device_free(self):
        recs = [r for r in records() if r["type"] != "oom"]
        snap = pickle.loads(Files(self, recs=recs).snapshot(self))
        self.assertEqual(snap["device_traces"][1][2]["device_free"], 7 * MiB)


class RealLog(unittest.TestCase):
    def test_event_log_of_oom_cases_over_the_double(self):
        """fixtures/events_oom.{csv,jsonl}: `oom_cases exhausted` over the CPU test double
        (CUDADOUBLE_MEM=32M, POOLSHIM_BACKTRACE=8, POOLSHIM_EVENTS), a library whose exit record
        has no event_log_sites yet: eight 4 MiB blocks live to the end, then the failure, whose
        device_free is its oom record's (0 of 32 MiB)."""
        out = os.path.join(tempfile.mkdtemp(prefix="poolshim-memviz-test-"), "oom.pickle")
        self.addCleanup(shutil.rmtree, os.path.dirname(out), True)
        done = subprocess.run([sys.executable, TOOL, "--no-lines", "--quiet", "--memory-viz", out, "--events",
                               os.path.join(HERE, "fixtures", "events_oom.csv"),
                               os.path.join(HERE, "fixtures", "events_oom.jsonl")],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual((done.returncode, done.stderr), (0, ""))
        with open(out, "rb") as f:
            data = f.read()
        snap, lines = memory_viz_check.check_viewer(data)
        trace, = snap["device_traces"]
        self.assertEqual([e["action"] for e in trace], ["segment_alloc", "alloc"] * 8 + ["oom"])
        self.assertEqual(trace[-1], {"action": "oom", "size": 4 * MiB, "stream": 0, "device_free": 0,
                                     "time_us": 1796613477331106, "frames": []})
        self.assertEqual([s["address"] for s in snap["segments"]],
                         sorted(0x7FB442600000 + i * 4 * MiB for i in range(8)))
        self.assertEqual(lines[1], "device 0: Active Memory Timeline 8 allocations, peak 33554432 bytes, 33554432 at "
                                   "the end; Active Cached Segment Timeline peak 33554432 bytes; Allocator State "
                                   "History 17 events, up to 8 segments and 8 blocks")


class CheckerSelfCheck(unittest.TestCase):
    """The viewer's checker can fail: the two ways a block ends up in no segment, as
    Allocator State History's find_segment would fail on them."""

    SEGMENT = {"device": 0, "address": 0x1000, "total_size": 4096, "stream": 0, "frames": [],
               "blocks": [{"size": 4096, "requested_size": 4096, "state": "active_allocated", "frames": []}]}

    def history(self, trace, segments=None):
        snap = {"segments": [self.SEGMENT] if segments is None else segments, "device_traces": [trace]}
        return memory_viz_check.state_history(snap, 0)

    def test_a_consistent_trace_passes_with_its_counts(self):
        trace = [{"action": "segment_alloc", "addr": 0x1000, "size": 4096},
                 {"action": "alloc", "addr": 0x1000, "size": 4096}]
        self.assertEqual(self.history(trace), {"events": 2, "most_segments": 1, "most_blocks": 1})

    def test_a_freed_block_outside_every_segment_fails(self):
        trace = [{"action": "segment_alloc", "addr": 0x1000, "size": 4096},
                 {"action": "alloc", "addr": 0x9000, "size": 512},
                 {"action": "free", "addr": 0x9000, "size": 512}]
        with self.assertRaisesRegex(memory_viz_check.CheckError, "block at 0x9000 lies in no segment"):
            self.history(trace)

    def test_a_block_allocated_before_its_segment_fails(self):
        trace = [{"action": "snapshot", "addr": 0, "size": 0},
                 {"action": "alloc", "addr": 0x1000, "size": 4096},
                 {"action": "segment_alloc", "addr": 0x1000, "size": 4096}]
        with self.assertRaisesRegex(memory_viz_check.CheckError, "at event 1: the block at 0x1000 lies in no segment"):
            self.history(trace)


class Frames(unittest.TestCase):
    def test_addr2line_place_gives_file_and_line(self):
        frame = {"module": APP, "offset": 0x41A2C, "function": "Model::forward()", "function_offset": 0x2C,
                 "line": "model.cpp:27"}
        self.assertEqual(memory_viz.viz_frame(frame), {"filename": "model.cpp", "line": 27, "name": "Model::forward()"})

    def test_unplaced_frame_without_function_gives_module_line_0_and_offset(self):
        self.assertEqual(memory_viz.viz_frame(SITES["2"][0]), {"filename": METRICS, "line": 0, "name": "0x8e10"})


class Errors(unittest.TestCase):
    def error(self, files, *extra):
        done = files.run(*extra)
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertFalse(os.path.exists(files.out))
        return done.stderr

    def test_missing_event_log(self):
        files = Files(self)
        os.unlink(files.events)
        self.assertEqual(self.error(files), f"poolshim-report: error: cannot read the event log {files.events}: "
                                            "No such file or directory\n")

    def test_wrong_header_names_line_1(self):
        files = Files(self, header="Thread,Time,Action,Pointer,Size,Stream")
        self.assertEqual(self.error(files), f"poolshim-report: error: {files.events}:1: not a poolshim event log: "
                                            f"the header should be {HEADER!r}, not 'Thread,Time,Action,Pointer,Size,Stream'\n")

    def test_empty_file(self):
        files = Files(self)
        open(files.events, "w").close()
        self.assertEqual(self.error(files), f"poolshim-report: error: {files.events}: empty: not an event log "
                                            "(POOLSHIM_EVENTS writes its header first)\n")

    def test_bad_action_names_its_line(self):
        files = Files(self, rows=ROWS[:2] + [ROWS[2].replace("allocate", "alloc")])
        self.assertEqual(self.error(files), f"poolshim-report: error: {files.events}:4: bad Action 'alloc'\n")

    def test_short_row_names_its_line_and_columns(self):
        files = Files(self, rows=[ROWS[0], "100,10:00:00.250200,allocate,0x7f0000100000,4096"])
        self.assertEqual(self.error(files), f"poolshim-report: error: {files.events}:3: 5 columns, not 9 ({HEADER}): "
                                            "'100,10:00:00.250200,allocate,0x7f0000100000,4096'\n")

    def test_device_not_in_the_run(self):
        files = Files(self, rows=[ROWS[0], ROWS[1].replace(",0,2,", ",3,2,")])
        self.assertEqual(self.error(files), f"poolshim-report: error: {files.events}:3: device 3 is not one of the "
                                            f"devices of pid 4242 in {files.log} (0, 1): an event log of another run?\n")

    def test_run_without_an_event_log(self):
        recs = records()
        recs[0]["config"]["events"] = ""
        files = Files(self, recs=recs)
        self.assertEqual(self.error(files), f"poolshim-report: error: {files.log}: pid 4242 ran without an event log "
                                            "(POOLSHIM_EVENTS was not set): --events names another run's\n")

    def test_bad_event_log_sites(self):
        files = Files(self, recs=records(event_log_sites={"1": [{"module": APP}]}))
        self.assertEqual(self.error(files), f"poolshim-report: error: {files.log}: the exit record of pid 4242: "
                                            "event_log_sites[1][0] should be a frame ({\"module\": str, \"offset\": "
                                            "int, \"function\": str or null, ...})\n")

    def test_memory_viz_without_events_is_a_usage_error(self):
        files = Files(self)
        done = subprocess.run([sys.executable, TOOL, "--memory-viz", files.out, files.log], capture_output=True,
                              text=True, timeout=120)
        self.assertEqual(done.returncode, 2)
        self.assertTrue(done.stderr.startswith("usage: poolshim-report"), done.stderr)
        self.assertTrue(done.stderr.endswith("poolshim-report: error: --memory-viz needs --events CSV (the event "
                                             "log to export)\n"), done.stderr)

    def test_events_without_memory_viz_is_a_usage_error(self):
        files = Files(self)
        done = subprocess.run([sys.executable, TOOL, "--events", files.events, files.log], capture_output=True,
                              text=True, timeout=120)
        self.assertEqual(done.returncode, 2)
        self.assertTrue(done.stderr.endswith("poolshim-report: error: --events is only read by --memory-viz\n"))

    def test_output_over_the_event_log_is_refused(self):
        files = Files(self)
        done = subprocess.run([sys.executable, TOOL, "--memory-viz", files.events, "--events", files.events,
                               files.log], capture_output=True, text=True, timeout=120)
        self.assertEqual((done.returncode, done.stderr),
                         (2, f"poolshim-report: error: --memory-viz {files.events} is the event log: refusing to "
                             "overwrite it\n"))

    def test_two_runs_with_event_logs_are_refused(self):
        recs = records()
        other = [dict(r, pid=5151) for r in recs]
        files = Files(self, recs=recs + other)
        self.assertEqual(self.error(files),
                         "poolshim-report: error: --memory-viz takes the log of the run that wrote the event log; "
                         f"these logs hold 2 runs with POOLSHIM_EVENTS set (pid 4242 in {files.log}, pid 5151 in "
                         f"{files.log}): give that run's log alone\n")


def _torch():
    try:
        from torch.cuda import _memory_viz  # noqa: F401
        return True
    except ImportError:
        return False


@unittest.skipUnless(_torch(), "torch is not importable here: torch.cuda._memory_viz is checked on a machine with "
                               "torch (python3 tests/gpu/memory_viz_check.py FILE.pickle)")
class Torch(unittest.TestCase):
    def test_torch_memory_viz_renders_the_snapshot(self):
        snap = pickle.loads(Files(self).snapshot(self))
        lines = memory_viz_check.check_torch(snap)
        self.assertTrue(any(line.startswith("torch.cuda._memory_viz.trace_plot: ") for line in lines), lines)
        self.assertIn("  total_reserved: 2.0MiB", lines)   # segsum: 8 KiB + 4 KiB + 2 MiB


if __name__ == "__main__":
    unittest.main()
