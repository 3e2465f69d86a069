#!/usr/bin/env bash
# The build stage of container/Dockerfile (README "In a container"), and all that it RUNs:
# installs what building the Debian package needs (apt-get), builds the library, its man pages
# and the installed tools' copies with scripts/build (no tests), and makes the packages with
# scripts/package into one folder. CI runs it on its own (tests/container), with --no-apt.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

usage() {
  cat <<'EOF'
usage: container/build-stage.sh [--out DIR] [--build DIR] [--no-apt] [--no-build]

The build stage of container/Dockerfile. Installs with apt-get the Debian packages that building
poolshim's package needs and that are missing (a cmake older than 3.25 is replaced by pip's),
builds poolshim without its tests with scripts/build, and makes poolshim_VERSION_ARCH.deb and
poolshim-dbgsym_VERSION_ARCH.ddeb with scripts/package. Prints the folder and the packages' paths.
  --out DIR    write the packages into DIR (default: /out, as the Dockerfile's runtime stage expects)
  --build DIR  the build folder (default: build-container/ of the source tree, so that build/
               keeps its tests)
  --no-apt     install nothing: the machine has what the build needs (CI's, set up by scripts/setup)
  --no-build   package the build folder as it is (it must be built, without a sanitizer)
  --version    print the project's version
EOF
}

# Building the package, not testing it: no catch2, chromium or man-db (scripts/setup's other packages).
PACKAGES=(cmake g++ make binutils python3 libspdlog-dev libfmt-dev dpkg-dev file)
CMAKE_MINIMUM=3.25   # cmake_minimum_required() of CMakeLists.txt

out=/out
build=$root/build-container
apt=1
rebuild=1
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --version)
      version=$(sed -n 's/^project(poolshim VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
      echo "container/build-stage.sh ${version:?no project() version in $root/CMakeLists.txt}"
      exit 0
      ;;
    --out | --build)
      if [ $# -lt 2 ] || [ -z "$2" ]; then
        echo "poolshim build-stage: $1 needs a folder" >&2
        usage >&2
        exit 2
      fi
      if [ "$1" = --out ]; then out=$2; else build=$2; fi
      shift 2
      ;;
    --no-apt) apt=0; shift ;;
    --no-build) rebuild=0; shift ;;
    *)
      echo "poolshim build-stage: unknown argument $1" >&2
      usage >&2
      exit 2
      ;;
  esac
done
out=$(realpath -m "$out")
build=$(realpath -m "$build")

# True when cmake on PATH is at least CMAKE_MINIMUM (Ubuntu 22.04's is 3.22).
cmake_is_new_enough() {
  local have
  have=$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9][0-9.]*\).*/\1/p')
  [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$CMAKE_MINIMUM" "$have" | sort -V | head -n1)" = "$CMAKE_MINIMUM" ]
}

# apt-get install PACKAGE..., the lists fetched once.
updated=0
apt_install() {
  if [ "$(id -u)" != 0 ]; then
    echo "poolshim build-stage: installing $* needs root (as in the image);" \
      "pass --no-apt where the build has what it needs" >&2
    exit 2
  fi
  if [ "$updated" = 0 ]; then apt-get update -qq; updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if [ "$apt" = 1 ]; then
  missing=()
  for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "poolshim build-stage: installing ${missing[*]}"
    apt_install "${missing[@]}"
  fi
  if ! cmake_is_new_enough; then
    echo "poolshim build-stage: $(cmake --version | head -n1) is older than $CMAKE_MINIMUM: installing pip's cmake"
    if ! python3 -m pip --version >/dev/null 2>&1; then apt_install python3-pip; fi
    python3 -m pip install --no-cache-dir --quiet "cmake>=$CMAKE_MINIMUM"
    hash -r
  fi
  # The lists this run fetched: an image layer keeps no apt cache.
  if [ "$updated" = 1 ]; then rm -rf /var/lib/apt/lists/*; fi
fi
if ! cmake_is_new_enough; then
  echo "poolshim build-stage: needs cmake $CMAKE_MINIMUM or later on PATH (leave out --no-apt to install it)" >&2
  exit 1
fi

if [ "$rebuild" = 1 ]; then
  # Only what the package holds: the tests need catch2 and build three times as much.
  POOLSHIM_BUILD_DIR=$build "$root/scripts/build" -DPOOLSHIM_SANITIZE= -DPOOLSHIM_TESTS=OFF
fi
POOLSHIM_BUILD_DIR=$build "$root/scripts/package" --no-build --out "$out"
