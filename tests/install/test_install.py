#!/usr/bin/env python3
"""`cmake --install` of a built tree (README "Install"): the layout it makes, and the installed
tools run from it, moved to another prefix, over the CPU test double. Also that an unbuilt or
unconfigured tree refuses to install. CMakeLists.txt passes the layout it installs to:

    test_install.py --build BUILD --version V --bindir D --libdir D --python D --docdir D --mandir D
"""

import glob
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from harness import (check_installed_launcher_demo, clean_environment, demo_over_the_double_env, poolshim_log, run_captured as run, sanitizer_runtime,  # noqa: E402
                     unittest_main_with_options)

ARGS = None


def tree(prefix):
    """{relative path: "file", "-> target" for a link} of every file and link under prefix."""
    found = {}
    for folder, dirs, files in os.walk(prefix):
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, prefix)
            if os.path.islink(path):
                found[rel] = "-> " + os.readlink(path)
            elif os.path.isfile(path):
                found[rel] = "file"
    return found


class Installed(unittest.TestCase):
    """One install into a temporary prefix, then moved elsewhere: nothing may depend on where
    it was installed, or on the source tree."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="poolshim-install-")
        staged = os.path.join(cls.tmp, "staged")
        cls.install = run(["cmake", "--install", ARGS.build, "--prefix", staged])
        cls.prefix = os.path.join(cls.tmp, "moved")
        if cls.install.returncode == 0:
            os.rename(staged, cls.prefix)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def setUp(self):
        self.assertEqual(self.install.returncode, 0, self.install.stdout + self.install.stderr)

    def path(self, *parts):
        return os.path.join(self.prefix, *parts)

    def test_layout_is_the_library_the_tools_their_modules_the_docs_and_the_man_pages(self):
        major = ARGS.version.split(".")[0]
        lib = ARGS.libdir
        wanted = {
            f"{ARGS.bindir}/poolshim": "file",
            f"{ARGS.bindir}/poolshim-report": "file",
            f"{ARGS.bindir}/poolshim-replay": "file",
            f"{lib}/libpoolshim.so.{ARGS.version}": "file",
            f"{lib}/replay_events": "file",
            f"{lib}/libpoolshim.so.{major}": f"-> libpoolshim.so.{ARGS.version}",
            f"{lib}/libpoolshim.so": f"-> libpoolshim.so.{major}",
            f"{ARGS.python}/poolshim_log.py": "file",
            f"{ARGS.docdir}/README.md": "file",
            f"{ARGS.docdir}/DESIGN.md": "file",
            f"{ARGS.mandir}/man1/poolshim.1.gz": "file",
            f"{ARGS.mandir}/man1/poolshim-report.1.gz": "file",
            f"{ARGS.mandir}/man1/poolshim-replay.1.gz": "file",
            f"{ARGS.mandir}/man7/poolshim.7.gz": "file",
        }
        for module in sorted(glob.glob(os.path.join(ROOT, "scripts", "poolshim_report", "*.py"))):
            wanted[f"{ARGS.python}/poolshim_report/{os.path.basename(module)}"] = "file"
        # No test double, no test program, nothing else.
        self.assertEqual(tree(self.prefix), wanted)
        for tool in ("poolshim", "poolshim-report", "poolshim-replay"):
            self.assertTrue(os.access(self.path(ARGS.bindir, tool), os.X_OK), f"{tool} is not executable")
        self.assertTrue(os.access(self.path(lib, "replay_events"), os.X_OK), "replay_events is not executable")

    def test_library_has_the_versioned_soname(self):
        major = ARGS.version.split(".")[0]
        done = run(["readelf", "-d", self.path(ARGS.libdir, f"libpoolshim.so.{ARGS.version}")])
        self.assertEqual(done.returncode, 0, done.stderr)
        sonames = re.findall(r"\(SONAME\)\s+Library soname: \[(.*)\]", done.stdout)
        self.assertEqual(sonames, [f"libpoolshim.so.{major}"])

    def test_installed_tools_say_the_project_version(self):
        for tool in ("poolshim", "poolshim-report", "poolshim-replay"):
            done = run([self.path(ARGS.bindir, tool), "--version"], env=clean_environment())
            self.assertEqual((done.returncode, done.stdout, done.stderr), (0, f"{tool} {ARGS.version}\n", ""))

    def test_installed_tools_import_the_installed_modules(self):
        # Each tool's top level (its imports) run here, without its main: the modules it loads
        # must be the installed ones, not the source tree's scripts/.
        python = os.path.realpath(self.path(ARGS.python))
        for tool, modules in (("poolshim", ("poolshim_log", "poolshim_report.model")),
                              ("poolshim-report", ("poolshim_log", "poolshim_report.cli")),
                              ("poolshim-replay", ("poolshim_log",))):
            for name in modules:
                sys.modules.pop(name, None)
            sys.modules.pop("poolshim_report", None)
            saved = list(sys.path)
            try:
                runpy.run_path(self.path(ARGS.bindir, tool), run_name="installed_tool")
                for name in modules:
                    wanted = os.path.join(python, *name.split(".")) + ".py"
                    self.assertEqual(os.path.realpath(sys.modules[name].__file__), wanted, f"{tool}: {name}")
            finally:
                sys.path[:] = saved
                for name in modules:
                    sys.modules.pop(name, None)
                sys.modules.pop("poolshim_report", None)

    def test_installed_launcher_preloads_the_installed_library_and_the_report_reads_its_log(self):
        work = os.path.join(self.tmp, "run")
        os.makedirs(work)
        env = demo_over_the_double_env(ARGS.build)
        library = os.path.realpath(self.path(ARGS.libdir, f"libpoolshim.so.{ARGS.version}"))
        wanted_preload = library
        runtime = sanitizer_runtime(ARGS.build)
        if runtime:   # a sanitizer build's library needs its runtime first (the launcher keeps it there)
            env["LD_PRELOAD"] = runtime
            env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
            wanted_preload = f"{runtime}:{library}"
        log, start = check_installed_launcher_demo(self, self.path(ARGS.bindir, "poolshim"), ARGS.build, work, env,
                                                   wanted_preload, ARGS.version)
        logs = [log]

        page = os.path.join(work, "report.html")
        report = run([self.path(ARGS.bindir, "poolshim-report"), "--html", page, logs[0]], env=env, cwd=work)
        self.assertEqual(report.returncode, 0, report.stderr)
        self.assertEqual(report.stdout.splitlines()[0],
                         f"== pid {start['pid']}, rank 0, host {start['host']}, poolshim {ARGS.version}")
        self.assertIn("  allocations pooled                                    71", report.stdout.splitlines())
        self.assertEqual(report.stderr, f"poolshim-report: wrote HTML page {page}\n")
        with open(page, encoding="utf-8") as f:
            self.assertTrue(f.read().startswith("<!DOCTYPE html>"), "not an HTML page")
        # The installed tool and the source tree's give the same summary of the same log.
        source = run([os.path.join(ROOT, "scripts", "poolshim-report"), logs[0]], env=env, cwd=work)
        self.assertEqual(report.stdout, source.stdout)


    def test_installed_replay_runs_its_program_under_the_installed_library(self):
        # The installed tool finds its replay program and the library relative to itself (no
        # build folder named): a 30 MiB block with page=0 reserves exactly its own segment.
        work = os.path.join(self.tmp, "replay")
        os.makedirs(work)
        events = os.path.join(work, "events.csv")
        with open(events, "w") as f:
            f.write("Thread,Time,Action,Pointer,Size,Stream,Device,Site,T\n"
                    f"1,00:00:00.000000,allocate,0x10000000,{30 << 20},0x0,0,0,0.1\n"
                    f"1,00:00:00.000000,free,0x10000000,{30 << 20},0x0,0,0,0.2\n")
        env = demo_over_the_double_env(ARGS.build)
        runtime = sanitizer_runtime(ARGS.build)
        if runtime:
            env["LD_PRELOAD"] = runtime
            env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
        out = os.path.join(work, "replay.json")
        done = run([self.path(ARGS.bindir, "poolshim-replay"), events, "--conf", "page=0", "--json", out], env=env,
                   cwd=work)
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(out) as f:
            replayed = json.load(f)["runs"][0]
        self.assertEqual((replayed["reserved_bytes_peak"], replayed["allocations"], replayed["frees"]),
                         (30 << 20, 1, 1))


class Refused(unittest.TestCase):
    def test_unbuilt_tree_refuses_to_install_naming_the_fix(self):
        with tempfile.TemporaryDirectory(prefix="poolshim-unbuilt-") as tmp:
            build, prefix = os.path.join(tmp, "build"), os.path.join(tmp, "prefix")
            cache = open(os.path.join(ARGS.build, "CMakeCache.txt")).read()
            settings = [f"-D{m[0]}={m[1]}" for m in
                        re.findall(r"^(CMAKE_PREFIX_PATH|CUDAToolkit_ROOT)[:A-Z]*=(.*)$", cache, re.MULTILINE)]
            settings += ["-G", re.search(r"^CMAKE_GENERATOR:INTERNAL=(.*)$", cache, re.MULTILINE).group(1)]
            configured = run(["cmake", "-S", ROOT, "-B", build, "-DPOOLSHIM_TESTS=OFF"] + settings)
            self.assertEqual(configured.returncode, 0, configured.stdout + configured.stderr)
            done = run(["cmake", "--install", build, "--prefix", prefix])
            self.assertEqual(done.returncode, 1)
            message = " ".join(done.stderr.split())
            library = os.path.join(build, f"libpoolshim.so.{ARGS.version}")
            self.assertIn(f"poolshim: {library} is not built: run `cmake --build {build}` (or scripts/build) first, "
                          "then install", message)
            self.assertFalse(os.path.exists(prefix), "something was installed")

    def test_unconfigured_tree_refuses_to_install(self):
        with tempfile.TemporaryDirectory(prefix="poolshim-unconfigured-") as tmp:
            done = run(["cmake", "--install", tmp, "--prefix", os.path.join(tmp, "prefix")])
            self.assertEqual(done.returncode, 1)
            self.assertIn(f"Error processing file: {tmp}/cmake_install.cmake", done.stderr)
            self.assertFalse(os.path.exists(os.path.join(tmp, "prefix")), "something was installed")


def main():
    unittest_main_with_options(__doc__, ('build', 'version', 'bindir', 'libdir', 'python', 'docdir', 'mandir'), globals())


if __name__ == "__main__":
    main()
