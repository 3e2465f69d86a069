#!/usr/bin/env python3
"""The Debian packages (README "Install"): scripts/package makes them from the build, dpkg
installs them into a fresh root (its own admin folder, so not the machine's), and the installed
tools run from there over the CPU test double. CMakeLists.txt passes:

    test_package.py --build BUILD --version V

The root is installed with `dpkg --root=ROOT --force-not-root --force-script-chrootless -i`, which
needs no privilege: dpkg unpacks, records and configures the packages as it does on a system.
ROOT's package database holds the machine's own records of the packages that poolshim depends
on (and no files of theirs), so that dpkg checks the Depends field against what this machine
has, and the installed tools run with the machine's Python and C++ runtime.
"""

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
from harness import (check_installed_launcher_demo, clean_environment, control, demo_over_the_double_env, dependency_names, host_status_records,  # noqa: E402
                     make_dpkg_root, poolshim_log, run_captured as run, unittest_main_with_options)

ARGS = None
# Of the Debian packages, those whose files the library needs (dpkg-shlibdeps finds them), and
# Python for the tools.
RUNTIME_PACKAGES = ("libc6", "libgcc-s1", "libstdc++6")


def sections(elf):
    done = run(["readelf", "-S", "-W", elf])
    assert done.returncode == 0, done.stderr
    return re.findall(r"^\s*\[\s*\d+\]\s+(\S+)", done.stdout, re.MULTILINE)


def build_id(elf):
    done = run(["readelf", "-n", elf])
    assert done.returncode == 0, done.stderr
    return re.search(r"Build ID: ([0-9a-f]+)", done.stdout).group(1)


class Package(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="poolshim-package-")
        cls.arch = run(["dpkg", "--print-architecture"]).stdout.strip()
        cls.debs = os.path.join(cls.tmp, "debs")
        env = dict(os.environ, POOLSHIM_BUILD_DIR=ARGS.build)
        # The build is the one the tests run on (ctest built it): packaged as it is.
        cls.made = run([os.path.join(ROOT, "scripts", "package"), "--no-build", "--out", cls.debs], env=env)
        cls.deb = os.path.join(cls.debs, f"poolshim_{ARGS.version}_{cls.arch}.deb")
        cls.dbgsym = os.path.join(cls.debs, f"poolshim-dbgsym_{ARGS.version}_{cls.arch}.ddeb")
        cls.root = os.path.join(cls.tmp, "root")
        cls.installed = None
        if cls.made.returncode == 0 and os.path.exists(cls.deb):
            cls.installed = cls.install(cls.root, [cls.deb, cls.dbgsym])

    @classmethod
    def install(cls, root, debs):
        make_dpkg_root(root, debs[0])
        env = dict(os.environ)
        env["PATH"] = env.get("PATH", "") + ":/usr/sbin:/sbin"   # dpkg wants ldconfig on PATH, also unprivileged
        # --path-include: a path-exclude of the machine's dpkg.cfg.d (container images drop
        # /usr/share/man and doc) must not leave the man pages out of this root.
        return run(["dpkg", f"--root={root}", f"--log={os.path.join(cls.tmp, 'dpkg.log')}", "--force-not-root",
                    "--force-script-chrootless", "--path-include=*", "-i"] + debs, env=env)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def setUp(self):
        self.assertEqual(self.made.returncode, 0, self.made.stdout + self.made.stderr)

    def path(self, *parts):
        return os.path.join(self.root, "usr", *parts)

    def installed_ok(self):
        self.assertIsNotNone(self.installed, "not installed")
        self.assertEqual(self.installed.returncode, 0, self.installed.stdout + self.installed.stderr)

    def test_package_script_makes_the_package_and_its_dbgsym_into_the_folder_it_prints(self):
        self.assertEqual(self.made.stdout, f"poolshim package: {self.debs}\n{self.deb}\n{self.dbgsym}\n")
        self.assertEqual(sorted(os.listdir(self.debs)), sorted([os.path.basename(self.deb),
                                                                os.path.basename(self.dbgsym)]))

    def test_control_fields_name_version_and_dependencies(self):
        fields = control(self.deb, "Package", "Version", "Architecture", "Section", "Maintainer", "Homepage",
                         "Depends", "Description")
        self.assertEqual((fields["Package"], fields["Version"], fields["Architecture"], fields["Section"]),
                         ("poolshim", ARGS.version, self.arch, "devel"))
        self.assertRegex(fields["Maintainer"], r"^.+ <[^@ ]+@[^@ ]+>$")
        self.assertRegex(fields["Homepage"], r"^https://")
        self.assertEqual(fields["Description"], "pools the device memory of unmodified CUDA programs, and logs it")
        depends = dependency_names(fields["Depends"])
        self.assertEqual(sorted(depends), sorted(RUNTIME_PACKAGES + ("python3",)))
        # Every versioned dependency is a minimum (what dpkg-shlibdeps writes), never a pin.
        for part in fields["Depends"].split(","):
            self.assertRegex(part.strip(), r"^[a-z0-9+.-]+( \(>= [0-9][^)]*\))?$")

    def test_depends_names_the_package_of_every_library_the_installed_library_needs(self):
        self.installed_ok()
        library = self.path("lib", "poolshim", f"libpoolshim.so.{ARGS.version}")
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", run(["readelf", "-d", library]).stdout)
        self.assertIn("libstdc++.so.6", needed)
        loaded = run(["ldd", library]).stdout
        found = dict(re.findall(r"^\s*(\S+) => (/\S+)", loaded, re.MULTILINE))
        found.update({os.path.basename(path): path for path in re.findall(r"^\s*(/\S+) \(", loaded, re.MULTILINE)})
        owners = {}
        for name in needed:   # the machine's package of each, where the loader finds it
            for path in dict.fromkeys([found[name], os.path.realpath(found[name])]):
                done = run(["dpkg", "-S", path])
                if done.returncode == 0:
                    owners[name] = done.stdout.split(":")[0]
                    break
        self.assertEqual(sorted(owners), sorted(needed), "a library no package owns")
        depends = dependency_names(control(self.deb, "Depends")["Depends"])
        self.assertEqual({name: owner for name, owner in owners.items() if owner not in depends}, {})

    def test_dpkg_installs_both_into_the_fresh_root(self):
        self.installed_ok()
        self.assertNotIn("warning", self.installed.stderr)
        for package in ("poolshim", "poolshim-dbgsym"):
            done = run(["dpkg", f"--root={self.root}", "-s", package])
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn("Status: install ok installed", done.stdout.splitlines())
        listed = run(["dpkg", f"--root={self.root}", "-L", "poolshim"]).stdout.split()
        for path in ("/usr/bin/poolshim", "/usr/bin/poolshim-report", "/usr/bin/poolshim-replay",
                     "/usr/share/man/man1/poolshim.1.gz", "/usr/share/man/man1/poolshim-report.1.gz",
                     "/usr/share/man/man1/poolshim-replay.1.gz", "/usr/share/man/man7/poolshim.7.gz",
                     f"/usr/lib/poolshim/libpoolshim.so.{ARGS.version}", "/usr/lib/poolshim/replay_events"):
            self.assertIn(path, listed)
            self.assertTrue(os.path.lexists(self.root + path), path)

    def test_library_has_no_debug_sections_and_the_dbgsym_has_them_under_its_build_id(self):
        # The two ELF files of the package, the library and poolshim-replay's replay program, each
        # stripped, with its debug information in the -dbgsym under its build id.
        self.installed_ok()
        identities = []
        for name in (f"libpoolshim.so.{ARGS.version}", "replay_events"):
            with self.subTest(elf=name):
                shipped = sections(self.path("lib", "poolshim", name))
                self.assertEqual([s for s in shipped if s.startswith(".debug") or s == ".symtab"], [])
                self.assertIn(".gnu_debuglink", shipped)
                identity = build_id(self.path("lib", "poolshim", name))
                # The build's own copy has the same build id: the package stripped it, nothing else.
                built = os.path.join(ARGS.build, name) if name.startswith("lib") else os.path.join(ARGS.build, "tools", name)
                self.assertEqual(identity, build_id(built))
                debug = f"lib/debug/.build-id/{identity[:2]}/{identity[2:]}.debug"
                self.assertTrue(os.path.isfile(self.path(debug)))
                self.assertLessEqual({".debug_info", ".debug_line", ".symtab"}, set(sections(self.path(debug))))
                self.assertEqual(build_id(self.path(debug)), identity)
                identities.append(identity)
        listed = [line.split()[-1] for line in run(["dpkg-deb", "-c", self.dbgsym]).stdout.splitlines()
                  if not line.startswith("d")]
        self.assertEqual(sorted(listed),
                         sorted(f"./usr/lib/debug/.build-id/{i[:2]}/{i[2:]}.debug" for i in identities))
        fields = control(self.dbgsym, "Package", "Version", "Depends", "Build-Ids")
        self.assertEqual(sorted(fields.pop("Build-Ids").split()), sorted(identities))
        self.assertEqual(fields, {"Package": "poolshim-dbgsym", "Version": ARGS.version,
                                  "Depends": f"poolshim (= {ARGS.version})"})

    def test_installed_tools_say_the_project_version(self):
        self.installed_ok()
        for tool in ("poolshim", "poolshim-report", "poolshim-replay"):
            done = run([self.path("bin", tool), "--version"], env=clean_environment())
            self.assertEqual((done.returncode, done.stdout, done.stderr), (0, f"{tool} {ARGS.version}\n", ""))

    def test_installed_launcher_runs_the_demo_and_the_installed_report_reads_its_log(self):
        self.installed_ok()
        work = os.path.join(self.tmp, "run")
        os.makedirs(work)
        env = demo_over_the_double_env(ARGS.build)
        library = os.path.realpath(self.path("lib", "poolshim", f"libpoolshim.so.{ARGS.version}"))
        log, start = check_installed_launcher_demo(self, self.path("bin", "poolshim"), ARGS.build, work, env, library,
                                                   ARGS.version)
        logs = [log]

        page = os.path.join(work, "report.html")
        report = run([self.path("bin", "poolshim-report"), "--html", page, logs[0]], env=env, cwd=work)
        self.assertEqual(report.returncode, 0, report.stderr)
        self.assertEqual(report.stdout.splitlines()[0],
                         f"== pid {start['pid']}, rank 0, host {start['host']}, poolshim {ARGS.version}")
        self.assertIn("  allocations pooled                                    71", report.stdout.splitlines())
        self.assertEqual(report.stderr, f"poolshim-report: wrote HTML page {page}\n")
        with open(page, encoding="utf-8") as f:
            self.assertTrue(f.read().startswith("<!DOCTYPE html>"), "not an HTML page")

    def test_man_shows_the_installed_pages(self):
        self.installed_ok()
        env = dict(clean_environment(), MANWIDTH="100", LC_ALL="C.UTF-8", MAN_DISABLE_SECCOMP="1")
        pages = [(["-l", self.path("share", "man", "man1", "poolshim.1.gz")], "POOLSHIM(1)"),
                 (["-M", self.path("share", "man"), "poolshim-report"], "POOLSHIM-REPORT(1)"),
                 (["-M", self.path("share", "man"), "7", "poolshim"], "POOLSHIM(7)")]
        for args, title in pages:
            with self.subTest(page=title):
                done = run(["man", "--warnings=w"] + args, env=env)
                self.assertEqual((done.returncode, done.stderr), (0, ""))
                self.assertRegex(done.stdout.splitlines()[0], rf"^{re.escape(title)} .* {re.escape(title)}$")
                self.assertRegex(done.stdout.splitlines()[-1], rf"^poolshim {re.escape(ARGS.version)} ")


class Refused(unittest.TestCase):
    def test_dpkg_refuses_the_package_where_a_dependency_is_missing(self):
        # The same install without python3's record: the Depends field is what dpkg checks.
        with tempfile.TemporaryDirectory(prefix="poolshim-package-deps-") as tmp:
            made = run([os.path.join(ROOT, "scripts", "package"), "--no-build", "--out", tmp],
                       env=dict(os.environ, POOLSHIM_BUILD_DIR=ARGS.build))
            self.assertEqual(made.returncode, 0, made.stderr)
            deb = made.stdout.splitlines()[1]
            root = os.path.join(tmp, "root")
            os.makedirs(os.path.join(root, "var", "lib", "dpkg", "updates"))
            os.makedirs(os.path.join(root, "var", "lib", "dpkg", "info"))
            records = host_status_records(RUNTIME_PACKAGES)
            with open(os.path.join(root, "var", "lib", "dpkg", "status"), "w") as f:
                f.write("".join(record + "\n\n" for record in records.values()))
            done = run(["dpkg", f"--root={root}", f"--log={os.path.join(tmp, 'dpkg.log')}", "--force-not-root",
                        "--force-script-chrootless", "-i", deb],
                       env=dict(os.environ, PATH=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"))
            self.assertEqual(done.returncode, 1)
            self.assertIn("poolshim depends on python3; however:\n  Package python3 is not installed.", done.stderr)


def main():
    unittest_main_with_options(__doc__, ('build', 'version'), globals())


if __name__ == "__main__":
    main()
