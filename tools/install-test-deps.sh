#!/usr/bin/env bash
# The system packages cudatrace's test suite uses: the one list (README.md "Run the tests" and
# .ci/run both call this script). On Debian or Ubuntu, as root, it installs them with apt-get;
# elsewhere it prints what to install (the names are Debian's) and exits 1.
#
#   tools/install-test-deps.sh            install (as root, Debian/Ubuntu)
#   tools/install-test-deps.sh --list     print the packages, one a line, and what needs each
#   tools/install-test-deps.sh --pythons  print the CPythons it adds, one a line: VERSION PATH: why
#
# Besides the system's own Python, the suite runs its Python-frames tests on every CPython the
# machine has (tests/support/pyprogs.py). Two versions no Debian 12 has are always covered: this
# script takes each from the Debian release that ships it (PYTHONS below), unpacked with what it
# needs under $PYTHONS_DIR (dpkg never sees it: nothing of the system is replaced), run as
# $PYTHONS_DIR/bin/pythonX.Y: on this machine's C library when that release's is older, else
# through the release's own loader and C library.
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
    "tmux: test_top_terminal.py drives cudatrace top in a real terminal (keys sent, the screen read back)"
    "valgrind: callgrind counts the shim's instructions (tools/bench_callgrind.sh, tools/bench_modes.sh)"
    "debian-archive-keyring: the keys of the other Debian releases the CPythons of PYTHONS come from"
    "patchelf: points those CPythons at their own release's libraries"
)

# version release: what the suite checks with it
PYTHONS=(
    "3.9 bullseye: a CPython older than 3.11, whose frames the shim refuses with a note"
    "3.13 trixie: the 3.13 frame layout, checked against the interpreter's _Py_DebugOffsets"
)
PYTHONS_DIR=/opt/cudatrace-tests/python

names() {
    local p
    for p in "${PACKAGES[@]}"; do
        printf '%s\n' "${p%%:*}"
    done
}

if [[ "${1:-}" == "--list" ]]; then
    printf '%s\n' "${PACKAGES[@]}"
    exit 0
elif [[ "${1:-}" == "--pythons" ]]; then
    for p in "${PYTHONS[@]}"; do
        v="${p%% *}"
        printf '%s %s: %s\n' "$v" "$PYTHONS_DIR/bin/python$v" "${p#*: }"
    done
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

# fetch_python VERSION RELEASE WORK: CPython VERSION of Debian's RELEASE and what it needs (the
# whole closure: apt of its own, with that release's lists and an empty status), into WORK
# (the fetches run at once: each has its own lists, archives and package caches, or two apt-get
# renaming /var/cache/apt/pkgcache.bin race, "The package cache file is corrupted")
fetch_python() {
    local v="$1" release="$2" work="$3"
    mkdir -p "$work/lists/partial" "$work/archives/partial"
    : >"$work/status"
    printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n' \
        "$mirror" "$release" >"$work/sources.list"
    local apt=(apt-get -q -y -o Dir::Etc::SourceList="$work/sources.list"
        -o Dir::Etc::SourceParts=/nonexistent -o Dir::State::Lists="$work/lists"
        -o Dir::State::status="$work/status" -o Dir::Cache::archives="$work/archives"
        -o Dir::Cache::pkgcache="$work/pkgcache.bin" -o Dir::Cache::srcpkgcache="$work/srcpkgcache.bin"
        -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
    local want=("python$v-minimal" "libpython$v-stdlib")
    # the headers, where the suite checks the shim's layout tables against them (3.11 on)
    dpkg --compare-versions "$v" lt 3.11 || want+=("libpython$v-dev")
    "${apt[@]}" update && "${apt[@]}" install --download-only --no-install-recommends "${want[@]}"
}

# install_python VERSION RELEASE WORK: what fetch_python fetched, unpacked under
# $PYTHONS_DIR/VERSION and run as $PYTHONS_DIR/bin/pythonVERSION
install_python() {
    local v="$1" release="$2" work="$3" top="$PYTHONS_DIR/$1" deb libs="" d own_libc=0
    deb=("$work"/archives/libc6_*.deb)
    if dpkg --compare-versions "$(dpkg-deb -f "${deb[0]}" Version)" gt "$machine_libc"; then
        own_libc=1
    fi
    rm -rf "$top"
    mkdir -p "$top" "$PYTHONS_DIR/bin"
    for deb in "$work"/archives/*.deb; do
        # an older release's C library stays out: this machine's runs its programs
        [[ $own_libc == 0 && "$(dpkg-deb -f "$deb" Package)" == libc6 ]] && continue
        dpkg-deb -x "$deb" "$top"
    done
    for d in "$top"/lib/*-linux-gnu "$top"/usr/lib/*-linux-gnu; do
        [[ -d "$d" ]] && libs="$libs${libs:+:}$d"
    done
    # the interpreter finds that release's libraries first (DT_RPATH: for what it loads later
    # too, _ctypes' libffi); a newer release's C library through its own loader
    local py="$top/usr/bin/python$v" loader
    patchelf --force-rpath --set-rpath "$libs" "$py"
    if [[ $own_libc == 1 ]]; then
        loader="$(find "$top" -name 'ld-linux*.so.[0-9]' \( -type f -o -type l \) | head -n 1)"
        patchelf --set-interpreter "$loader" "$py"
    fi
    ln -sfn "$py" "$PYTHONS_DIR/bin/python$v"
    "$PYTHONS_DIR/bin/python$v" -c 'import ctypes, json' || {
        echo "install-test-deps: $PYTHONS_DIR/bin/python$v does not run" >&2
        return 1
    }
}

mapfile -t pkgs < <(names)
log="$(mktemp)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >"$log" 2>&1 || { cat "$log" >&2; echo "install-test-deps: apt-get update failed" >&2; exit 1; }
# The mirror this machine's apt takes Debian from (a Debian release's archive serves the others).
mirror="$(apt-get indextargets --format '$(REPO_URI)' 'Identifier: Packages' 'Origin: Debian' \
    'Label: Debian' | head -n 1)"
machine_libc="$(dpkg-query -W -f '${Version}' libc6)"
# the CPythons download while apt installs the packages
declare -A fetching releases
if [[ -n "$mirror" ]]; then
    for p in "${PYTHONS[@]}"; do
        v="${p%% *}" release="${p#* }"
        releases[$v]="${release%%:*}"
        fetch_python "$v" "${releases[$v]}" "$log.$v" >"$log.$v.log" 2>&1 &
        fetching[$v]=$!
    done
fi
if ! apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >"$log" 2>&1; then
    cat "$log" >&2
    echo "install-test-deps: apt-get install ${pkgs[*]} failed (the log is above)" >&2
    exit 1
fi
test -x /usr/bin/chromium || { echo "install-test-deps: /usr/bin/chromium missing after install" >&2; exit 1; }

if [[ -z "$mirror" ]]; then
    echo "install-test-deps: no Debian archive in this machine's apt sources: CPython" \
        "${PYTHONS[@]%% *} not added (their tests skip saying so; under CI=true they fail)" >&2
fi
for v in "${!fetching[@]}"; do
    if ! wait "${fetching[$v]}"; then
        cat "$log.$v.log" >&2
        echo "install-test-deps: CPython $v of Debian ${releases[$v]} could not be fetched" >&2
        exit 1
    fi
    install_python "$v" "${releases[$v]}" "$log.$v"
    rm -rf "$log.$v" "$log.$v.log"
done
rm -f "$log"
echo "install-test-deps: the ${#pkgs[@]} packages the tests use are installed, and CPython" \
    "$(printf '%s ' "${PYTHONS[@]%% *}")in $PYTHONS_DIR ($SECONDS s)"
