#!/usr/bin/env bash
# Corral beside Slurm on this machine, measured the same way.
#
#   bash benches/compare.sh [--quick] [--slurm-htc | --slurm-both] [--out DIR]
#
# Sets up a single-host Slurm cluster from Debian's packages (slurm-wlm,
# munge; installed with apt when missing) in a scratch directory: its own
# munged, a slurmctld and four `slurmd -N nX` with 16 CPUs, 64 GB and 8 fake
# GPUs each, and `corral up` with the same shape. Runs the same workloads
# through the same Slurm commands on each cluster in turn (each workload
# on one, then on the other, so that the machine's slow and fast spells
# fall on both; the cluster not in use runs at idle priority, so that its
# background work does not land in the other's figures), then stops
# exactly the processes it started (by pid). Writes the samples
# (DIR/samples.jsonl), then the table (DIR/compare.md, also printed),
# DIR/compare.json and DIR/compare.png (compare-report).
#
# Last, both replay the same slice of a real trace (KTH's SP2) as `sleep`
# jobs, time compressed, and report utilisation, mean wait and mean
# bounded slowdown.
#
# --quick: smaller counts, one repetition (about 3 minutes). --slurm-htc:
# Slurm with the settings of its high-throughput guide rather than its
# defaults. --slurm-both: Slurm twice, with its defaults and with those
# settings (a tenth of the tiny jobs and of the sruns there: every srun
# waits about 12 s under those settings), and each figure against the
# better of the two. --corral-only: Corral's half alone. Every loop is bounded in count and time. Run as root (slurmd
# and munged want it; the fake GPUs are device nodes).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/target/compare
QUICK=0
HTC=0
while [ $# -gt 0 ]; do
    case $1 in
        --quick) QUICK=1 ;;
        --slurm-htc) HTC=1 ;;
        --slurm-both) HTC=2 ;;
        --corral-only) HTC=none ;;
        --out) OUT=$2; shift ;;
        *) echo "compare.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
if [ "$(id -u)" != 0 ]; then
    echo "compare.sh: run as root (slurmd, munged and the fake GPU devices need it)" >&2
    exit 1
fi

if [ $QUICK = 1 ]; then
    REPS=1 N_SUB=200 N_TINY=100 N_PEND=2000 N_SRUN=20 N_TRACE=25
else
    REPS=3 N_SUB=1000 N_TINY=1000 N_PEND=10000 N_SRUN=100 N_TRACE=60
fi
# The trace slice both clusters replay: KTH's SP2 (100 CPUs) from its
# 2,000th job, time compressed TRACE_SCALE times, each job's CPUs capped at
# the 64 both clusters have.
TRACE=$ROOT/../shared/traces/KTH-SP2-1996-2.1-cln.swf.gz
TRACE_FROM=2000
TRACE_SCALE=600

mkdir -p "$OUT"
SAMPLES=$OUT/samples.jsonl
: > "$SAMPLES"
SCRATCH=$(mktemp -d /tmp/corral-compare.XXXXXX)
chmod 755 "$SCRATCH"
PIDS=()

cleanup() {
    # Our own subshells and submit loops first, then the daemons.
    pkill -P $$ 2>/dev/null || true
    for p in "${PIDS[@]:-}"; do
        [ -n "$p" ] && kill "$p" 2>/dev/null || true
    done
    sleep 1
    for p in "${PIDS[@]:-}"; do
        [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true
    done
    rm -rf "$SCRATCH"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { echo "compare: $*" >&2; }
ms_now() { echo $(( $(date +%s%N) / 1000000 )); }
# A single command is timed with bash's clock ($EPOCHREALTIME, in µs once
# the point goes): `t1=$(date ...)` would time a fork and an exec of date
# too, 1-3 ms here, as much as a Corral srun's whole difference.
bash_us() { printf -v "$1" '%s' "${EPOCHREALTIME/[.,]/}"; }

# sample FIGURE VALUE UNIT higher|lower
sample() {
    # bc writes a value under 1 without its leading 0 (.24), which JSON
    # does not allow: printf writes it as a number.
    local v
    v=$(LC_NUMERIC=C printf '%.6f' "$2")
    printf '{"figure":"%s","system":"%s","value":%s,"unit":"%s","better":"%s"}\n' \
        "$1" "$SYS" "$v" "$3" "$4" >> "$SAMPLES"
}

# Waits (at most $1 seconds) until no job is left in the queue.
wait_empty() {
    local deadline=$(( $(date +%s) + $1 ))
    while [ "$(squeue -h 2>/dev/null | wc -l)" != 0 ]; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            say "$SYS: queue not empty after $1 s"
            return 1
        fi
        sleep 0.05
    done
}

# The pid a daemon wrote to file $1 (it may take a moment to appear).
pid_from() {
    local deadline=$(( $(date +%s) + 15 ))
    until [ -s "$1" ]; do
        [ "$(date +%s)" -lt "$deadline" ] || { say "no pid file $1"; return 1; }
        sleep 0.05
    done
    cat "$1"
}

rss_mib() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }

# Submits $1 jobs from $2 parallel clients (extra sbatch options after).
submit_n() {
    local n=$1 clients=$2
    shift 2
    local per=$(( (n + clients - 1) / clients ))
    local c pids=()
    for c in $(seq 1 "$clients"); do
        (for _ in $(seq 1 "$per"); do sbatch "$@" -o /dev/null --wrap true > /dev/null; done) &
        pids+=("$!")
    done
    # Its own loops only: `corral up` runs in the background of this shell.
    wait "${pids[@]}"
}

# Percentile $2 (0-100) of the numbers in file $1.
pct() { sort -n "$1" | awk -v p="$2" '{v[NR]=$1} END {i=int((NR-1)*p/100+0.5)+1; print v[i]}'; }

# The slice as `offset_s cpus run_s limit_s` lines: submit offsets and run
# times divided by TRACE_SCALE (runs at least 1 s), the limit at least the
# run (SWF: 2 submit, 4 run, 5 allocated CPUs, 8 requested, 9 requested
# time).
trace_slice() {
    zcat "$TRACE" | awk -v from="$TRACE_FROM" -v n="$N_TRACE" -v f="$TRACE_SCALE" '
        /^;/ { next }
        { i++ }
        i >= from && i < from + n {
            if (i == from) s = $2
            cpus = ($8 > 0) ? $8 : $5; if (cpus > 64) cpus = 64; if (cpus < 1) cpus = 1
            run = $4 / f; if (run < 1) run = 1
            lim = (($9 > 0) ? $9 : $4) / f; if (lim < run) lim = run
            printf "%.2f %d %.1f %d\n", ($2 - s) / f, cpus, run, int(lim) + 1
        }'
}

# Replays the slice in real time through sbatch (`sleep` jobs), waits for
# the queue to empty, and reads each job's submit, start and end from
# `scontrol show job -o` (both keep finished jobs 300 s): utilisation of
# the 64 CPUs from the first submit to the last end, mean wait, and mean
# bounded slowdown (runs under 10 s count as 10 s).
trace_quality() {
    local slice=$SCRATCH/trace.txt t0 off cpus run lim now target
    trace_slice > "$slice"
    say "$SYS: replaying $(wc -l < "$slice") jobs of the trace, $TRACE_SCALE times faster"
    t0=$(ms_now)
    while read -r off cpus run lim; do
        now=$(( $(ms_now) - t0 ))
        target=$(echo "$off * 1000 / 1" | bc)
        if [ "$target" -gt "$now" ]; then sleep "$(echo "($target - $now) / 1000" | bc -l)"; fi
        sbatch -J trace -n "$cpus" -t "$(( lim / 60 )):$(printf %02d $(( lim % 60 )))" \
            -o /dev/null --wrap "sleep $run" > /dev/null
    done < "$slice"
    wait_empty 900
    local times=$SCRATCH/trace-times-$SYS
    : > "$times"
    # One job a line; its fields in any order (NumCPUs comes after
    # EndTime in both systems' output).
    scontrol -o show job | awk '{
        delete f
        for (i = 1; i <= NF; i++) { k = $i; sub(/=.*/, "", k); v = $i; sub(/^[^=]*=/, "", v); f[k] = v }
        if (f["JobName"] == "trace") print f["SubmitTime"], f["StartTime"], f["EndTime"], f["NumCPUs"]
    }' |
    while read -r sub st en cpus; do
        echo "$(date -d "$sub" +%s) $(date -d "$st" +%s) $(date -d "$en" +%s) $cpus" >> "$times"
    done
    local got
    got=$(wc -l < "$times")
    if [ "$got" != "$(wc -l < "$slice")" ]; then
        say "$SYS: $got of $(wc -l < "$slice") trace jobs seen by scontrol"
    fi
    awk -v tau=10 '
        { s[NR] = $1; b[NR] = $2; e[NR] = $3; c[NR] = $4
          if (NR == 1 || $1 < first) first = $1; if ($3 > last) last = $3 }
        END {
            for (i = 1; i <= NR; i++) {
                run = e[i] - b[i]; wait = b[i] - s[i]
                work += run * c[i]; waits += wait
                sd = (wait + run) / (run > tau ? run : tau); bsd += (sd > 1 ? sd : 1)
            }
            printf "%.4f %.2f %.3f\n", work / (64 * (last - first)), waits / NR, bsd / NR
        }' "$times" > "$SCRATCH/trace-quality-$SYS"
    local util wait bsd
    read -r util wait bsd < "$SCRATCH/trace-quality-$SYS"
    say "$SYS: trace utilisation $util, mean wait $wait s, mean bounded slowdown $bsd"
    sample "trace slice: utilisation of 64 CPUs" "$util" fraction higher
    sample "trace slice: mean wait" "$wait" s lower
    sample "trace slice: mean bounded slowdown" "$bsd" ratio lower
}

# The figures one repetition takes on the system in use: the floors, held
# submissions, tiny jobs end to end ($N_TINY of them, fewer on a system
# that runs them slowly: TINY[$SYS]).
one_rep() {
    local t0 t1 clients
    # The floors, once a repetition: measured once, a noisy moment could
    # move every ratio to them.
    # The floor of a one-shot command: a process start and its version.
    t0=$(ms_now)
    for _ in $(seq 1 50); do sbatch --version > /dev/null; done
    t1=$(ms_now)
    sample "sbatch --version (process floor)" "$(echo "($t1 - $t0) / 50" | bc -l)" ms lower
    # The floor with one round trip: a process start and one answer from
    # the controller, which is what a one-shot sbatch cannot go below.
    t0=$(ms_now)
    for _ in $(seq 1 50); do scontrol ping > /dev/null; done
    t1=$(ms_now)
    sample "scontrol ping (process floor and a controller round trip)" "$(echo "($t1 - $t0) / 50" | bc -l)" ms lower
    # What a durable acknowledgement adds to that floor on this disk: one
    # 4 KiB write and its flush (O_DSYNC), on the filesystem the
    # controller keeps its state on. Slurm answers a submission before its
    # state reaches the disk, Corral after; this is the machine's price of
    # the difference, not either system's. Each write alone, a process
    # start apart, into a file already written (as a sequential
    # submitter's are, into Corral's journal): on this VM's disk a flush
    # right after another costs about half of one alone. The median of
    # dd's own times.
    dd if=/dev/zero of=flush.probe bs=4k count=100 status=none
    sync flush.probe
    local flush
    flush=$(for i in $(seq 0 99); do
        dd if=/dev/zero of=flush.probe bs=4k count=1 seek="$i" conv=notrunc oflag=dsync 2>&1 |
            awk '/copied/ {print $(NF-3) * 1000}'
    done | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}')
    rm -f flush.probe
    sample "4 KiB write and flush to disk, one at a time (the price of a durable answer)" "$flush" ms lower
    # The CPU a tiny job cannot go below: its sbatch's process start and the
    # job's shell. The user and system CPU of 300 of each, run by a shell of
    # its own whose waited-for children they are (in clock ticks, which 300
    # runs make a few per cent of the total). With the cores, the report
    # sets the tiny jobs' rates against the rate this CPU alone allows.
    local ticks
    ticks=$(bash -c 'for _ in $(seq 300); do sbatch --version; /bin/sh -c true; done > /dev/null
        awk "{print \$16 + \$17}" /proc/$$/stat')
    sample "CPU of a tiny job's own processes (an sbatch process start and a shell)" \
        "$(echo "$ticks * 1000 / $(getconf CLK_TCK) / 300" | bc -l)" ms lower
    sample "CPU cores of this machine" "$(nproc)" cores higher
    for clients in 1 2 8; do
        t0=$(ms_now)
        submit_n "$N_SUB" "$clients" -H
        t1=$(ms_now)
        sample "sbatch --hold, $clients client(s)" "$(echo "$N_SUB * 1000 / ($t1 - $t0)" | bc -l)" jobs/s higher
        scancel -u root
        wait_empty 120
    done
    # Tiny jobs end to end: first submit to an empty queue.
    local n=${TINY[$SYS]}
    for clients in 1 2; do
        t0=$(ms_now)
        submit_n "$n" "$clients"
        t1=$(ms_now)
        sample "sbatch (jobs that run), $clients client(s)" "$(echo "$n * 1000 / ($t1 - $t0)" | bc -l)" jobs/s higher
        wait_empty 600
        t1=$(ms_now)
        sample "tiny jobs end to end, $clients submitter(s)" "$(echo "$n * 1000 / ($t1 - $t0)" | bc -l)" jobs/s higher
    done
}

# A deep queue next, while the controller holds no finished jobs but the
# sruns' (both keep them a while, and a listing carries them): memory
# idle and with $N_PEND pending, listings of them, and cancelling them
# all.
deep_queue() {
    say "$SYS: a deep queue"
    sample "controller memory, idle" "$(rss_mib "${CTLD[$SYS]}")" MiB lower
    local t0 t1 r
    submit_n "$N_PEND" 8 -H
    say "$SYS: $(squeue -h | wc -l) pending"
    sample "controller memory, $N_PEND pending" "$(rss_mib "${CTLD[$SYS]}")" MiB lower
    for r in $(seq 1 $(( REPS * 3 ))); do
        bash_us t0; squeue > /dev/null; bash_us t1
        sample "squeue, $N_PEND pending" "$(echo "($t1 - $t0) / 1000" | bc -l)" ms lower
        bash_us t0; squeue -h | wc -l > /dev/null; bash_us t1
        sample "squeue -h piped to wc -l, $N_PEND pending" "$(echo "($t1 - $t0) / 1000" | bc -l)" ms lower
        bash_us t0; sinfo > /dev/null; bash_us t1
        sample "sinfo, $N_PEND pending" "$(echo "($t1 - $t0) / 1000" | bc -l)" ms lower
    done
    t0=$(ms_now)
    scancel -u root
    t1=$(ms_now)
    sample "scancel -u of $N_PEND pending" "$(echo "$t1 - $t0" | bc -l)" ms lower
    wait_empty 300
    t1=$(ms_now)
    sample "scancel -u until the queue is empty" "$(echo "$t1 - $t0" | bc -l)" ms lower
}

# srun latency, each run timed, $2 runs of `srun $1` appended to the
# system's file for it. Its input is /dev/null for both systems, as in a
# batch script, so that the figure does not depend on whether this script
# was started from a terminal.
sruns() {
    local lat=$SCRATCH/lat-$SYS-${1// /_} t0 t1
    for _ in $(seq 1 "$2"); do
        bash_us t0
        # shellcheck disable=SC2086
        srun $1 < /dev/null > /dev/null
        bash_us t1
        echo "($t1 - $t0) / 1000" | bc -l >> "$lat"
    done
}

srun_samples() {
    local what lat
    for what in "${SRUN_KINDS[@]}"; do
        lat=$SCRATCH/lat-$SYS-${what// /_}
        sample "srun $what, p50" "$(pct "$lat" 50)" ms lower
        sample "srun $what, p99" "$(pct "$lat" 99)" ms lower
    done
    # What the clusters not in use did meanwhile: their daemons' CPU over
    # all of this system's sruns, in ms a second of them. A latency tail
    # may come from it (Slurm purges finished jobs 300 s after their end).
    sample "CPU of the idle clusters' daemons during the sruns" \
        "$(echo "${IDLE_TICKS[$SYS]:-0} * 1000 / $(getconf CLK_TCK) / (${SRUN_US[$SYS]:-1} / 1000000)" | bc -l)" \
        "ms a second" lower
}

# The user and system CPU (clock ticks) of the daemons of every system but
# the one in use.
idle_ticks() {
    local sys p t=0
    for sys in "${SYSTEMS[@]}"; do
        [ "$sys" = "$SYS" ] && continue
        for p in ${DAEMONS[$sys]}; do
            if [ -r "/proc/$p/stat" ]; then
                t=$(( t + $(awk '{print $14 + $15}' "/proc/$p/stat") ))
            fi
        done
    done
    echo "$t"
}

# ---- Slurm --------------------------------------------------------------

if ! command -v slurmctld > /dev/null || ! command -v munged > /dev/null; then
    say "installing slurm-wlm and munge"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge > /dev/null
fi
command -v bc > /dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q bc > /dev/null

# Each system's environment (a file sourced by use_sys), controller pid,
# tiny jobs and sruns; the systems in the order first measured.
declare -A CTLD TINY SRUNS DAEMONS IDLE_TICKS SRUN_US
SYSTEMS=()
BASE_PATH=$PATH
SRUN_KINDS=("-N1 true" "-N2 --gres=gpu:1 hostname")

# use_sys SYSTEM: its commands on PATH, its configuration in the
# environment, its work directory current.
use_sys() {
    unset SLURM_CONF CORRAL_CONF CORRAL_AGENT_SOCKET
    export PATH=$BASE_PATH
    # shellcheck disable=SC1090
    source "$SCRATCH/env-$1"
    SYS=$1
    cd "$SCRATCH/work-$1"
    # The clusters not in use run at idle priority (SCHED_IDLE, every
    # thread of their daemons): they keep their timers and connections,
    # and take only the CPU the measured one leaves, which preempts them
    # on waking. Both clusters are up at once, and Slurm's controller
    # purges its finished jobs minutes after they end: without this, that
    # work lands in the other system's figures.
    local sys
    for sys in "${SYSTEMS[@]}"; do
        if [ "$sys" = "$1" ]; then policy "$sys" other; else policy "$sys" idle; fi
    done
}

# policy SYSTEM idle|other: the scheduling policy of every thread of the
# system's daemons (threads and processes started later inherit it).
policy() {
    local p
    for p in ${DAEMONS[$1]:-}; do
        chrt --all-tasks "--$2" --pid 0 "$p" > /dev/null 2>&1 || true
    done
}

# start_slurm defaults|htc SYSTEM: a Slurm cluster with those settings,
# measured as SYSTEM.
start_slurm() {
    local S
    S=$SCRATCH/slurm-$1
    mkdir -p "$S"/{munge,state,spool,log,dev} "$SCRATCH/work-$2"
    dd if=/dev/urandom of="$S/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$S/munge/munge.key"
    chmod 755 "$S/munge"
    munged --key-file="$S/munge/munge.key" --socket="$S/munge/sock" \
        --pid-file="$S/munge/pid" --log-file="$S/munge/log" --seed-file="$S/munge/seed"
    PIDS+=("$(pid_from "$S/munge/pid")")
    # A GPU gres needs a device file (without one the node goes INVAL).
    for g in $(seq 0 7); do mknod "$S/dev/gpu$g" c 1 3; done
    PORT=$(( 20000 + RANDOM % 20000 ))
    cat > "$S/gres.conf" <<GRES
NodeName=n[1-4] Name=gpu File=$S/dev/gpu[0-7]
GRES
    {
        cat <<CONF
ClusterName=cmp$1
GresTypes=gpu
SlurmctldHost=localhost
SlurmctldPort=$PORT
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$S/munge/sock
CredType=cred/munge
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool/%n
SlurmctldPidFile=$S/ctld.pid
SlurmdPidFile=$S/slurmd-%n.pid
SlurmctldLogFile=$S/log/ctld.log
SlurmdLogFile=$S/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MaxJobCount=100000
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
SlurmdTimeout=30
CONF
        if [ "$1" = htc ]; then
            # Slurm's high-throughput guide.
            cat <<CONF
SchedulerParameters=defer,batch_sched_delay=20,sched_min_interval=2000000,max_rpc_cnt=150
SlurmctldDebug=error
SlurmdDebug=error
MessageTimeout=30
CONF
        fi
        for i in 1 2 3 4; do
            echo "NodeName=n$i NodeHostname=localhost Port=$(( PORT + i )) CPUs=16 RealMemory=64000 Gres=gpu:8 State=UNKNOWN"
        done
        echo "PartitionName=p Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP"
    } > "$S/slurm.conf"
    echo "export SLURM_CONF=$S/slurm.conf" > "$SCRATCH/env-$2"
    use_sys "$2"
    slurmctld
    PIDS+=("$(pid_from "$S/ctld.pid")")
    for i in 1 2 3 4; do
        slurmd -N "n$i"
        PIDS+=("$(pid_from "$S/slurmd-n$i.pid")")
    done
    deadline=$(( $(date +%s) + 60 ))
    until [ "$(sinfo -h -t idle -o %D 2>/dev/null)" = 4 ]; do
        [ "$(date +%s)" -lt "$deadline" ] || { say "Slurm's nodes did not come up"; exit 1; }
        sleep 0.5
    done
    CTLD[$2]=$(cat "$S/ctld.pid")
    # With slurmctld's own helper (slurmscriptd, its child).
    DAEMONS[$2]="$(cat "$S/munge/pid" "$S/ctld.pid" "$S"/slurmd-n*.pid | tr '\n' ' ') $(pgrep -P "${CTLD[$2]}" | tr '\n' ' ')"
    TINY[$2]=$N_TINY
    SRUNS[$2]=$N_SRUN
    SYSTEMS+=("$2")
}

start_corral() {
    say "building Corral"
    # As the README builds it: the CLI linked statically (ctl/build.sh).
    bash "$ROOT/ctl/build.sh" -q
    local C=$SCRATCH/corral
    mkdir -p "$C" "$SCRATCH/work-corral"
    "$ROOT/target/release/corral" up --nodes 4 --gpus-per-node 8 > "$C/up.log" 2>&1 &
    UP_PID=$!
    PIDS+=("$UP_PID")
    deadline=$(( $(date +%s) + 60 ))
    until grep -q '^export CORRAL_CONF' "$C/up.log" 2>/dev/null; do
        [ "$(date +%s)" -lt "$deadline" ] || { say "corral up did not start"; cat "$C/up.log" >&2; exit 1; }
        sleep 0.2
    done
    grep '^export' "$C/up.log" > "$SCRATCH/env-corral"
    use_sys corral
    CTLD[corral]=$(pgrep -f "corral-ctld --config $(dirname "$CORRAL_CONF")/" | head -1)
    DAEMONS[corral]="$UP_PID ${CTLD[corral]} $(pgrep -f "corral-agent .*--certs $(dirname "$CORRAL_CONF")/certs" | tr '\n' ' ')"
    TINY[corral]=$N_TINY
    SRUNS[corral]=$N_SRUN
    SYSTEMS+=(corral)
}

case $HTC in
    # Corral's half alone (its samples can join a Slurm run's for the
    # report).
    none) ;;
    0) start_slurm defaults slurm ;;
    1) start_slurm htc slurm ;;
    2)
        start_slurm defaults slurm
        start_slurm htc slurm-htc
        ;;
esac
# Under Slurm's HTC settings every srun waits about 12 s for a pass
# (sched_min_interval), so they run a tenth as many sruns, at least 10
# (their p99 is then the slowest of ten), and with both settings a tenth
# of the tiny jobs there (they complete at about 5 a second).
if [ "$HTC" = 1 ]; then
    SRUNS[slurm]=$(( N_SRUN / 10 > 10 ? N_SRUN / 10 : 10 ))
fi
if [ "$HTC" = 2 ]; then
    SRUNS[slurm-htc]=$(( N_SRUN / 10 > 10 ? N_SRUN / 10 : 10 ))
    TINY[slurm-htc]=$(( N_TINY / 10 > 50 ? N_TINY / 10 : 50 ))
fi
start_corral

# ---- The workloads ------------------------------------------------------

# Every cluster is up, and each workload runs on each in turn, so that a
# slow or fast spell of this machine (they last minutes, and can move a
# process start by half) falls on both systems alike. The repetitions
# alternate which system goes first. A cluster not in use is idle.

# in_turn R: the systems in the order of repetition R.
in_turn() {
    if [ $(( $1 % 2 )) = 1 ]; then
        printf '%s\n' "${SYSTEMS[@]}"
    else
        printf '%s\n' "${SYSTEMS[@]}" | tac
    fi
}
# The sruns first, on clusters that have run nothing yet: whatever a
# workload leaves behind runs on meanwhile, and beside the other system's
# sruns it lands in their tail, idle priority or not. Measured: when the
# sruns came last, 34-77 ms a second of Slurm's idle daemons during
# Corral's sruns (Slurm purges each finished job 300 s after its end);
# right after the deep queue, 64 ms a second of Corral's daemons during
# Slurm's sruns and 20 of Slurm's during Corral's.
for r in $(seq 1 "$REPS"); do
    for sys in $(in_turn "$r"); do
        use_sys "$sys"
        n=${SRUNS[$sys]}
        i0=$(idle_ticks)
        bash_us s0
        for what in "${SRUN_KINDS[@]}"; do
            # This repetition's share of the system's sruns.
            sruns "$what" $(( n * r / REPS - n * (r - 1) / REPS ))
        done
        bash_us s1
        i1=$(idle_ticks)
        IDLE_TICKS[$sys]=$(( ${IDLE_TICKS[$sys]:-0} + i1 - i0 ))
        SRUN_US[$sys]=$(( ${SRUN_US[$sys]:-0} + s1 - s0 ))
    done
done
for sys in "${SYSTEMS[@]}"; do
    use_sys "$sys"
    deep_queue
done
for r in $(seq 1 "$REPS"); do
    for sys in $(in_turn "$r"); do
        use_sys "$sys"
        say "$SYS: repetition $r of $REPS"
        one_rep
    done
done
# The trace slices one after the other (each keeps its cluster busy for
# minutes, in real time).
for sys in "${SYSTEMS[@]}"; do
    use_sys "$sys"
    srun_samples
    trace_quality
done
cd "$SCRATCH"

say "stopping the clusters"
if [ -n "${UP_PID:-}" ]; then
    kill -INT "$UP_PID" 2>/dev/null || true
    wait "$UP_PID" 2>/dev/null || true
fi
for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
sleep 2
PIDS=()

# ---- The report ---------------------------------------------------------

(cd "$ROOT" && cargo run --release --locked -q -p benches --bin compare-report -- \
    "$SAMPLES" --json "$OUT/compare.json" --png "$OUT/compare.png") | tee "$OUT/compare.md"
say "table, JSON and chart in $OUT"
