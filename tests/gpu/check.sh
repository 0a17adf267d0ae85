#!/usr/bin/env bash
# The real-GPU check: Corral's NVML backend and GPU isolation against this
# machine's NVIDIA GPUs. CI machines have none, so this is not part of
# `.ci/run`; run it as root on a machine with an NVIDIA driver:
#
#   cargo build --release --bins && sudo bash tests/gpu/check.sh
#
# BIN=DIR takes the binaries from DIR (default target/release). With
# busybox on PATH it also runs a GPU job inside a tiny jail. It prints what
# it saw and ends with `gpu check: N failed`, exiting non-zero on a failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=$(cd "${BIN:-target/release}" && pwd)
failed=0
ok() { echo "ok: $*"; }
bad() {
    echo "FAIL: $*"
    failed=$((failed + 1))
}
work=$(mktemp -d /tmp/corral-gpu-XXXXXX)
chmod 755 "$work"

echo "== the host's GPUs (nvidia-smi)"
nvidia-smi -L || bad "nvidia-smi -L on the host"
mapfile -t uuids < <(nvidia-smi --query-gpu=uuid --format=csv,noheader)

echo
echo "== corral-agent --gpus nvml --show-gpus"
t0=$(date +%s%N)
"$BIN/corral-agent" --name gpucheck --gpus nvml --show-gpus | tee "$work/show"
echo "(NVML loaded and read in $((($(date +%s%N) - t0) / 1000000)) ms)"
seen=$(grep -c '^gpu ' "$work/show")
if [ "$seen" -ge 1 ] && [ "$seen" = "${#uuids[@]}" ]; then
    ok "NVML sees $seen GPU(s), as nvidia-smi does"
else
    bad "NVML sees $seen GPU(s), nvidia-smi ${#uuids[@]}"
fi
for u in "${uuids[@]}"; do
    grep -q "uuid=$u " "$work/show" && ok "$u reported" || bad "$u not reported"
done
grep -q 'temperature=[0-9][0-9]*C' "$work/show" && ok "temperature read" || bad "no temperature"
grep -q 'ecc_uncorrectable=[0-9]' "$work/show" && ok "ECC count read" || bad "no ECC count"
dev=$(sed -n 's/^gpu 0 .*device=\(\/dev\/nvidia[0-9]*\).*/\1/p' "$work/show")
uuid0=$(sed -n 's/^gpu 0 uuid=\([^ ]*\).*/\1/p' "$work/show")
echo "GPU 0 is $uuid0 at $dev"

echo
echo "== corral up --nvml: worker-0 has this machine's GPUs"
cat >"$work/job.sh" <<JOB
set -u
scontrol show node worker-0 | grep -o 'Gres=[^ ]*'
echo "-- a step given a GPU"
srun -w worker-0 --gres=gpu:1 sh -c 'echo CUDA_VISIBLE_DEVICES=\$CUDA_VISIBLE_DEVICES; nvidia-smi -L; if (: < $dev); then echo OPEN=ok; fi'
echo "-- a step given no GPU"
srun -w worker-0 sh -c 'echo CUDA_VISIBLE_DEVICES=\${CUDA_VISIBLE_DEVICES-unset}; if (: < $dev); then echo OPEN=ok; fi; nvidia-smi -L 2>&1 | head -n 2; true'
echo "-- srun -w worker-0 --gres=gpu:1 true, 20 times (ms)"
for i in \$(seq 20); do
    t0=\$(date +%s%N); srun -w worker-0 --gres=gpu:1 true; echo \$(( (\$(date +%s%N) - t0) / 1000000 ))
done | sort -n | tr '\n' ' '; echo
JOB
"$BIN/corral" up --nvml --nodes 2 --gpus-per-node 2 --dir "$work/cluster" -- bash "$work/job.sh" 2>&1 | tee "$work/up"
grep -q "^Gres=gpu:$seen\$" "$work/up" && ok "worker-0 offers gpu:$seen" || bad "worker-0 does not offer gpu:$seen"
grep -q "^CUDA_VISIBLE_DEVICES=0$" "$work/up" && ok "the GPU step has CUDA_VISIBLE_DEVICES=0" || bad "CUDA_VISIBLE_DEVICES of the GPU step"
grep -q "UUID: $uuid0)" "$work/up" && ok "the GPU step's nvidia-smi sees $uuid0" || bad "the GPU step's nvidia-smi does not see $uuid0"
[ "$(grep -c 'OPEN=ok' "$work/up")" -ge 1 ] && ok "the GPU step opens $dev" || bad "the GPU step cannot open $dev"
# The agent hides every GPU from CUDA in a step without one (empty).
grep -q '^CUDA_VISIBLE_DEVICES=$' "$work/up" && ok "the step without a GPU has CUDA_VISIBLE_DEVICES empty" || bad "CUDA_VISIBLE_DEVICES of the step without a GPU"
if grep -q 'jobs run in cgroups' "$work/cluster/log/worker-0.log"; then
    grep 'jobs run in cgroups' "$work/cluster/log/worker-0.log" | head -n 1
    if [ "$(grep -c 'OPEN=ok' "$work/up")" = 1 ] && grep -q "$dev: Operation not permitted" "$work/up"; then
        ok "the step without a GPU gets EPERM on $dev"
    else
        bad "the step without a GPU was not refused $dev"
    fi
else
    bad "worker-0 ran without cgroups: $(grep -m1 'no cgroups' "$work/cluster/log/worker-0.log")"
fi

if command -v busybox >/dev/null; then
    echo
    echo "== the same GPU inside a busybox jail (driver bound from the host)"
    "$BIN/corral" jail init "$work/root" --busybox >/dev/null || bad "corral jail init --busybox"
    # The agent binds the driver's nvidia-smi and libraries; the C library
    # they need is the root's own (a busybox root has only what corral
    # needs), as a real distribution's root would have it.
    for d in /usr/local/nvidia/bin /usr/bin /usr/local/bin; do
        if [ -f "$d/nvidia-smi" ] && [ "$(head -c 2 "$d/nvidia-smi")" != '#!' ]; then
            ldd "$d/nvidia-smi" | awk '$3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' |
                while read -r lib; do
                    mkdir -p "$work/root$(dirname "$lib")"
                    [ -e "$work/root$lib" ] || cp -L "$lib" "$work/root$lib"
                done
            break
        fi
    done
    cat >"$work/jail.sh" <<JOB
cd /tmp
srun -w worker-0 --gres=gpu:1 sh -c 'head -n 1 /etc/os-release; ls /dev | grep nvidia | tr "\n" " "; echo; nvidia-smi -L'
JOB
    "$BIN/corral" up --nvml --nodes 1 --gpus-per-node 1 --jail "$work/root" --dir "$work/jailed" -- bash "$work/jail.sh" 2>&1 | tee "$work/jail"
    grep -q '^ID=corral-busybox$' "$work/jail" && ok "the step ran in the jail" || bad "the step did not run in the jail"
    grep -q "UUID: $uuid0)" "$work/jail" && ok "nvidia-smi works in the jail and sees $uuid0" || bad "nvidia-smi in the jail"
else
    echo "(no busybox on PATH: the jailed GPU step was not run)"
fi

echo
echo "gpu check: $failed failed (files in $work)"
[ "$failed" = 0 ]
