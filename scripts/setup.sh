#!/usr/bin/env bash
# Spillway setup: installs everything the project, its tests and its benchmarks need on
# Debian 12 (as root), makes sure FUSE is usable, and builds the workspace in release mode.
#
# Idempotent and fast when everything is already there: apt-get runs only if a package
# is missing (checked with dpkg-query), rustup only if cargo is nowhere to be found.
#
# Environment:
#   SPILLWAY_SKIP_BUILD=1   do everything except `cargo build --release --workspace`
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# Packages the project (build), the tests (pytest suite, FUSE, network namespaces, loop
# devices) and the benchmarks (fio, fs_mark, sqlite3, mkfs) need.
PACKAGES=(
    build-essential pkg-config make gcc tar git curl ca-certificates
    libsqlite3-dev sqlite3
    fuse3 libfuse3-dev kmod
    fio fsmark jq
    xfsprogs e2fsprogs util-linux
    iproute2 procps psmisc
    python3 python3-pytest python3-hypothesis python3-pytest-timeout
    shellcheck
)

# ---------------------------------------------------------------- Debian packages
missing=()
for pkg in "${PACKAGES[@]}"; do
    status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
    if [[ "$status" != "install ok installed" ]]; then
        missing+=("$pkg")
    fi
done

if ((${#missing[@]} == 0)); then
    say "all ${#PACKAGES[@]} Debian packages already installed"
else
    [[ $EUID -eq 0 ]] || die "packages missing (${missing[*]}) and not running as root: run as root"
    command -v apt-get >/dev/null || die "apt-get not found: Spillway's setup targets Debian 12"
    say "installing ${#missing[@]} missing package(s): ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q </dev/null
    apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
fi

# ---------------------------------------------------------------- Rust toolchain
if ! command -v cargo >/dev/null 2>&1; then
    if [[ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]]; then
        export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
    elif [[ -x /root/.cargo/bin/cargo ]]; then
        export PATH="/root/.cargo/bin:$PATH"
    else
        say "cargo not found: installing the Rust toolchain with rustup (non-interactive)"
        if ! curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs -o /tmp/rustup-init.sh ||
            ! sh /tmp/rustup-init.sh -y --no-modify-path --profile minimal \
                --component rustfmt,clippy </dev/null; then
            rm -f /tmp/rustup-init.sh
            die "could not install Rust with rustup. Install a Rust toolchain (>= 1.85, with rustfmt and clippy) by hand so that 'cargo' is on PATH or in ~/.cargo/bin, then re-run $0"
        fi
        rm -f /tmp/rustup-init.sh
        export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
    fi
fi
command -v cargo >/dev/null 2>&1 || die "cargo still not on PATH after installation"
# rustfmt and clippy are needed by scripts/test.sh.
if command -v rustup >/dev/null 2>&1; then
    for comp in rustfmt clippy; do
        tool=$([[ $comp == rustfmt ]] && echo cargo-fmt || echo cargo-clippy)
        if ! command -v "$tool" >/dev/null 2>&1; then
            say "adding rustup component $comp"
            rustup component add "$comp" </dev/null || die "could not add rustup component $comp"
        fi
    done
fi
say "$(cargo --version)"

# ---------------------------------------------------------------- FUSE
if [[ ! -c /dev/fuse ]]; then
    say "/dev/fuse missing: loading the fuse module"
    modprobe fuse 2>/dev/null || true
    if [[ ! -c /dev/fuse ]] && [[ $EUID -eq 0 ]]; then
        mknod -m 0666 /dev/fuse c 10 229 2>/dev/null || true
    fi
    [[ -c /dev/fuse ]] || die "/dev/fuse is not available (no fuse module?): Spillway's client needs FUSE"
fi
if [[ -f /etc/fuse.conf ]] && grep -Eq '^[[:space:]]*user_allow_other[[:space:]]*$' /etc/fuse.conf; then
    :
elif [[ $EUID -eq 0 ]]; then
    say "enabling user_allow_other in /etc/fuse.conf"
    printf 'user_allow_other\n' >>/etc/fuse.conf
else
    die "user_allow_other missing from /etc/fuse.conf and not running as root"
fi
command -v fusermount3 >/dev/null || die "fusermount3 not found (package fuse3)"

# ---------------------------------------------------------------- build
if [[ "${SPILLWAY_SKIP_BUILD:-0}" == 1 ]]; then
    say "SPILLWAY_SKIP_BUILD=1: not building"
else
    say "building the workspace (cargo build --release --workspace)"
    (cd "$REPO" && cargo build --release --workspace </dev/null) || die "cargo build --release --workspace failed"
    say "build done: binaries in $REPO/target/release"
fi
say "ready"
