#!/usr/bin/env bash
# Builds Corral's release binaries into target/release, the `corral` CLI
# linked statically (a glibc static-pie; the daemons stay dynamic).
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
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bins "$@"
# cargo keeps no record of a `cargo rustc` flag: the CLI's own crate is
# made newer than its last link so that it is linked again, statically
# (only that crate is compiled again; its dependencies are the build's).
touch ctl/src/bin/corral.rs
cargo rustc --release --locked -p corral-ctl --bin corral "$@" -- -C target-feature=+crt-static
if command -v readelf > /dev/null && readelf -lW target/release/corral | grep -q 'program interpreter'; then
    echo "ctl/build.sh: target/release/corral is still dynamically linked" >&2
    exit 1
fi
