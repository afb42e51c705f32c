#!/usr/bin/env bash
# The system packages cudatrace's test suite uses: the one list (README.md "Run the tests" and
# .ci/run both call this script). On Debian or Ubuntu, as root, it installs them with apt-get;
# elsewhere it prints what to install (the names are Debian's) and exits 1.
#
#   tools/install-test-deps.sh          install (as root, Debian/Ubuntu)
#   tools/install-test-deps.sh --list   print the packages, one a line, and what needs each
#
# Nothing else is downloaded at test time except from PyPI (the Python extras, zig through the
# `ziglang` wheel) and Debian's archive (these packages).
set -euo pipefail

# package: what needs it
PACKAGES=(
    "gcc: the shim, the simulated driver and the test programs are built here"
    "g++: the C++ test programs (demangled names, allocator layers)"
    "make: native/Makefile"
    "libc6-dev: the C library's headers and static archive"
    "binutils: the linker, objcopy and readelf (separate debug files, symbol tests)"
    "clang-format: tests/unit/test_style_c.py checks the C of native/ and sim/"
    "golang-go: go tool pprof reads the pprof exports back (test_export.py)"
    "chromium: the HTML reports' browser tests, driven by Playwright (no browser download)"
    "python3-venv: the virtual environment the suite is installed into (pip refuses Debian's own)"
    "python3-dev: the Python-frames layout test compiles against the interpreter's headers"
    "gcc-aarch64-linux-gnu: test_aarch64.py cross-builds the shim and runs it under qemu"
    "libc6-dev-arm64-cross: the aarch64 C library to link against"
    "binutils-aarch64-linux-gnu: the aarch64 linker"
    "qemu-user: qemu-aarch64 -L runs the aarch64 builds (no binfmt needed)"
    "mmdebstrap: Debian 11 and 13 roots from deb.debian.org (test_old_images.py, test_glibc_versions.py: the glibc floor)"
    "musl-tools: musl-gcc and musl's loader, for the Alpine-like image of test_old_images.py (musl programs start unfenced)"
    "prometheus: test_metrics.py scrapes cudatrace metrics with a real server on 127.0.0.1"
    "slurm-wlm: test_slurm.py runs a one-node cluster with cudatrace as its TaskProlog"
    "munge: Slurm's authentication, for that cluster"
    "util-linux: setpriv runs a process as another uid; unshare makes namespaces"
    "podman: real containers given cudatrace's CDI devices, pods the webhook patched (podman kube play)"
    "runc: podman's runtime"
    "uidmap: newuidmap/newgidmap for podman's user namespaces"
    "openssl: the admission webhook's and the test API server's certificates"
    "valgrind: callgrind counts the shim's instructions (tools/bench_callgrind.sh, tools/bench_modes.sh)"
)

names() {
    local p
    for p in "${PACKAGES[@]}"; do
        printf '%s\n' "${p%%:*}"
    done
}

if [[ "${1:-}" == "--list" ]]; then
    printf '%s\n' "${PACKAGES[@]}"
    exit 0
elif [[ $# -gt 0 ]]; then
    echo "usage: $0 [--list]" >&2
    exit 2
fi

if ! command -v apt-get >/dev/null; then
    echo "install-test-deps: no apt-get here (this script installs on Debian or Ubuntu)." >&2
    echo "Install these with your package manager (Debian's names; what needs each):" >&2
    printf '  %s\n' "${PACKAGES[@]}" >&2
    exit 1
fi
if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null; then
        exec sudo -- "$0" "$@"
    fi
    echo "install-test-deps: run it as root (apt-get installs system packages)" >&2
    exit 1
fi

mapfile -t pkgs < <(names)
log="$(mktemp)"
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${pkgs[@]}"; } \
        >"$log" 2>&1; then
    cat "$log" >&2
    echo "install-test-deps: apt-get install ${pkgs[*]} failed (the log is above)" >&2
    exit 1
fi
rm -f "$log"
test -x /usr/bin/chromium || { echo "install-test-deps: /usr/bin/chromium missing after install" >&2; exit 1; }
echo "install-test-deps: the ${#pkgs[@]} packages the tests use are installed"
