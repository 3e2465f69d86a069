#!/usr/bin/env python3
"""The container layer (README "In a container"), without a Docker engine: container/Dockerfile
RUNs nothing but the two stage scripts, and CI runs those scripts here. CMakeLists.txt passes:

    test_container.py --build BUILD --version V [Recipe | Stages]

Recipe reads the Dockerfile: two stages, FROM the images README names, each RUN one stage
script, the package handed over by COPY --from, no LD_PRELOAD baked in. Stages runs
container/build-stage.sh --no-apt (this machine is set up) as the image build does, building
without tests into a folder of its own (about 25 s on 2 cores), then container/runtime-stage.sh
--root on the package it made, into a fresh root whose dpkg database holds this machine's
records of the packages it depends on (as tests/package), and runs the installed tools from
there over the CPU test double of the build the tests run on (BUILD).
"""

import glob
import os
import re
import shlex
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from harness import (DEMO_LAST_LINE, check_installed_launcher_demo, clean_environment, demo_over_the_double_env,
                     make_dpkg_root, poolshim_log, run_captured as run,  # noqa: E402
                     unittest_main_with_options)

ARGS = None
CONTAINER = os.path.join(ROOT, "container")
BUILD_STAGE = os.path.join(CONTAINER, "build-stage.sh")
RUNTIME_STAGE = os.path.join(CONTAINER, "runtime-stage.sh")
LIBRARY = "/usr/lib/poolshim/libpoolshim.so"


def dockerfile_instructions(path):
    """[(INSTRUCTION, arguments)] of a Dockerfile: continuation lines joined, comments and the
    parser directive left out."""
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if not line.lstrip().startswith("#")]
    instructions, current = [], ""
    for line in lines:
        current += line
        if current.endswith("\\"):
            current = current[:-1]
            continue
        if current.strip():
            word, _, rest = current.strip().partition(" ")
            instructions.append((word.upper(), rest.strip()))
        current = ""
    return instructions


def readme_section(title):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    found = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#+ )", readme, re.MULTILINE | re.DOTALL)
    assert found, f'README.md has no section "{title}"'
    return found.group(1)


class Recipe(unittest.TestCase):
    def setUp(self):
        self.instructions = dockerfile_instructions(os.path.join(CONTAINER, "Dockerfile"))
        self.args = dict(re.fullmatch(r"(\w+)=(\S+)", rest).groups() for word, rest in self.instructions
                         if word == "ARG" and "=" in rest)
        self.stages = []   # [(FROM arguments, [instructions])]
        for word, rest in self.instructions:
            if word == "FROM":
                self.stages.append((rest, []))
            elif self.stages:
                self.stages[-1][1].append((word, rest))

    def test_two_stages_from_the_cuda_devel_image_and_the_pytorch_runtime_image_that_args_select(self):
        self.assertEqual([frm for frm, _ in self.stages], ["${CUDA_DEVEL_IMAGE} AS build", "${PYTORCH_IMAGE}"])
        self.assertRegex(self.args["CUDA_DEVEL_IMAGE"], r"^nvidia/cuda:13\.0\.\d+-devel-ubuntu22\.04$")
        self.assertRegex(self.args["PYTORCH_IMAGE"], r"^pytorch/pytorch:2\.\d+\.\d+-cuda13\.0-cudnn9-runtime$")
        # Both ARGs before the first FROM, where FROM can use them.
        self.assertEqual([w for w, _ in self.instructions[:3]], ["ARG", "ARG", "FROM"])
        section = " ".join(readme_section("In a container").split())
        for arg in ("CUDA_DEVEL_IMAGE", "PYTORCH_IMAGE"):
            self.assertIn(f"`{arg}` (default `{self.args[arg]}`)", section)

    def test_every_run_is_one_stage_script_of_its_stage(self):
        runs = [[rest for word, rest in body if word == "RUN"] for _, body in self.stages]
        self.assertEqual(runs, [["/src/container/build-stage.sh --out /out"],
                                ["/tmp/poolshim/runtime-stage.sh /tmp/poolshim/poolshim_*.deb"]])
        for command in sum(runs, []):
            # One command: no list, pipe, substitution or redirection beside the script.
            self.assertIsNone(re.search(r"[;&|<>`$()]", command), command)
        # The scripts the RUNs call are the source tree's: stage 1 has it at /src, stage 2 copies it.
        self.assertIn(("COPY", ". /src"), self.stages[0][1])
        self.assertIn(("COPY", "container/runtime-stage.sh /tmp/poolshim/"), self.stages[1][1])
        for script in (BUILD_STAGE, RUNTIME_STAGE):
            self.assertTrue(os.access(script, os.X_OK), script)

    def test_the_package_goes_from_the_build_stage_out_folder_to_the_runtime_stage(self):
        copies = [rest for word, rest in self.stages[1][1] if word == "COPY" and rest.startswith("--from=")]
        self.assertEqual(copies, ["--from=build /out/poolshim_*.deb /tmp/poolshim/"])
        # The build stage writes its packages where that COPY takes them from.
        self.assertEqual(shlex.split(self.stages[0][1][-1][1])[1:], ["--out", "/out"])

    def test_nothing_is_preloaded_by_the_image_itself(self):
        for word, rest in self.instructions:
            self.assertFalse(word == "ENV" and ("LD_PRELOAD" in rest or "POOLSHIM" in rest), rest)
        # Nor does it change how the PyTorch image starts.
        self.assertEqual([w for w, _ in self.instructions if w in ("ENTRYPOINT", "CMD", "USER", "WORKDIR")], [])

    def test_the_build_context_leaves_out_builds_the_dependency_prefix_and_git(self):
        with open(os.path.join(CONTAINER, "Dockerfile.dockerignore"), encoding="utf-8") as f:
            patterns = [line for line in f.read().splitlines() if line and not line.startswith("#")]
        self.assertLessEqual({".git", "build*", ".deps"}, set(patterns))

    def test_readme_run_line_preloads_the_installed_library_with_pytorch_caching_off(self):
        section = readme_section("In a container")
        self.assertIn("docker build -f container/Dockerfile -t poolshim-torch .", section)
        runs = [line for line in section.splitlines() if line.startswith("docker run ")]
        self.assertEqual(len(runs), 2, runs)
        preload, launcher = runs
        self.assertIn(f"-e LD_PRELOAD={LIBRARY} -e PYTORCH_NO_CUDA_MEMORY_CACHING=1 ", preload)
        self.assertIn("--gpus all", preload)
        self.assertTrue(preload.split("  #")[0].rstrip().endswith("poolshim-torch python train.py"), preload)
        self.assertNotIn("LD_PRELOAD", launcher)
        self.assertIn("-e PYTORCH_NO_CUDA_MEMORY_CACHING=1 ", launcher)
        self.assertTrue(launcher.split("  #")[0].rstrip().endswith("poolshim-torch poolshim -- python train.py"),
                        launcher)


class Stages(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="poolshim-container-")
        cls.arch = run(["dpkg", "--print-architecture"]).stdout.strip()
        cls.out = os.path.join(cls.tmp, "out")
        cls.made = run([BUILD_STAGE, "--no-apt", "--build", os.path.join(cls.tmp, "build"), "--out", cls.out],
                       env=clean_environment(), timeout=280)
        cls.deb = os.path.join(cls.out, f"poolshim_{ARGS.version}_{cls.arch}.deb")
        cls.root = os.path.join(cls.tmp, "root")
        cls.installed = None
        if cls.made.returncode == 0 and os.path.exists(cls.deb):
            make_dpkg_root(cls.root, cls.deb)
            cls.installed = run([RUNTIME_STAGE, "--root", cls.root, cls.deb], env=clean_environment())

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def setUp(self):
        self.assertEqual(self.made.returncode, 0, self.made.stdout + self.made.stderr)

    def installed_ok(self):
        self.assertIsNotNone(self.installed, "not installed")
        self.assertEqual(self.installed.returncode, 0, self.installed.stdout + self.installed.stderr)

    def path(self, *parts):
        return os.path.join(self.root, "usr", *parts)

    def test_build_stage_builds_without_tests_and_makes_the_package_and_its_dbgsym_into_its_out_folder(self):
        dbgsym = os.path.join(self.out, f"poolshim-dbgsym_{ARGS.version}_{self.arch}.ddeb")
        # The build's progress first (scripts/build), then scripts/package's folder and packages.
        self.assertTrue(self.made.stdout.endswith(f"poolshim package: {self.out}\n{self.deb}\n{dbgsym}\n"),
                        self.made.stdout[-2000:])
        with open(os.path.join(self.tmp, "build", "CMakeCache.txt")) as f:
            cache = f.read()
        self.assertIn("\nPOOLSHIM_TESTS:BOOL=OFF\n", cache)
        self.assertRegex(cache, r"\nPOOLSHIM_SANITIZE:STRING=\n")
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "build", "tests")), "the tests were built")
        self.assertEqual(sorted(os.listdir(self.out)), sorted([os.path.basename(self.deb), os.path.basename(dbgsym)]))
        # The runtime stage's COPY and RUN take exactly the .deb of that folder.
        self.assertEqual(glob.glob(os.path.join(self.out, "poolshim_*.deb")), [self.deb])

    def test_runtime_stage_installs_it_and_says_what_to_preload(self):
        self.installed_ok()
        self.assertEqual(self.installed.stdout,
                         f"poolshim runtime-stage: installed poolshim {ARGS.version} in {self.root}\n"
                         f"poolshim runtime-stage: a run preloads LD_PRELOAD={LIBRARY}, or runs: poolshim -- COMMAND\n")
        self.assertEqual(self.installed.stderr, "")
        done = run(["dpkg", f"--root={self.root}", "-s", "poolshim"])
        self.assertIn("Status: install ok installed", done.stdout.splitlines())
        self.assertIn(f"Version: {ARGS.version}", done.stdout.splitlines())

    def test_installed_tools_say_the_project_version(self):
        self.installed_ok()
        for tool in ("poolshim", "poolshim-report", "poolshim-replay"):
            done = run([self.path("bin", tool), "--version"], env=clean_environment())
            self.assertEqual((done.returncode, done.stdout, done.stderr), (0, f"{tool} {ARGS.version}\n", ""))

    def test_the_library_readme_preloads_is_installed_with_its_soname(self):
        self.installed_ok()
        library = self.root + LIBRARY
        self.assertEqual(os.path.realpath(library), self.path("lib", "poolshim", f"libpoolshim.so.{ARGS.version}"))
        dynamic = run(["readelf", "-d", library]).stdout
        major = ARGS.version.split(".")[0]
        self.assertEqual(re.findall(r"\(SONAME\)\s+Library soname: \[(.*)\]", dynamic), [f"libpoolshim.so.{major}"])
        self.assertTrue(os.path.isfile(self.path("lib", "poolshim", f"libpoolshim.so.{major}")))

    def test_installed_launcher_runs_the_demo_and_the_installed_report_reads_its_log(self):
        self.installed_ok()
        work = os.path.join(self.tmp, "run")
        os.makedirs(work)
        env = demo_over_the_double_env(ARGS.build)
        log, start = check_installed_launcher_demo(self, self.path("bin", "poolshim"), ARGS.build, work, env,
                                                   os.path.realpath(self.root + LIBRARY), ARGS.version)
        logs = [log]
        report = run([self.path("bin", "poolshim-report"), logs[0]], env=env, cwd=work)
        self.assertEqual((report.returncode, report.stderr), (0, ""))
        self.assertIn("  allocations pooled                                    71", report.stdout.splitlines())

    def test_the_same_package_preloaded_by_path_as_the_run_line_does(self):
        # LD_PRELOAD=<the library> with PyTorch's caching off is README's run line; here the demo.
        self.installed_ok()
        work = os.path.join(self.tmp, "preload")
        os.makedirs(work)
        env = dict(clean_environment(), LD_PRELOAD=self.root + LIBRARY, PYTORCH_NO_CUDA_MEMORY_CACHING="1",
                   LD_LIBRARY_PATH=os.path.join(ARGS.build, "double"), CUDADOUBLE_MEM="1G", CUDADOUBLE_DEVICES="1",
                   POOLSHIM_LOG=os.path.join(work, "log-%p.jsonl"))
        done = run([os.path.join(ARGS.build, "programs", "demo"), "10", "65536"], env=env, cwd=work)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.splitlines()[-1],
                         DEMO_LAST_LINE)
        records = poolshim_log.read_log(glob.glob(os.path.join(work, "log-*.jsonl"))[0])
        exits = [r for r in records if r["type"] == "exit"]
        self.assertEqual(len(exits), 1)
        self.assertEqual(exits[0]["pooled_allocs"], 71)

    def test_runtime_stage_refuses_what_is_not_poolshims_package_or_not_a_dpkg_root(self):
        dbgsym = os.path.join(self.out, f"poolshim-dbgsym_{ARGS.version}_{self.arch}.ddeb")
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(empty, exist_ok=True)
        not_deb = os.path.join(self.tmp, "not.deb")
        with open(not_deb, "w") as f:
            f.write("not a package\n")
        cases = [
            ([os.path.join(self.tmp, "missing.deb")], f"{os.path.join(self.tmp, 'missing.deb')}: no such package file"),
            ([not_deb], f"{not_deb}: not a Debian package"),
            ([dbgsym], f"{dbgsym}: package poolshim-dbgsym, not poolshim"),
            (["--root", empty, self.deb], f"{empty} is not a dpkg root (no var/lib/dpkg/status)"),
        ]
        for args, said in cases:
            with self.subTest(args=args):
                done = run([RUNTIME_STAGE] + args, env=clean_environment())
                self.assertEqual((done.returncode, done.stdout, done.stderr),
                                 (2, "", f"poolshim runtime-stage: {said}\n"))
        self.assertEqual(os.listdir(empty), [])

    def test_stage_scripts_refuse_bad_arguments_with_their_usage(self):
        cases = [
            (RUNTIME_STAGE, ["--bogus", self.deb], "unknown option --bogus"),
            (RUNTIME_STAGE, [], "no package named"),
            (RUNTIME_STAGE, [self.deb, self.deb], f"one package, not {self.deb} and {self.deb}"),
            (RUNTIME_STAGE, ["--root"], "--root needs a folder"),
            (BUILD_STAGE, ["--bogus"], "unknown argument --bogus"),
            (BUILD_STAGE, ["--out"], "--out needs a folder"),
            (BUILD_STAGE, ["--no-apt", "--build"], "--build needs a folder"),
        ]
        for script, args, said in cases:
            with self.subTest(script=os.path.basename(script), args=args):
                done = run([script] + args, env=clean_environment())
                self.assertEqual(done.returncode, 2)
                self.assertEqual(done.stdout, "")
                lines = done.stderr.splitlines()
                self.assertEqual(lines[0], f"poolshim {os.path.basename(script)[:-3]}: {said}")
                self.assertTrue(lines[1].startswith(f"usage: container/{os.path.basename(script)} "), lines[1])

    def test_build_stage_refuses_a_folder_that_is_not_a_build(self):
        empty = os.path.join(self.tmp, "not-a-build")
        os.makedirs(empty, exist_ok=True)
        done = run([BUILD_STAGE, "--no-apt", "--no-build", "--build", empty, "--out", os.path.join(self.tmp, "o")],
                   env=clean_environment())
        self.assertEqual(done.returncode, 2)
        self.assertIn(f"poolshim package: {empty} is not a configured build folder", done.stderr)

    def test_version_is_the_projects(self):
        for script in (BUILD_STAGE, RUNTIME_STAGE):
            done = run([script, "--version"], env=clean_environment())
            self.assertEqual((done.returncode, done.stdout, done.stderr),
                             (0, f"container/{os.path.basename(script)} {ARGS.version}\n", ""))


def main():
    unittest_main_with_options(__doc__, ('build', 'version'), globals())


if __name__ == "__main__":
    main()
