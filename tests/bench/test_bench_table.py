#!/usr/bin/env python3
"""The benchmark suite's arithmetic (tests/bench/bench_table.py) on a fixture of raw runs:
exact medians, spreads, ratios from medians, the table text and every target's verdict. No GPU.

    python3 tests/bench/test_bench_table.py
"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
import bench_table as bt  # noqa: E402
import run_bench  # noqa: E402
import memory_sections  # noqa: E402

GROUPS = [
    bt.Group(bt.CHURN_64, "churn", "us_per_pair", "us per pair", bt.NATIVE, bt.BASE_OVER_THIS,
             [bt.NATIVE, bt.SHIM_SYNC, bt.SHIM_ORDERED]),
    bt.Group(bt.ASYNC_64, "async", "us_per_pair", "us per pair", bt.DIRECT_POOL, bt.THIS_OVER_BASE,
             [bt.DIRECT_POOL, bt.SHIM_SYNC], digits=3),
    *[bt.Group(bt.threads_group(n), "threads", "mpairs_per_s", "M pairs/s", bt.DIRECT_POOL, bt.THIS_OVER_BASE,
               [bt.DIRECT_POOL, bt.SHIM_SYNC], digits=3, higher_is_better=True) for n in bt.THREAD_COUNTS],
    bt.Group(bt.TORCH, "torch", "step_ms", "ms per step", bt.TORCH_CACHING, bt.THIS_OVER_BASE,
             [bt.TORCH_CACHING, bt.TORCH_ASYNC_BACKEND, bt.TORCH_UNCACHED, bt.TORCH_UNCACHED_ORDERED],
             extras=(("peak_reserved_mb", "peak reserved MB", 0),)),
    bt.Group(bt.OBSERVE_CHURN, "observability", "us_per_pair", "us per pair", bt.LOG_OFF, bt.COST_PERCENT,
             [bt.LOG_OFF, bt.LOG_100MS, bt.BACKTRACE_8], show_delta=True),
    bt.Group(bt.OBSERVE_TORCH, "observability", "step_ms", "ms per step", bt.LOG_OFF, bt.COST_PERCENT,
             [bt.LOG_OFF, bt.LOG_100MS, bt.BACKTRACE_8], show_delta=True),
]

# (group, contender, metric) -> one value per round. Values are exact in binary floating point.
RAW = {
    (bt.CHURN_64, bt.NATIVE, "us_per_pair"): [40.0, 36.0, 44.0],
    (bt.CHURN_64, bt.SHIM_SYNC, "us_per_pair"): [4.0, 5.0, 3.0],
    (bt.CHURN_64, bt.SHIM_ORDERED, "us_per_pair"): [1.25, 1.0, 2.0],
    (bt.ASYNC_64, bt.DIRECT_POOL, "us_per_pair"): [4.0, 4.0, 3.0],
    (bt.ASYNC_64, bt.SHIM_SYNC, "us_per_pair"): [4.5, 4.25, 5.0],
    (bt.threads_group(1), bt.DIRECT_POOL, "mpairs_per_s"): [1.0, 0.5],
    (bt.threads_group(1), bt.SHIM_SYNC, "mpairs_per_s"): [2.0, 2.0],
    (bt.threads_group(2), bt.DIRECT_POOL, "mpairs_per_s"): [0.25, 0.25],
    (bt.threads_group(2), bt.SHIM_SYNC, "mpairs_per_s"): [2.0, 2.0],
    (bt.threads_group(4), bt.DIRECT_POOL, "mpairs_per_s"): [0.25, 0.25],
    (bt.threads_group(4), bt.SHIM_SYNC, "mpairs_per_s"): [2.5, 2.5],
    (bt.threads_group(8), bt.DIRECT_POOL, "mpairs_per_s"): [0.125, 0.25],
    (bt.threads_group(8), bt.SHIM_SYNC, "mpairs_per_s"): [4.0, 2.0],
    (bt.threads_group(16), bt.DIRECT_POOL, "mpairs_per_s"): [0.25, 0.25],
    (bt.threads_group(16), bt.SHIM_SYNC, "mpairs_per_s"): [0.125, 0.125],
    (bt.TORCH, bt.TORCH_CACHING, "step_ms"): [16.0, 14.0],
    (bt.TORCH, bt.TORCH_CACHING, "peak_reserved_mb"): [2316.0, 2316.0],
    (bt.TORCH, bt.TORCH_ASYNC_BACKEND, "step_ms"): [14.0, 14.0],
    (bt.TORCH, bt.TORCH_ASYNC_BACKEND, "peak_reserved_mb"): [1728.0, 1728.0],
    (bt.TORCH, bt.TORCH_UNCACHED, "step_ms"): [72.0, 70.0],
    (bt.TORCH, bt.TORCH_UNCACHED, "peak_reserved_mb"): [None, None],
    (bt.TORCH, bt.TORCH_UNCACHED_ORDERED, "step_ms"): [15.0, 13.0],
    (bt.TORCH, bt.TORCH_UNCACHED_ORDERED, "peak_reserved_mb"): [1536.0, 1600.0],
    (bt.OBSERVE_CHURN, bt.LOG_OFF, "us_per_pair"): [4.0, 4.0, 4.0],
    (bt.OBSERVE_CHURN, bt.LOG_100MS, "us_per_pair"): [4.0, 4.125, 4.0],
    (bt.OBSERVE_CHURN, bt.BACKTRACE_8, "us_per_pair"): [5.0, 6.0, 5.5],
    (bt.OBSERVE_TORCH, bt.LOG_OFF, "step_ms"): [16.0, 16.0],
    (bt.OBSERVE_TORCH, bt.LOG_100MS, "step_ms"): [16.5, 16.5],
    (bt.OBSERVE_TORCH, bt.BACKTRACE_8, "step_ms"): [17.0, 16.0],
}


def samples(raw=RAW):
    return [{"group": g, "contender": c, "metric": m, "value": v, "round": i + 1}
            for (g, c, m), values in raw.items() for i, v in enumerate(values)]


def verdicts_by_text(verdicts):
    return {v["target"]: v for v in verdicts}


class Summaries(unittest.TestCase):
    def test_median_and_spread_of_odd_rounds(self):
        self.assertEqual(bt.summarize([40.0, 36.0, 44.0]), {"median": 40.0, "min": 36.0, "max": 44.0, "n": 3})

    def test_median_of_two_rounds_is_their_mean(self):
        self.assertEqual(bt.summarize([16.0, 14.0])["median"], 15.0)

    def test_missing_values_are_left_out_and_all_missing_is_none(self):
        self.assertEqual(bt.summarize([None, 2.0, 4.0]), {"median": 3.0, "min": 2.0, "max": 4.0, "n": 2})
        self.assertIsNone(bt.summarize([None, None]))
        self.assertIsNone(bt.summarize([]))

    def test_ratio_kinds(self):
        self.assertEqual(bt.ratio_of(bt.BASE_OVER_THIS, 4.0, 40.0), 10.0)
        self.assertEqual(bt.ratio_of(bt.THIS_OVER_BASE, 4.5, 4.0), 1.125)
        self.assertEqual(bt.ratio_of(bt.COST_PERCENT, 4.5, 4.0), 12.5)
        self.assertIsNone(bt.ratio_of(bt.BASE_OVER_THIS, 0.0, 40.0))
        self.assertIsNone(bt.ratio_of(bt.THIS_OVER_BASE, 1.0, 0.0))
        self.assertIsNone(bt.ratio_of(bt.THIS_OVER_BASE, None, 1.0))


class Rows(unittest.TestCase):
    def setUp(self):
        self.rows = bt.all_rows(GROUPS, samples())

    def test_churn_speed_up_is_the_ratio_of_medians(self):
        native = self.rows[(bt.CHURN_64, bt.NATIVE)]
        sync = self.rows[(bt.CHURN_64, bt.SHIM_SYNC)]
        ordered = self.rows[(bt.CHURN_64, bt.SHIM_ORDERED)]
        self.assertEqual((native["median"], native["min"], native["max"], native["n"]), (40.0, 36.0, 44.0, 3))
        self.assertEqual(native["ratio"], 1.0)
        self.assertEqual((sync["median"], sync["min"], sync["max"]), (4.0, 3.0, 5.0))
        self.assertEqual(sync["ratio"], 10.0)
        self.assertEqual(ordered["median"], 1.25)
        self.assertEqual(ordered["ratio"], 32.0)

    def test_async_ratio_is_shim_over_direct_pool(self):
        self.assertEqual(self.rows[(bt.ASYNC_64, bt.SHIM_SYNC)]["ratio"], 1.125)

    def test_threads_ratio_is_throughput_over_direct_pool(self):
        self.assertEqual(self.rows[(bt.threads_group(1), bt.DIRECT_POOL)]["median"], 0.75)
        self.assertEqual(self.rows[(bt.threads_group(8), bt.SHIM_SYNC)]["median"], 3.0)
        self.assertEqual(self.rows[(bt.threads_group(8), bt.SHIM_SYNC)]["ratio"], 3.0 / 0.1875)
        self.assertEqual(self.rows[(bt.threads_group(16), bt.SHIM_SYNC)]["ratio"], 0.5)

    def test_torch_peak_reserved_is_a_median_and_na_when_absent(self):
        self.assertEqual(self.rows[(bt.TORCH, bt.TORCH_UNCACHED_ORDERED)]["extras"], {"peak_reserved_mb": 1568.0})
        self.assertEqual(self.rows[(bt.TORCH, bt.TORCH_UNCACHED)]["extras"], {"peak_reserved_mb": None})
        self.assertEqual(self.rows[(bt.TORCH, bt.TORCH_UNCACHED_ORDERED)]["ratio"], 14.0 / 15.0)

    def test_observability_cost_and_delta_per_allocation(self):
        log = self.rows[(bt.OBSERVE_CHURN, bt.LOG_100MS)]
        backtrace = self.rows[(bt.OBSERVE_CHURN, bt.BACKTRACE_8)]
        self.assertEqual((log["ratio"], log["delta"]), (0.0, 0.0))
        self.assertEqual((backtrace["median"], backtrace["ratio"], backtrace["delta"]), (5.5, 37.5, 1.5))
        self.assertEqual(self.rows[(bt.OBSERVE_TORCH, bt.LOG_100MS)]["ratio"], 3.125)

    def test_contender_without_runs_has_an_empty_row(self):
        row = bt.group_rows(GROUPS[0], [s for s in samples() if s["contender"] != bt.SHIM_ORDERED])[2]
        self.assertEqual((row["median"], row["min"], row["n"], row["ratio"]), (None, None, 0, None))

    def test_no_baseline_means_no_ratio(self):
        rows = bt.group_rows(GROUPS[0], [s for s in samples() if s["contender"] != bt.NATIVE])
        self.assertEqual([r["ratio"] for r in rows], [None, None, None])


class Table(unittest.TestCase):
    def test_churn_section(self):
        rows = bt.group_rows(GROUPS[0], samples())
        text = bt.render_group(GROUPS[0], rows, notes=["shim sync: pooled 10064"])
        lines = text.splitlines()
        self.assertEqual(lines[0],
                         "== churn 64 live: us per pair (lower is better); ratio = native / contender (speed-up)")
        self.assertEqual(lines[1].split(), ["contender", "median", "spread", "(min-max)", "runs", "ratio"])
        self.assertEqual(lines[2].split(), ["native", "40.00", "36.00-44.00", "3", "1.00x"])
        self.assertEqual(lines[3].split(), ["shim", "sync", "4.00", "3.00-5.00", "3", "10.00x"])
        self.assertEqual(lines[4].split(), ["shim", "ordered", "1.25", "1.00-2.00", "3", "32.00x"])
        self.assertEqual(lines[5], "   note: shim sync: pooled 10064")

    def test_torch_section_shows_na_and_peaks(self):
        group = GROUPS[-3]
        lines = bt.render_group(group, bt.group_rows(group, samples())).splitlines()
        self.assertEqual(lines[1].split()[-3:], ["peak", "reserved", "MB"])
        self.assertEqual(lines[4].split(), ["uncached", "71.00", "70.00-72.00", "2", "4.733", "n/a"])
        self.assertEqual(lines[5].split(), ["uncached", "+", "shim", "ordered", "14.00", "13.00-15.00", "2", "0.933",
                                            "1568"])

    def test_observability_section_shows_cost_and_delta(self):
        group = GROUPS[-2]
        lines = bt.render_group(group, bt.group_rows(group, samples())).splitlines()
        self.assertEqual(lines[1].split()[-2:], ["cost", "delta"])
        self.assertEqual(lines[4].split(), ["backtrace", "8", "5.50", "5.00-6.00", "3", "+37.5%", "+1.50"])

    def test_broken_status_is_shown(self):
        text = bt.render_group(GROUPS[-3], bt.group_rows(GROUPS[-3], []), status="BROKEN: LOSSES DIFFER")
        self.assertIn("   !! BROKEN: LOSSES DIFFER", text.splitlines())
        self.assertEqual(text.splitlines()[3].split(), ["native", "caching", "n/a", "n/a", "0", "n/a", "n/a"])


class Targets(unittest.TestCase):
    def verdicts(self, raw=RAW, broken=()):
        return verdicts_by_text(bt.evaluate_targets(bt.ISSUE_TARGETS, bt.all_rows(GROUPS, samples(raw)), broken))

    def test_every_verdict_of_the_fixture(self):
        got = {text: (v["verdict"], v["value"]) for text, v in self.verdicts().items()}
        self.assertEqual(got, {
            "churn 64 live: shim sync at least 10x faster than native": (bt.MET, 10.0),
            "churn 64 live: shim ordered at least 30x faster than native": (bt.MET, 32.0),
            "async: shim cudaMallocAsync+cudaFreeAsync at most 1.05x direct cudaMallocFromPoolAsync":
                (bt.NOT_MET, 1.125),
            "threads: shim aggregate at 8 threads at least 4x the 1-thread direct-pool rate": (bt.MET, 4.0),
            "threads (issue 13): shim aggregate at 8 threads at least 4x the shim's own 1-thread rate":
                (bt.NOT_MET, 1.5),
            "threads: shim at least the direct pool's rate at every thread count": (bt.NOT_MET, 0.5),
            "PyTorch uncached + shim ordered: step time at most 1.0x PyTorch's native caching allocator":
                (bt.MET, 14.0 / 15.0),
            "PyTorch uncached + shim ordered: peak reserved at most backend:cudaMallocAsync's":
                (bt.MET, 1568.0 / 1728.0),
            "logging every 100 ms costs at most 2% (churn 64 live)": (bt.MET, 0.0),
            "logging every 100 ms costs at most 2% (PyTorch uncached + shim ordered)": (bt.NOT_MET, 3.125),
            "POOLSHIM_BACKTRACE=8 costs at most 1.5 us per allocation (churn 64 live)": (bt.MET, 1.5),
        })

    def test_figures_name_what_was_measured(self):
        v = self.verdicts()
        self.assertEqual(v["threads: shim at least the direct pool's rate at every thread count"]["figure"],
                         "lowest 0.500 at threads 16")
        self.assertEqual(v["threads: shim aggregate at 8 threads at least 4x the 1-thread direct-pool rate"]["figure"],
                         "4.00x (shim sync threads 8: 3.000 / direct pool threads 1: 0.750)")
        self.assertEqual(v["threads (issue 13): shim aggregate at 8 threads at least 4x the shim's own 1-thread "
                           "rate"]["figure"], "1.50x (shim sync threads 8: 3.000 / shim sync threads 1: 2.000)")
        self.assertEqual(v["POOLSHIM_BACKTRACE=8 costs at most 1.5 us per allocation (churn 64 live)"]["figure"],
                         "+1.50 us per allocation (observability: churn 64 live, backtrace 8)")

    def test_just_over_a_limit_is_not_met(self):
        raw = dict(RAW)
        raw[(bt.CHURN_64, bt.SHIM_SYNC, "us_per_pair")] = [4.0625, 4.0625, 4.0625]  # 9.85x
        raw[(bt.OBSERVE_CHURN, bt.BACKTRACE_8, "us_per_pair")] = [5.5625, 5.5625]    # +1.5625 us
        v = self.verdicts(raw)
        self.assertEqual(v["churn 64 live: shim sync at least 10x faster than native"]["verdict"], bt.NOT_MET)
        self.assertEqual(v["POOLSHIM_BACKTRACE=8 costs at most 1.5 us per allocation (churn 64 live)"]["verdict"],
                         bt.NOT_MET)

    def test_broken_or_missing_workloads_are_not_measured(self):
        raw = {k: v for k, v in RAW.items() if k[0] != bt.threads_group(16)}
        v = self.verdicts(raw, broken={bt.TORCH})
        self.assertEqual(v["threads: shim at least the direct pool's rate at every thread count"]["verdict"],
                         bt.NOT_MEASURED)
        self.assertEqual(v["threads: shim at least the direct pool's rate at every thread count"]["figure"],
                         "threads 16 not measured")
        for text in ("PyTorch uncached + shim ordered: step time at most 1.0x PyTorch's native caching allocator",
                     "PyTorch uncached + shim ordered: peak reserved at most backend:cudaMallocAsync's"):
            self.assertEqual(v[text]["verdict"], bt.NOT_MEASURED)
        self.assertEqual(v["churn 64 live: shim sync at least 10x faster than native"]["verdict"], bt.MET)

    def test_targets_section(self):
        text = bt.render_targets(bt.evaluate_targets(bt.ISSUE_TARGETS[:3], bt.all_rows(GROUPS, samples())))
        self.assertEqual(text.splitlines(), [
            "== targets (issue 6; one of issue 13)",
            "   MET      churn 64 live: shim sync at least 10x faster than native: 10.00x (churn 64 live, shim sync)",
            "   MET      churn 64 live: shim ordered at least 30x faster than native: "
            "32.00x (churn 64 live, shim ordered)",
            "   NOT MET  async: shim cudaMallocAsync+cudaFreeAsync at most 1.05x direct cudaMallocFromPoolAsync: "
            "1.125 (async 64 live, shim sync)",
        ])


class RunnerAgreesWithTargets(unittest.TestCase):
    """Every group and contender a target reads is one the runner measures."""

    def test_targets_read_what_the_runner_makes(self):
        workloads = run_bench.make_workloads(run_bench.FULL, "/nonexistent", run_bench.WORKLOADS)
        made = {(g.name, c) for w in workloads for g in w.groups for c in g.contenders}
        made_by_runs = set()
        for w in workloads:
            for run in w.runs:
                for g in w.groups:
                    made_by_runs.add((g.name, run.contender))
        for t in bt.ISSUE_TARGETS:
            p = t.params
            pairs = []
            if "group" in p:
                pairs.append((p["group"], p["contender"]))
                if "other" in p:
                    pairs.append((p["group"], p["other"]))
            if "numerator" in p:
                pairs += [p["numerator"], p["denominator"]]
            for g in p.get("groups", []):
                pairs.append((g, p["contender"]))
            for pair in pairs:
                self.assertIn(pair, made, t.text)
                self.assertIn(pair, made_by_runs, t.text)

    def test_each_group_contender_has_a_run(self):
        for w in run_bench.make_workloads(run_bench.FULL, "/nonexistent", run_bench.WORKLOADS):
            contenders = {run.contender for run in w.runs}
            for g in w.groups:
                self.assertTrue(set(g.contenders) <= contenders, (w.name, g.name))
                self.assertIn(g.baseline, g.contenders, g.name)

    def test_quick_settings_keep_every_workload(self):
        names = [w.name for w in run_bench.make_workloads(run_bench.QUICK, "/nonexistent", run_bench.WORKLOADS)]
        self.assertEqual(names, list(run_bench.WORKLOADS))

    def test_event_log_contender_writes_its_file_into_the_runs_own_folder(self):
        import tempfile
        w = [w for w in run_bench.make_workloads(run_bench.QUICK, "/nonexistent", ["observability"])
             if w.name == "observability"][0]
        runs = [r for r in w.runs if r.contender == bt.EVENT_LOG]
        self.assertEqual([r.label for r in runs], ["churn / event log", "torch / event log"])
        with tempfile.TemporaryDirectory() as out:
            bench = run_bench.Bench(type("Args", (), {"build": out, "out": out}), run_bench.QUICK)
            folder = os.path.join(out, "r1")
            env = bench.prepare(folder, runs[0].env, True)
        self.assertEqual(env["POOLSHIM_EVENTS"], os.path.join(folder, "events-%p.csv"))
        self.assertEqual(env["POOLSHIM_LOG"], "")
        self.assertEqual(env["POOLSHIM_FREE"], "sync")


class LossesVerdict(unittest.TestCase):
    """The footprint section's loss check: a difference counts only when the native runs agree."""

    def test_identical(self):
        self.assertEqual(memory_sections._losses_verdict([["a"], ["a"]], [["a"], ["a"], ["a"]]), "identical")

    def test_native_runs_disagree(self):
        self.assertEqual(memory_sections._losses_verdict([["a"], ["b"]], [["a"], ["b"], ["a"]]),
                         "not comparable (the runs without the shim differ among themselves)")

    def test_shim_differs(self):
        self.assertTrue(memory_sections._losses_verdict([["a"], ["a"]], [["a"], ["a"], ["b"]]).startswith("DIFFER"))


class FootprintTargets(unittest.TestCase):
    """Issue 13's churn targets, from a footprint section's rows (the H100 figures of 2026-12-07)."""

    def test_churn_speed_ups_and_reserved_peaks(self):
        def row(speed, reserved_over_live):
            return {"speed": speed, "reserved_over_live": reserved_over_live, "over_uncached": None}
        raw = {"churn": {"rows": {memory_sections.NATIVE: row(40.515, None),
                                  memory_sections.C_DEFAULT: row(1.292, 1.173),
                                  memory_sections.C_ORDERED: row(0.7, 1.157)}}}
        self.assertEqual(memory_sections.footprint_targets(raw), [
            "targets (issue 13):",
            "   churn 64 live, poolshim defaults (auto: sync): pool reserved peak 1.173x the live peak "
            "(target <= 1.10x): NOT MET",
            "   churn 64 live, poolshim ordered: pool reserved peak 1.157x the live peak (target <= 1.10x): NOT MET",
            "   churn 64 live, poolshim defaults (auto: sync): 31.4x faster than native (40.515 / 1.292 us a pair; "
            "target >= 28x): met",
            "   churn 64 live, poolshim ordered: 57.9x faster than native (40.515 / 0.700 us a pair; "
            "target >= 52x): met",
        ])


if __name__ == "__main__":
    unittest.main(verbosity=2)
