#!/usr/bin/env bash
# The runtime stage of container/Dockerfile (README "In a container"), and all that it RUNs:
# installs poolshim's Debian package into the PyTorch image (apt-get, which brings what its
# Depends names: python3) and checks the installed tools. It sets nothing: a run opts in with
# LD_PRELOAD or the launcher. CI runs it on its own (tests/container) with --root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=container/runtime-stage.sh
# The package's library, the one to preload (CMakeLists.txt installs it in LIBDIR/poolshim, /usr/lib/poolshim).
LIBRARY=/usr/lib/poolshim/libpoolshim.so

usage() {
  cat <<'EOF'
usage: container/runtime-stage.sh [--root DIR] DEB

The runtime stage of container/Dockerfile. Installs DEB, poolshim's Debian package
(poolshim_VERSION_ARCH.deb), then checks that the installed poolshim, poolshim-report and
poolshim-replay say its version and that the library to preload, /usr/lib/poolshim/libpoolshim.so,
is there. Sets
nothing else: a run opts in with LD_PRELOAD, or runs its command under the poolshim launcher.
  --root DIR  install into DIR with dpkg --root, unprivileged, and check the tools there; DIR's
              dpkg database (DIR/var/lib/dpkg/status) must hold the packages DEB depends on.
              Default: this system's root, with apt-get, which installs what DEB depends on
  --version   print the project's version
EOF
}

fail() {   # fail STATUS MESSAGE
  echo "poolshim runtime-stage: $2" >&2
  exit "$1"
}

root=/
deb=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --version)
      # Beside the source tree's CMakeLists.txt (not in the image, where the script is copied alone).
      [ -f "$here/../CMakeLists.txt" ] ||
        fail 1 "no CMakeLists.txt in $(dirname "$here"): --version reads project() there"
      version=$(sed -n 's/^project(poolshim VERSION \([0-9.]*\).*/\1/p' "$here/../CMakeLists.txt")
      echo "$name ${version:?no project() version in $here/../CMakeLists.txt}"
      exit 0
      ;;
    --root)
      if [ $# -lt 2 ] || [ -z "$2" ]; then
        echo "poolshim runtime-stage: --root needs a folder" >&2
        usage >&2
        exit 2
      fi
      root=$2
      shift 2
      ;;
    -*)
      echo "poolshim runtime-stage: unknown option $1" >&2
      usage >&2
      exit 2
      ;;
    *)
      if [ -n "$deb" ]; then
        echo "poolshim runtime-stage: one package, not $deb and $1" >&2
        usage >&2
        exit 2
      fi
      deb=$1
      shift
      ;;
  esac
done
if [ -z "$deb" ]; then
  echo "poolshim runtime-stage: no package named" >&2
  usage >&2
  exit 2
fi
[ -f "$deb" ] || fail 2 "$deb: no such package file"
package=$(dpkg-deb -f "$deb" Package 2>/dev/null) || fail 2 "$deb: not a Debian package"
[ "$package" = poolshim ] || fail 2 "$deb: package $package, not poolshim"
version=$(dpkg-deb -f "$deb" Version)
deb=$(realpath "$deb")

log=$(mktemp "${TMPDIR:-/tmp}/poolshim-runtime-stage-XXXXXX")
trap 'rm -f "$log"' EXIT
if [ "$root" = / ]; then
  [ "$(id -u)" = 0 ] || fail 2 "installing into / needs root (as in the image); --root DIR installs elsewhere"
  # apt-get installs what Depends names and is missing (python3: the image's own Python is
  # conda's), and refuses a package whose minimum versions this system does not meet.
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$deb"; } \
    >"$log" 2>&1; then
    cat "$log" >&2
    fail 1 "apt-get could not install $deb (output above)"
  fi
  rm -rf /var/lib/apt/lists/*
else
  root=$(realpath -m "$root")
  [ -f "$root/var/lib/dpkg/status" ] || fail 2 "$root is not a dpkg root (no var/lib/dpkg/status)"
  mkdir -p "$root/var/log"
  # dpkg runs ldconfig from PATH, also unprivileged; the maintainer scripts do nothing (packaging/).
  if ! PATH=$PATH:/usr/sbin:/sbin dpkg --root="$root" --log="$root/var/log/dpkg.log" --force-not-root \
    --force-script-chrootless -i "$deb" >"$log" 2>&1; then
    cat "$log" >&2
    fail 1 "dpkg could not install $deb into $root (output above)"
  fi
fi

at=${root%/}
for tool in poolshim poolshim-report poolshim-replay; do
  said=$("$at/usr/bin/$tool" --version 2>&1) || fail 1 "the installed $tool does not run: $said"
  [ "$said" = "$tool $version" ] || fail 1 "the installed $tool says '$said', not '$tool $version'"
done
[ -f "$at$LIBRARY" ] || fail 1 "no library at $at$LIBRARY"
echo "poolshim runtime-stage: installed poolshim $version in $root"
echo "poolshim runtime-stage: a run preloads LD_PRELOAD=$LIBRARY, or runs: poolshim -- COMMAND"
