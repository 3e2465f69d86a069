#!/usr/bin/env python3
"""scripts/poolshim-replay over the CPU test double (README "Replaying an event log"): exact
figures of a known event log under two option sets, the rows it skips and counts, an
out-of-memory error during a replay, the round trip (a program's event log recorded under the
shim replays to the recorded run's peaks), and the errors with their exit statuses. The
source tree's script runs with POOLSHIM_BUILD_DIR naming the build, as on the GPU machine.

    test_replay.py --build BUILD
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from harness import clean_environment, poolshim_log, sanitizer_runtime, unittest_main_with_options  # noqa: E402

ARGS = None
REPLAY = os.path.join(ROOT, "scripts", "poolshim-replay")
MiB = 1 << 20
HEADER = "Thread,Time,Action,Pointer,Size,Stream,Device,Site,T"


def row(action, pointer, size, stream=0, device=0):
    return f"7,12:00:00.000000,{action},{pointer:#x},{size},{stream:#x},{device},0,0.000000001"


# Two large blocks live together, then freed: 30 MiB at 0x10000000, 12 MiB at 0x20000000.
TWO_BLOCKS = [row("allocate", 0x10000000, 30 * MiB), row("allocate", 0x20000000, 12 * MiB),
              row("free", 0x10000000, 30 * MiB), row("free", 0x20000000, 12 * MiB)]


class ReplayCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="poolshim-replay-test-")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def env(self, **extra):
        env = clean_environment()
        env.update(LD_LIBRARY_PATH=os.path.join(ARGS.build, "double"), CUDADOUBLE_MEM="1G", CUDADOUBLE_DEVICES="1",
                   POOLSHIM_BUILD_DIR=ARGS.build)
        runtime = sanitizer_runtime(ARGS.build)
        if runtime:   # a sanitizer build's library needs its runtime first (preload_list keeps it there)
            env["LD_PRELOAD"] = runtime
            env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
        env.update(extra)
        return env

    def write_log(self, rows, name="events.csv", header=HEADER):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write("\n".join([header] + rows) + "\n")
        return path

    def replay(self, *args, env=None):
        return subprocess.run([REPLAY, *args], env=env or self.env(), cwd=self.tmp, capture_output=True, text=True,
                              timeout=120)

    def replay_json(self, *args, env=None):
        out = os.path.join(self.tmp, "replay.json")
        done = self.replay(*args, "--json", out, env=env)
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(out) as f:
            return done, json.load(f)

    def peaks(self, run):
        return run["reserved_bytes_peak"], run["used_bytes_peak"], run["requested_bytes_peak"]


class Figures(ReplayCase):
    def test_paged_arena_against_segments_peaks_are_exact(self):
        # Requests over 1 MiB go to the paged large arena (DESIGN §7, page=20M by default): the
        # 30 MiB block at the start of its range, the 12 MiB one right after it (30 to 42 MiB),
        # so that the pages under them are 0-20, 20-40 and 40-60 MiB: 60 MiB reserved and used
        # for 42 MiB requested. With page=0 a request over 10 MiB takes a segment of its own,
        # rounded to 2 MiB: 30 + 12 = 42 MiB, nothing more.
        events = self.write_log(TWO_BLOCKS)
        done, doc = self.replay_json(events, "--conf", "page=20M", "--conf", "page=0")
        first, second = doc["runs"]
        self.assertEqual((first["options"], first["conf"]), ("page=20M", {"page": "20M"}))
        self.assertEqual(self.peaks(first), (60 * MiB, 60 * MiB, 42 * MiB))
        self.assertAlmostEqual(first["fragmentation"], 1 - 42 / 60)
        self.assertEqual((second["options"], second["conf"]), ("page=0", {"page": "0"}))
        self.assertEqual(self.peaks(second), (42 * MiB, 42 * MiB, 42 * MiB))
        self.assertEqual(second["fragmentation"], 0.0)
        self.assertEqual(doc["fragmentation"], "1 - requested_bytes_peak / reserved_bytes_peak")
        for run in doc["runs"]:
            self.assertEqual((run["rows"], run["allocations"], run["frees"], run["replay_alloc_failures"],
                              run["replay_free_failures"], run["streams"], run["live_bytes_peak"], run["device"]),
                             (4, 2, 2, 0, 0, 0, 42 * MiB, 0))
            self.assertEqual((run["alloc"]["calls"], run["free"]["calls"]), (2, 2))
            self.assertLessEqual(run["alloc"]["median_ns"], run["alloc"]["p99_ns"])
            self.assertLessEqual(run["alloc"]["p99_ns"], run["alloc"]["total_ns"])
        # The table: a row per option set, its figures as the JSON's.
        lines = done.stdout.splitlines()
        self.assertEqual(re.split(r"\s{2,}", lines[0]),
                         ["options", "peak reserved", "peak used", "peak requested", "fragmentation", "alloc median",
                          "alloc total", "free median", "free total", "failures"])
        self.assertEqual([re.split(r"\s{2,}", line)[:5] + [line.split()[-1]] for line in lines[1:]],
                         [["page=20M", "60.0 MiB", "60.0 MiB", "42.0 MiB", "30.0%", "0"],
                          ["page=0", "42.0 MiB", "42.0 MiB", "42.0 MiB", "0.0%", "0"]])
        self.assertEqual(done.stderr.splitlines()[-1],
                         f"poolshim-replay: {events}: 4 rows on device 0 (2 allocations, 2 frees; skipped: 0 recorded "
                         "failures, 0 rows of other devices, 0 frees of unknown pointers), 2 option sets; lowest peak "
                         "reserved: page=0 (42.0 MiB)")

    def test_no_conf_is_one_run_with_the_defaults(self):
        done, doc = self.replay_json(self.write_log(TWO_BLOCKS))
        self.assertEqual([(r["options"], r["conf"]) for r in doc["runs"]], [("defaults", {})])
        self.assertEqual(self.peaks(doc["runs"][0]), (60 * MiB, 60 * MiB, 42 * MiB))

    def test_environment_options_are_not_passed_on(self):
        # Each option set is its --conf over the defaults: a POOLSHIM_PAGE of the caller's is not.
        _, doc = self.replay_json(self.write_log(TWO_BLOCKS), env=self.env(POOLSHIM_PAGE="0"))
        self.assertEqual(self.peaks(doc["runs"][0]), (60 * MiB, 60 * MiB, 42 * MiB))

    def test_failures_other_devices_and_unknown_frees_are_skipped_and_counted(self):
        rows = [row("allocate failure", 0, 8 * MiB), row("allocate", 0x40000000, 1 * MiB, device=1),
                TWO_BLOCKS[0], row("free", 0x40000000, 1 * MiB, device=1), row("free", 0x50000000, 4096),
                TWO_BLOCKS[2]]
        _, doc = self.replay_json(self.write_log(rows + [""]), "--conf", "page=0")
        run = doc["runs"][0]
        self.assertEqual((run["rows"], run["allocations"], run["frees"], run["recorded_failures_skipped"],
                          run["other_device_rows_skipped"], run["unknown_frees"], run["device"]),
                         (6, 1, 1, 1, 2, 1, 0))
        self.assertEqual(self.peaks(run), (30 * MiB, 30 * MiB, 30 * MiB))

    def test_device_option_replays_that_devices_rows(self):
        # The first row is device 1's, so by default device 1 (of two) replays; --device 0 takes
        # device 0's rows only.
        rows = [row("allocate", 0x40000000, 12 * MiB, device=1)] + TWO_BLOCKS
        env = self.env(CUDADOUBLE_DEVICES="2")
        _, doc = self.replay_json(self.write_log(rows), "--conf", "page=0", env=env)
        self.assertEqual((doc["runs"][0]["device"], doc["runs"][0]["other_device_rows_skipped"]), (1, 4))
        self.assertEqual(self.peaks(doc["runs"][0]), (12 * MiB, 12 * MiB, 12 * MiB))
        _, doc = self.replay_json(self.write_log(rows), "--conf", "page=0", "--device", "0", env=env)
        self.assertEqual((doc["runs"][0]["device"], doc["runs"][0]["other_device_rows_skipped"]), (0, 1))
        self.assertEqual(self.peaks(doc["runs"][0]), (42 * MiB, 42 * MiB, 42 * MiB))

    def test_streams_replay_with_cudamallocasync_on_a_stream_of_their_own(self):
        # Two recorded streams: two non-blocking streams; 1 MiB blocks from one 2 MiB segment.
        rows = [row("allocate", 0x1000, MiB // 2, stream=0x5000), row("allocate", 0x2000, MiB // 4, stream=0x6000),
                row("free", 0x1000, MiB // 2, stream=0x5000), row("free", 0x2000, MiB // 4, stream=0x6000)]
        _, doc = self.replay_json(self.write_log(rows))
        run = doc["runs"][0]
        self.assertEqual((run["streams"], run["allocations"], run["frees"], run["replay_alloc_failures"]), (2, 2, 2, 0))
        self.assertEqual(run["requested_bytes_peak"], 3 * MiB // 4)

    def test_out_of_memory_in_a_replay_is_counted_and_the_replay_goes_on(self):
        # 40 MiB of device memory: the 12 MiB block does not fit beside the 30 MiB one.
        done, doc = self.replay_json(self.write_log(TWO_BLOCKS), "--conf", "page=0", env=self.env(CUDADOUBLE_MEM="40M"))
        run = doc["runs"][0]
        self.assertEqual((run["allocations"], run["replay_alloc_failures"], run["frees"],
                          run["frees_of_failed_allocations"], run["first_error"], run["ooms"]),
                         (2, 1, 1, 1, "cudaMalloc: cudaErrorMemoryAllocation", 1))
        self.assertEqual(self.peaks(run), (30 * MiB, 30 * MiB, 30 * MiB))
        self.assertEqual(done.stdout.splitlines()[1].split()[-1], "1", "the failures column")
        # Over the double the line also says how to give its device more memory.
        self.assertTrue(done.stderr.splitlines()[-1].endswith(
            "; 1 allocation failed in the replays (cudaMalloc: cudaErrorMemoryAllocation); the CPU test "
            "double's device has 40.0 MiB: set CUDADOUBLE_MEM (a size, such as 16G) above the log's peak"),
            done.stderr)
        self.assertEqual(run["double_bytes"], 40 * MiB)


class RoundTrip(ReplayCase):
    """A program's event log, recorded under the shim with options X, replayed with X: the same
    peaks as the recorded run's exit record. Exact over the double: these programs allocate from
    one thread, the double's work completes at once (as the replay's: no kernels), and their
    runs are too short for the idle trim; the event log holds every pooled allocation and free
    (none dropped: event_log_dropped 0), so the heap sees the same sequence."""

    def record(self, args, conf, extra=None):
        log, events = os.path.join(self.tmp, "recorded.jsonl"), os.path.join(self.tmp, "recorded.csv")
        env = self.env(LD_PRELOAD=poolshim_log.preload_list(os.path.join(ARGS.build, "libpoolshim.so"),
                                                            self.env().get("LD_PRELOAD")),
                       POOLSHIM_LOG=log, POOLSHIM_EVENTS=events, **(extra or {}))
        for key, value in conf.items():
            env[f"POOLSHIM_{key.upper()}"] = value
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        ex = [r for r in poolshim_log.read_log(log) if r["type"] == "exit"][0]
        self.assertEqual(ex["event_log_dropped"], 0)
        return events, ex["devices"][0]

    def check(self, args, conf, wanted_reserved, streams):
        events, recorded = self.record(args, conf)
        text = ",".join(f"{k}={v}" for k, v in conf.items())
        _, doc = self.replay_json(events, *(["--conf", text] if text else []))
        run = doc["runs"][0]
        self.assertEqual(self.peaks(run), (recorded["reserved_bytes_peak"], recorded["used_bytes_peak"],
                                           recorded["requested_bytes_peak"]))
        self.assertEqual(run["reserved_bytes_peak"], wanted_reserved)
        self.assertEqual((run["allocations"], run["frees"], run["streams"], run["unknown_frees"]),
                         (recorded["allocs"], recorded["frees"], streams, 0))
        self.assertEqual(run["live_bytes_peak"], recorded["requested_bytes_peak"])

    def test_demo_cudamalloc_and_cudafree_with_the_defaults(self):
        # The demo's 3 MiB and 256 KiB blocks: one 20 MiB page and one 2 MiB segment.
        self.check([os.path.join(ARGS.build, "programs", "demo"), "10", "65536"], {}, 22 * MiB, 0)

    def test_churn_on_a_non_blocking_stream_with_page_0(self):
        self.check([os.path.join(ARGS.build, "programs", "churn"), "2000", "16", str(4 * MiB), "async"],
                   {"page": "0", "cache": "32M"}, 28 * MiB, 1)


class Errors(ReplayCase):
    def check_error(self, args, status, last_line, env=None):
        done = self.replay(*args, env=env)
        self.assertEqual((done.returncode, done.stdout), (status, ""), done.stderr)
        self.assertEqual(done.stderr.splitlines()[-1], last_line)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "replay.json")), "a --json file was written")
        return done

    def test_a_missing_event_log(self):
        missing = os.path.join(self.tmp, "none.csv")
        self.check_error([missing, "--json", "replay.json"], 2,
                         f"poolshim-replay: error: {missing}: cannot read: No such file or directory")

    def test_a_malformed_row_names_its_line(self):
        rows = TWO_BLOCKS[:2] + ["7,12:00:00.000000,allocate,0x30000000,12x,0x0,0,0,0.1"]
        path = self.write_log(rows)
        self.check_error([path, "--json", "replay.json"], 2,
                         f"poolshim-replay: error: {path}:4: Size '12x' is not a decimal byte count")
        for bad, why in (("7,t,allocate,30000000,1,0x0,0,0,0", "Pointer '30000000' is not 0x and hex digits"),
                         ("7,t,release,0x3,1,0x0,0,0,0", "Action 'release' is not allocate, free or allocate failure"),
                         ("7,t,free,0x3,1,0x0", "6 cells, the header's columns need 7"),
                         ("7,t,free,0x3,1,0x0,-1,0,0", "Device '-1' is not a device ordinal")):
            with self.subTest(row=bad):
                path = self.write_log([TWO_BLOCKS[0], bad], "bad.csv")
                self.check_error([path], 2, f"poolshim-replay: error: {path}:3: {why}")

    def test_a_file_that_is_not_an_event_log(self):
        path = self.write_log(["1,2"], header="a,b")
        self.check_error([path], 2, f"poolshim-replay: error: {path}:1: not an event log: the header has no Action, "
                         "Pointer, Size, Stream column (POOLSHIM_EVENTS writes Thread,Time,Action,Pointer,Size,Stream,"
                         "Device,Site,T)")

    def test_an_unknown_option_is_refused_before_any_replay(self):
        done = self.check_error([self.write_log(TWO_BLOCKS), "--conf", "page=0", "--conf", "pag=0"], 2,
                                "poolshim: error: POOLSHIM_STRICT is set and the configuration has problems; "
                                "refusing to start")
        self.assertIn("poolshim-replay: error: --conf pag=0: an unknown option or a bad value; the library says:\n"
                      "poolshim: error: POOLSHIM_PAG is not a poolshim option (did you mean POOLSHIM_PAGE?)\n",
                      done.stderr)
        self.assertNotIn("replaying", done.stderr)

    def test_a_bad_value_is_refused(self):
        done = self.check_error([self.write_log(TWO_BLOCKS), "--conf", "free=fast"], 2,
                                "poolshim: error: POOLSHIM_STRICT is set and the configuration has problems; "
                                "refusing to start")
        self.assertIn('POOLSHIM_FREE="fast" is not one of', done.stderr)

    def test_options_the_replay_sets_itself_and_items_without_a_value_are_usage_errors(self):
        for conf, why in (("log=x.jsonl", "--conf log=x.jsonl: log is set by poolshim-replay itself (POOLSHIM_LOG)"),
                          ("strict=0", "--conf strict=0: strict is set by poolshim-replay itself (POOLSHIM_STRICT)"),
                          ("page", "--conf page: 'page' is not key=value"),
                          ("a b=1", "--conf a b=1: 'a b' is not an option name (README \"Options\", poolshim(7))")):
            with self.subTest(conf=conf):
                self.check_error([self.write_log(TWO_BLOCKS), "--conf", conf], 2, f"poolshim-replay: error: {why}")

    def test_no_library_in_the_build_folder(self):
        empty = os.path.join(self.tmp, "empty")
        os.mkdir(empty)
        self.check_error([self.write_log(TWO_BLOCKS)], 2,
                         f"poolshim-replay: error: libpoolshim.so not found at {empty}/libpoolshim.so: build it with "
                         "scripts/build (POOLSHIM_BUILD_DIR names another build folder), or set POOLSHIM_LIBRARY",
                         env=self.env(POOLSHIM_BUILD_DIR=empty))

    def test_no_device_is_exit_status_1(self):
        self.check_error([self.write_log(TWO_BLOCKS), "--device", "3"], 1,
                         "poolshim-replay: error: [1/1] defaults: the replay failed (exit status 1): cannot replay on "
                         "device 3: cudaErrorInvalidDevice (1 devices)")

    def test_no_driver_names_the_double(self):
        # The toolkit's real runtime (the one the build linked) without a driver: no device at all.
        with open(os.path.join(ARGS.build, "CMakeCache.txt")) as f:
            cudart = re.search(r"^CUDA_cudart_LIBRARY:FILEPATH=(.*)$", f.read(), re.MULTILINE).group(1)
        env = self.env(LD_LIBRARY_PATH=os.path.dirname(os.path.realpath(cudart)))
        probe = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libcuda.so.1')"], env=env,
                               capture_output=True)
        if probe.returncode == 0:
            self.skipTest("this machine has a CUDA driver")
        done = self.replay(self.write_log(TWO_BLOCKS), env=env)
        self.assertEqual(done.returncode, 1, done.stderr)
        self.assertRegex(done.stderr.splitlines()[-1],
                         r"^poolshim-replay: error: \[1/1\] defaults: the replay failed \(exit status 1\): cannot "
                         r"replay on device 0: cuda\w+ \(0 devices\); over the CPU test double, run with "
                         + re.escape(f"LD_LIBRARY_PATH={os.path.join(ARGS.build, 'double')}") + "$")


def main():
    unittest_main_with_options(__doc__, ("build",), globals())


if __name__ == "__main__":
    main()
