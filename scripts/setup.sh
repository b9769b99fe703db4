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
# devices, MUNGE, Slurm) and the benchmarks (fio, fs_mark, sqlite3, mkfs) need.
PACKAGES=(
    build-essential pkg-config make gcc tar git curl ca-certificates
    libsqlite3-dev sqlite3
    fuse3 libfuse3-dev kmod
    fio fsmark jq
    acl rsync   # setfacl/getfacl, rsync -aA: tests/posix/test_acl.py
    xfsprogs e2fsprogs util-linux
    iproute2 procps psmisc
    python3 python3-pytest python3-hypothesis python3-pytest-timeout
    shellcheck
    mpich libmpich-dev   # MPI-IO through ROMIO: tests/posix/test_mpi_io.py, bench/shared.sh
    munge libmunge-dev
    # Slurm 22.05 for tests/harness/slurm.py (the tests run their own slurmctld and slurmd):
    # the daemons, the client commands (sbatch, scontrol, squeue, scancel, sinfo) and
    # the plugins, among them burst_buffer_datawarp.so, burst_buffer_lua.so (which pulls
    # in liblua5.1-0) and serializer_json.so (the lua plugin parses pools JSON with it).
    # The packages also create the user `slurm` (SlurmUser of the test sites).
    slurmctld slurmd slurm-client slurm-wlm-basic-plugins
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
    # No package may start its service while we install: slurmctld and slurmd would run
    # as system daemons (the tests start their own), and munged is started below where it
    # is needed. invoke-rc.d and deb-systemd-invoke both ask policy-rc.d; exit 101 means
    # "not allowed". An existing policy-rc.d (Docker images have one) is left alone.
    temp_policy=""
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        temp_policy=/usr/sbin/policy-rc.d
        trap 'rm -f "$temp_policy"' EXIT
        printf '#!/bin/sh\n# scripts/setup.sh: no service starts during its apt-get install\nexit 101\n' >"$temp_policy"
        chmod 0755 "$temp_policy"
    fi
    apt-get update -q </dev/null
    apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
    if [[ -n "$temp_policy" ]]; then
        rm -f "$temp_policy"
        trap - EXIT
    fi
fi

# ---------------------------------------------------------------- Slurm
# The tests run slurmctld and slurmd of their own (tests/harness/slurm.py: own slurm.conf, ports,
# state and munged); Debian's services stay off. Their systemd units and init scripts only
# start with an /etc/slurm/slurm.conf, which a test machine does not have; the postinst
# enables the units all the same, so where systemd runs and Slurm is unconfigured they are
# disabled here (a configured system Slurm is left alone: the tests' sites use other
# ports, directories and their own munged, and do not collide with it).
id slurm >/dev/null 2>&1 || die "no user 'slurm': are the Debian slurm packages installed completely?"
if [[ -d /run/systemd/system && ! -e /etc/slurm/slurm.conf && $EUID -eq 0 ]]; then
    for unit in slurmctld.service slurmd.service; do
        if systemctl -q is-enabled "$unit" 2>/dev/null || systemctl -q is-active "$unit" 2>/dev/null; then
            say "disabling Debian's $unit (the tests run their own Slurm daemons)"
            systemctl disable --now "$unit" || die "systemctl could not disable $unit"
        fi
    done
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
            die "could not install Rust with rustup. Install a Rust toolchain (>= 1.88, with rustfmt and clippy) by hand so that 'cargo' is on PATH or in ~/.cargo/bin, then re-run $0"
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

# ---------------------------------------------------------------- MUNGE
# The manager authenticates callers, and storage servers the manager, with credentials
# verified by the system munged (docs/auth.md): it must run and answer on its default
# socket. The package's postinst makes the key but cannot start the daemon where
# invoke-rc.d is denied (containers) and there is no systemd, so it is started here.
MUNGE_SOCKET=/run/munge/munge.socket.2
munge_answers() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
if munge_answers; then
    say "munged answers on $MUNGE_SOCKET"
else
    [[ $EUID -eq 0 ]] || die "munged does not answer on $MUNGE_SOCKET and not running as root: start it as root"
    id munge >/dev/null 2>&1 || die "no user 'munge': is the Debian package munge installed completely?"
    # As the package's postinst does: the key belongs to munge and nobody else reads it
    # (munged refuses to start otherwise).
    if [[ ! -s /etc/munge/munge.key ]]; then
        say "creating the MUNGE key /etc/munge/munge.key (mungekey)"
        install -d -o munge -g munge -m 0700 /etc/munge
        runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key ||
            die "mungekey could not create /etc/munge/munge.key"
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    if [[ -d /run/systemd/system ]]; then
        say "starting munged (systemctl)"
        systemctl enable --now munge.service || die "systemctl could not start munge.service"
    else
        say "starting munged as user munge (no systemd)"
        # The directories munged checks at start; the package makes all but /run/munge,
        # which lives in a tmpfs. munged's socket directory must be executable by all.
        install -d -o munge -g munge -m 0755 /run/munge
        install -d -o munge -g munge -m 0700 /var/log/munge
        install -d -o munge -g munge -m 0711 /var/lib/munge
        # env -i: a system daemon, not a process of this run. scripts/test.sh stops, at
        # its exit, every process whose environment carries its SPILLWAY_RUN_TAG.
        env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin runuser -u munge -- /usr/sbin/munged ||
            die "munged did not start: see /var/log/munge/munged.log"
    fi
    for _ in $(seq 50); do
        munge_answers && break
        sleep 0.2
    done
    munge_answers || die "munged does not answer on $MUNGE_SOCKET: see /var/log/munge/munged.log"
    say "munged started and answers on $MUNGE_SOCKET"
fi

# ---------------------------------------------------------------- build
if [[ "${SPILLWAY_SKIP_BUILD:-0}" == 1 ]]; then
    say "SPILLWAY_SKIP_BUILD=1: not building"
else
    say "building the workspace (cargo build --release --workspace)"
    (cd "$REPO" && cargo build --release --workspace </dev/null) || die "cargo build --release --workspace failed"
    say "build done: binaries in $REPO/target/release"
    # libdatawarp (the DataWarp C API, docs/libdatawarp.md): built and installed under
    # /usr/local (header, library, pkg-config files cray-datawarp and datawarp).
    # `make` rebuilds only what changed and `install` overwrites in place: idempotent.
    if [[ $EUID -eq 0 ]]; then
        say "building and installing libdatawarp (PREFIX=/usr/local)"
        make -C "$REPO/libdatawarp" --no-print-directory PREFIX=/usr/local all install </dev/null |
            sed 's/^/[setup] libdatawarp: /' || die "libdatawarp build or install failed"
        ldconfig || die "ldconfig failed after installing libdatawarp"
        pkg-config --exists cray-datawarp ||
            die "pkg-config does not find cray-datawarp after installing libdatawarp"
    else
        say "not root: libdatawarp built but not installed (run as root to install it)"
        make -C "$REPO/libdatawarp" --no-print-directory all </dev/null |
            sed 's/^/[setup] libdatawarp: /' || die "libdatawarp build failed"
    fi
    # The command line where sites and Slurm look for it: GetSysState/GetSysStatus in
    # burst_buffer.conf and slurm/burst_buffer.lua name /usr/local/bin/dw_wlm_cli and
    # /usr/local/bin/dwstat (docs/jobs.md). install replaces a running binary safely
    # (a new inode), so agents started from an older copy keep running.
    if [[ $EUID -eq 0 ]]; then
        for bin in spillway dwstat dwcli dw_wlm_cli; do
            install -m 0755 "$REPO/target/release/$bin" "/usr/local/bin/$bin" ||
                die "could not install $bin into /usr/local/bin"
        done
        say "installed spillway, dwstat, dwcli, dw_wlm_cli into /usr/local/bin"
    fi
    # The manager's HTTPS identity is made at install: a site CA and a certificate for
    # this host (kept if present; manager.conf and spillway.conf can point elsewhere).
    if [[ $EUID -eq 0 ]]; then
        "$REPO/target/release/spillway" tls init --dir /etc/spillway/tls </dev/null |
            sed 's/^/[setup] tls: /' || die "spillway tls init failed"
    fi
fi
say "ready"
