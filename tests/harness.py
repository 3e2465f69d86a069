"""Helpers shared by the end-to-end tests (tests/e2e) and the GPU tests (tests/gpu): running a
program with and without the shim, comparing, and reading its log."""

import glob
import re
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import poolshim_log  # noqa: E402,F401  (re-exported for the test scripts)


class Failure(AssertionError):
    pass


def expect(condition, message):
    if not condition:
        raise Failure(message)


def expect_equal(actual, wanted, what):
    if actual != wanted:
        raise Failure(f"{what}: got {actual!r}, wanted {wanted!r}")


class Result:
    def __init__(self, rc, out, err):
        self.rc, self.out, self.err = rc, out, err

    def describe(self):
        return f"exit {self.rc}\n--- stdout\n{self.out}--- stderr\n{self.err}"


# In a sanitizer build (scripts/test --sanitize) this variable names the sanitizer's runtime:
# it must come first in LD_PRELOAD, and any report it prints fails the run, even where the
# native and the shim runs would agree (both fail the same way when the double has the bug).
SANITIZER_RUNTIME = "E2E_SANITIZER_RUNTIME"
SANITIZER_REPORTS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "WARNING: ThreadSanitizer",
                     "ThreadSanitizer:", "AddressSanitizer:", "runtime error:")


def sanitizer_runtime(build):
    """The sanitizer runtime of a sanitizer build (CMake writes its path), else None."""
    path = os.path.join(build, "sanitizer-preload")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read().strip() or None


def _sanitized(args, env):
    """`env` with a sanitizer build's runtime first in the preload."""
    runtime = env.get(SANITIZER_RUNTIME)
    if runtime and env.get("LD_PRELOAD") and env["LD_PRELOAD"].split(":")[0] != runtime:
        env = dict(env, LD_PRELOAD=runtime + ":" + env["LD_PRELOAD"])
    if runtime and os.path.basename(args[0]).startswith("python"):
        # The interpreter does not free its own objects at exit: not ours to report.
        env = dict(env, ASAN_OPTIONS=env.get("ASAN_OPTIONS", "") + ":detect_leaks=0")
    return env


def _no_sanitizer_reports(args, env, stderr):
    if env.get(SANITIZER_RUNTIME):
        reports = [line for line in stderr.splitlines() if any(r in line for r in SANITIZER_REPORTS)]
        expect(not reports, f"{' '.join(args)}: sanitizer report(s):\n" + "\n".join(reports[:5]) +
               f"\n--- stderr\n{stderr[-6000:]}")


def run_process(args, env, timeout=60):
    env = _sanitized(args, env)
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    _no_sanitizer_reports(args, env, done.stderr)
    return Result(done.returncode, done.stdout, done.stderr)


def talk_to_process(args, env, talk, timeout=60):
    """Runs `args` with pipes on stdin, stdout and stderr; `talk(proc)` reads and writes them
    while it runs. The Result holds what was left to read once `talk` returned."""
    env = _sanitized(args, env)
    proc = subprocess.Popen(args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        talk(proc)
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    _no_sanitizer_reports(args, env, err)
    return Result(proc.returncode, out, err)


def clean_environment():
    """The caller's environment without poolshim's variables or a preload."""
    return {k: v for k, v in os.environ.items() if not k.startswith("POOLSHIM_") and k != "LD_PRELOAD"}


def with_shim(env, library, log_template):
    env = dict(env)
    env["LD_PRELOAD"] = library
    # POOLSHIM_TEST_CONF: options for every run under the shim (a suite run with, say,
    # page=20M), as POOLSHIM_CONF unless a case sets its own.
    extra = os.environ.get("POOLSHIM_TEST_CONF")
    if extra and "POOLSHIM_CONF" not in env:
        env["POOLSHIM_CONF"] = extra
    if log_template is not None and "POOLSHIM_LOG" not in env:
        env["POOLSHIM_LOG"] = log_template
    return env


def compare(args, native, shim):
    expect(native.rc == shim.rc and native.out == shim.out,
           f"{' '.join(args)} differs with the shim\n=== native: {native.describe()}\n=== shim: {shim.describe()}")


def logs_in(folder, prefix="log-"):
    return sorted(glob.glob(os.path.join(folder, prefix + "*.jsonl")))


def records_of(records, kind):
    return [r for r in records if r["type"] == kind]


def exit_record(records):
    exits = records_of(records, "exit")
    expect(len(exits) == 1, f"expected one exit record, found {len(exits)}")
    return exits[0]


def exit_device(records, device=0):
    ex = exit_record(records)
    for d in ex["devices"]:
        if d["device"] == device:
            return ex, d
    raise Failure(f"exit record has no device {device}: {ex}")


def expect_exit_snapshot(ex, what):
    """The exit record is one snapshot: its devices' live allocations and requested bytes are
    exactly what its leak report lists."""
    live = (sum(d["live_allocs"] for d in ex["devices"]), sum(d["requested_bytes"] for d in ex["devices"]))
    expect_equal(live, (ex["leaks"]["count"], ex["leaks"]["bytes"]), f"exit record against its leak report ({what})")
    return live


def parse_fields(line):
    """{'a': '1'} from 'name: a=1 b=2'."""
    return dict(piece.split("=", 1) for piece in line.split() if "=" in piece)


# The variants of every hooked driver entry point: what the real (double) driver answers for a
# name, version and flags is the variant; the shim hands back its hook of exactly that variant.
HOOKED_VARIANTS = {
    "cuMemAlloc_v2", "cuMemFree_v2", "cuMemGetInfo_v2", "cuMemAllocAsync", "cuMemAllocAsync_ptsz",
    "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz",
    "cuDeviceSetMemPool", "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2", "cuStreamCreate",
    "cuStreamCreateWithPriority", "cuStreamDestroy", "cuStreamDestroy_v2", "cuStreamBeginCapture_v2",
    "cuStreamBeginCapture_v2_ptsz", "cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph_ptsz",
    "cuStreamEndCapture", "cuStreamEndCapture_ptsz", "cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4",
    "cuGetProcAddress", "cuGetProcAddress_v2", "cuGreenCtxCreate", "cuCtxEnablePeerAccess", "cuIpcGetMemHandle"}


def watched_names():
    """(per-thread exports, legacy twins) the shim answers with watching thunks
    (shim/per_thread_names.h)."""
    text = open(os.path.join(ROOT, "shim", "per_thread_names.h")).read()
    per_thread = set(re.findall(r"X\((cu\w+_pt(?:sz|ds))\)", text))
    legacy = set(re.findall(r"X\((cu\w+), \w+\)", text))
    return per_thread, legacy


def check_proc_address(native_out, shim_out):
    native_lines, shim_lines = native_out.splitlines(), shim_out.splitlines()
    per_thread_watched, legacy_watched = watched_names()
    expect_equal(len(shim_lines), len(native_lines), "lookups")
    hooked = 0
    for n, s in zip(native_lines, shim_lines):
        n_query, n_answer = n.split(" -> ")
        s_query, s_answer = s.split(" -> ")
        expect_equal(s_query, n_query, "query")
        n_result, n_status, n_variant, n_owner = n_answer.split()
        s_result, s_status, s_variant, s_owner = s_answer.split()
        if n_variant.endswith(("_ptsz", "_ptds")) and n_variant not in HOOKED_VARIANTS:
            # A per-thread variant the shim does not hook: handed back as a watching thunk
            # (shim/per_thread_watch.h): the named one of libcuda's export, else a slot.
            wanted = n_variant if n_variant in per_thread_watched else "poolshim_per_thread_watch_slots"
            expect_equal((s_result, s_status, s_variant, s_owner), (n_result, n_status, wanted, "poolshim"),
                         f"answer to {n_query} ({n_variant})")
            hooked += 1
            continue
        if n_variant in legacy_watched:  # another variant taking a stream: its named thunk
            expect_equal((s_result, s_status, s_variant, s_owner), (n_result, n_status, n_variant, "poolshim"),
                         f"answer to {n_query} ({n_variant})")
            hooked += 1
            continue
        expect_equal((s_result, s_status, s_variant), (n_result, n_status, n_variant), f"answer to {n_query}")
        wanted = "poolshim" if n_variant in HOOKED_VARIANTS else n_owner
        expect_equal(s_owner, wanted, f"owner of the answer to {n_query} ({n_variant})")
        hooked += s_owner == "poolshim"
    return hooked


def run_captured(args, env=None, cwd=None, timeout=120):
    """subprocess.run with stdout and stderr captured as text (the install, package and man tests)."""
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


# ---- Debian packages installed into a fresh root (tests/package, tests/container) -----------
def control(deb, *fields):
    """{field: value} of a package's control fields (those it has of the ones named)."""
    # Package too: with one field asked for, dpkg-deb prints its value alone.
    done = run_captured(["dpkg-deb", "-f", deb, "Package"] + [f for f in fields if f != "Package"])
    assert done.returncode == 0, done.stderr
    found = dict(re.findall(r"^(\S+): (.*)$", done.stdout, re.MULTILINE))
    return {f: found[f] for f in fields if f in found}


def dependency_names(depends):
    """["libc6", ...] of a Depends field ("libc6 (>= 2.34), python3")."""
    return [re.match(r"\s*([a-z0-9][a-z0-9+.-]*)", part).group(1) for part in depends.split(",")]


def host_status_records(names):
    """The machine's dpkg records of these packages, as a status file holds them."""
    with open("/var/lib/dpkg/status", encoding="utf-8") as f:
        records = f.read().split("\n\n")
    found = {}
    for record in records:
        m = re.search(r"^Package: (\S+)$", record, re.MULTILINE)
        if m and m.group(1) in names and re.search(r"^Status: install ok installed$", record, re.MULTILINE):
            found[m.group(1)] = record.strip("\n")
    return found


def make_dpkg_root(root, deb):
    """A fresh root for `dpkg --root=ROOT`: its package database holds the machine's own records
    of the packages that `deb` depends on (and no files of theirs), so that dpkg checks the
    Depends field against what this machine has, and the installed tools run with the machine's
    Python and C++ runtime."""
    admin = os.path.join(root, "var", "lib", "dpkg")
    for folder in ("info", "updates"):
        os.makedirs(os.path.join(admin, folder))
    records = host_status_records(dependency_names(control(deb, "Depends")["Depends"]))
    with open(os.path.join(admin, "status"), "w", encoding="utf-8") as f:
        f.write("".join(record + "\n\n" for record in records.values()))
    for name, record in records.items():
        multiarch = re.search(r"^Multi-Arch: same$", record, re.MULTILINE)
        arch = re.search(r"^Architecture: (\S+)$", record, re.MULTILINE).group(1)
        # Their file lists, empty: none of their files is in this root.
        open(os.path.join(admin, "info", f"{name}:{arch}.list" if multiarch else f"{name}.list"), "w").close()


DEMO_LAST_LINE = "demo: 10 steps, 7 allocations each, final checksum 1943edeeb97b1161"
DEMO_POOLED_LINE = ("  device 0 (poolshim CPU test double, device 0): 71 allocations pooled (0 async), 70 freed; "
                    "0 allocations and 0 frees passed through")


def demo_over_the_double_env(build):
    """The environment of an installed tool's run over the CPU double of `build`."""
    env = clean_environment()
    env.update(LD_LIBRARY_PATH=os.path.join(build, "double"), CUDADOUBLE_MEM="1G", CUDADOUBLE_DEVICES="1")
    return env


def check_installed_launcher_demo(test, launcher, build, work, env, wanted_preload, version):
    """Runs an installed launcher over `build`'s demo (10 steps) in `work` and checks, on
    unittest case `test`, what every installed layout must give: the preload it set, the demo's
    checksum, the summary's pooled line, one log whose start record has `version`. Returns the
    log's path and its start record."""
    demo = os.path.join(build, "programs", "demo")
    done = run_captured([launcher, "--log", os.path.join(work, "log-%p.jsonl"), "--",
                         "sh", "-c", 'echo "$LD_PRELOAD"; exec "$0" 10 65536', demo], env=env, cwd=work)
    test.assertEqual(done.returncode, 0, done.stderr)
    test.assertEqual(done.stdout.splitlines()[0], wanted_preload)
    test.assertEqual(done.stdout.splitlines()[-1], DEMO_LAST_LINE)
    test.assertIn(DEMO_POOLED_LINE, done.stderr.splitlines())
    logs = glob.glob(os.path.join(work, "log-*.jsonl"))
    test.assertEqual(len(logs), 1, logs)
    start = poolshim_log.read_log(logs[0])[0]
    test.assertEqual((start["type"], start["version"]), ("start", version), "the library's version")
    return logs[0], start


def unittest_main_with_options(doc, names, module_globals):
    """The main() of a test script that CMake passes required --NAME options: they become the
    module's ARGS (--build made absolute) before unittest runs the rest of the command line."""
    import argparse
    import unittest
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for name in names:
        parser.add_argument(f"--{name}", required=True)
    args, rest = parser.parse_known_args()
    if "build" in names:
        args.build = os.path.abspath(args.build)
    module_globals["ARGS"] = args
    unittest.main(argv=[sys.argv[0]] + rest)

