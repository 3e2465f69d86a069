#!/usr/bin/env python3
"""The scripts' command-line conventions, without a build or a GPU: `--help` prints usage and
exits 0 without running anything, `--version` prints the project's version (CMakeLists.txt
passes it).

    test_conventions.py --version V
"""

import argparse
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
VERSION = None

# Stand-ins, first on PATH, for every tool that the scripts run when they do their job: each
# records that it was called, and fails (no GPU, nothing installed or built).
STAND_INS = ("nvidia-smi", "apt-get", "apt", "sudo", "dpkg", "dpkg-query", "dpkg-deb", "cmake", "cpack", "ninja", "make",
             "nvcc")

USAGE = {
    "demo": "usage: scripts/demo [steps] [elements]",
    "setup": "usage: scripts/setup [--prefix DIR]",
    "package": "usage: scripts/package [--out DIR] [--no-build]",
    "bench": "usage: scripts/bench [--out DIR] [--quick] [--only WORKLOAD,...] [--no-build]",
    "test": "usage: scripts/test [--sanitize address|thread] [CTEST_ARGS...]",
    "build": "usage: scripts/build [CMAKE_ARGS...]",
    "gpu-test": "usage: scripts/gpu-test [--skip-bench] [--skip-torch] [--jax] [--only-ipc] [--only-observe] [--only-events]",
    "poolshim": "usage: poolshim [--log PATH] [--conf k=v,...] [--observe] [--verbose] [--no-summary] [--] command "
                "[args...]",
    "poolshim-report": "usage: poolshim-report [-h] [--version] [--full] [--html FILE]",
    "poolshim-replay": "usage: poolshim-replay EVENTS [--conf k=v,...]... [--json FILE] [--device N]",
    "container/build-stage.sh": "usage: container/build-stage.sh [--out DIR] [--build DIR] [--no-apt] [--no-build]",
    "container/runtime-stage.sh": "usage: container/runtime-stage.sh [--root DIR] DEB",
}


class Conventions(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="poolshim-cli-")
        self.calls = os.path.join(self.tmp.name, "calls")
        bin_dir = os.path.join(self.tmp.name, "bin")
        os.mkdir(bin_dir)
        for tool in STAND_INS:
            path = os.path.join(bin_dir, tool)
            with open(path, "w") as f:
                f.write(f'#!/bin/sh\necho "{tool} $*" >> "{self.calls}"\nexit 1\n')
            os.chmod(path, 0o755)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("POOLSHIM_")}
        self.env["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")

    def tearDown(self):
        self.tmp.cleanup()

    def run_script(self, name, *args):
        # In an empty folder: a script that did its job anyway would leave its log or build there.
        work = os.path.join(self.tmp.name, "work")
        shutil.rmtree(work, ignore_errors=True)
        os.mkdir(work)
        if os.path.exists(self.calls):
            os.unlink(self.calls)
        # scripts/NAME, or a path from the top of the tree (container/build-stage.sh).
        script = os.path.join(ROOT, name) if "/" in name else os.path.join(SCRIPTS, name)
        done = subprocess.run([script, *args], env=self.env, cwd=work, capture_output=True,
                              text=True, timeout=60)
        called = open(self.calls).read() if os.path.exists(self.calls) else ""
        self.assertEqual(called, "", f"{name} {' '.join(args)} ran tools")
        self.assertEqual(os.listdir(work), [], f"{name} {' '.join(args)} wrote files")
        return done

    def test_help_prints_usage_and_exits_0_running_nothing(self):
        for name, usage in USAGE.items():
            for option in ("--help", "-h"):
                with self.subTest(script=name, option=option):
                    done = self.run_script(name, option)
                    self.assertEqual((done.returncode, done.stderr), (0, ""), f"{name} {option}")
                    self.assertEqual(done.stdout.splitlines()[0], usage)

    def test_readme_names_exactly_the_packages_setup_installs(self):
        with open(os.path.join(SCRIPTS, "setup")) as f:
            installed = re.search(r"^PACKAGES=\((.*)\)$", f.read(), re.MULTILINE).group(1).split()
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
            readme = f.read()
        # The paragraph of "The two commands" that says what each command installs.
        said = re.search(r"^installs the Debian packages it needs \((.*?)\) and builds:$", readme,
                         re.MULTILINE | re.DOTALL).group(1)
        named = [span for span in re.findall(r"`([^`]+)`", said) if re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", span)]
        self.assertEqual(sorted(named), sorted(installed))

    def test_version_is_the_projects(self):
        # Each prints its name as its usage line does, then the version of project().
        for name, usage in USAGE.items():
            with self.subTest(script=name):
                prog = usage.split()[1]
                done = self.run_script(name, "--version")
                self.assertEqual((done.returncode, done.stdout, done.stderr), (0, f"{prog} {VERSION}\n", ""))

    def test_every_script_is_covered(self):
        # A new script must join USAGE (and so the conventions); modules and sourced files are not scripts.
        scripts = {name for name in os.listdir(SCRIPTS)
                   if os.access(os.path.join(SCRIPTS, name), os.X_OK) and os.path.isfile(os.path.join(SCRIPTS, name))}
        self.assertEqual(scripts, {name for name in USAGE if "/" not in name})

    def test_a_bad_command_line_prints_usage_on_stderr_and_exits_2_running_nothing(self):
        # scripts/test and scripts/build pass what they do not know on to ctest and cmake.
        bad = {
            "demo": [("--bogus",), ("10", "x"), ("1", "2", "3")],
            "setup": [("--bogus",), ("--prefix",), ("--prefix", "d", "more")],
            "package": [("--bogus",), ("--out",)],
            "bench": [("--bogus",), ("--quick", "--only"), ("--out", "d", "extra")],
            "gpu-test": [("--bogus",), ("--jax", "--skip")],
            "test": [("--sanitize", "memory")],
            "poolshim": [("--bogus", "--", "true")],
            "poolshim-report": [("--bogus",)],
            "poolshim-replay": [("--bogus", "events.csv"), (), ("events.csv", "--conf"), ("events.csv", "--conf", "page"),
                                ("events.csv", "--conf", "log=x.jsonl"), ("events.csv", "--device", "-1")],
        }
        for name, cases in bad.items():
            for args in cases:
                with self.subTest(script=name, args=args):
                    done = self.run_script(name, *args)
                    self.assertEqual((done.returncode, done.stdout), (2, ""), f"{name} {' '.join(args)}")
                    lines = done.stderr.splitlines()
                    # argparse prints its usage first, the shell scripts the problem first.
                    self.assertIn(USAGE[name].split(" [")[0], "\n".join(lines[:2]))


def main():
    global VERSION
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", required=True)
    args, rest = parser.parse_known_args()
    VERSION = args.version
    unittest.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
