#!/usr/bin/env bash
# Builds Corral's release binaries into target/release, the `corral` CLI
# linked statically and at a fixed address (no PIE; the daemons stay
# dynamic).
#
#   bash ctl/build.sh [cargo options, such as -q]
#
# Why: every Slurm command a script runs is one `corral` process, and on
# this machine a dynamically linked one spends about half its start in the
# dynamic loader and in libraries' start-up (`hyperfine -N -r 300
# 'corral --version'`, four alternations: 1.4-1.6 ms dynamic, 0.8-0.9 ms
# static). The agent stays
# dynamic because it loads NVML with dlopen, which a static glibc program
# can do only for libraries built against its very glibc; ctld gains
# nothing from it. A static CLI still reads the user database through NSS:
# `files` is built in, other sources (sss, ldap, systemd) are loaded as
# modules, which must come from the glibc it was built with, so build it
# on the distribution the cluster runs.
#
# Not a static-pie: a position-independent one fixes up its own 11,500
# pointers at every start (`_dl_relocate_static_pie`, 9% of a held
# sbatch's samples) and so dirties 40 pages it then faults in one by one
# (`perf stat -e page-faults corral --version`: 78 as a static-pie, 40
# at a fixed address; `hyperfine -N -r 500`, three alternations: 1.4 /
# 1.2 / 1.1 ms against 1.1 / 1.0 / 0.7 ms). What is given up is the
# random placement of the binary's own code and data (the stack, heap
# and mappings stay random), in a process that runs with its user's
# rights only and talks to the local agent alone.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bins "$@"
# cargo keeps no record of a `cargo rustc` flag: the CLI's own crate is
# made newer than its last link so that it is linked again, statically
# (only that crate is compiled again; its dependencies are the build's).
touch ctl/src/bin/corral.rs
cargo rustc --release --locked -p corral-ctl --bin corral "$@" -- -C target-feature=+crt-static -C relocation-model=static
if command -v readelf > /dev/null && readelf -lW target/release/corral | grep -q 'program interpreter'; then
    echo "ctl/build.sh: target/release/corral is still dynamically linked" >&2
    exit 1
fi
if command -v readelf > /dev/null && ! readelf -hW target/release/corral | grep -q 'Type: *EXEC'; then
    echo "ctl/build.sh: target/release/corral is position-independent" >&2
    exit 1
fi
