#!/usr/bin/env bash
# The CPU one command costs a running `corral up` cluster, split by who
# spent it: ctld, the agents, the processes the agents started (the jobs)
# and the command itself, with the wall time, averaged over N runs.
#
#   eval "$(corral up ... | grep ^export)"   # the cluster's environment
#   bash benches/cpu.sh N COMMAND [ARGS...]
#
# For example `bash benches/cpu.sh 200 srun -N2 --gres=gpu:1 hostname`.
# The command runs N times in a row, its output to /dev/null and its
# input from /dev/null. The daemons are found from CORRAL_CONF (ctld's
# --config, the agents' certificates beside it); their CPU is read from
# /proc before and after (user and system, in clock ticks), so anything
# else the cluster does meanwhile counts too: run it on a quiet cluster.
set -euo pipefail
if [ $# -lt 2 ] || ! [[ $1 =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
    echo "usage: bash benches/cpu.sh N COMMAND [ARGS...]" >&2
    exit 2
fi
n=$1
shift
conf=${CORRAL_CONF:-}
if [ -z "$conf" ]; then
    echo "cpu.sh: CORRAL_CONF is not set: run it in a corral up cluster's environment" >&2
    exit 2
fi
dir=$(dirname "$conf")
ctld=$(pgrep -f "corral-ctld --config $conf" | head -n1 || true)
agents=$(pgrep -f "corral-agent .*--certs $dir/certs" || true)
if [ -z "$ctld" ] || [ -z "$agents" ]; then
    echo "cpu.sh: no ctld or no agents of the cluster at $dir" >&2
    exit 1
fi
tick=$(getconf CLK_TCK)
# Own (utime + stime) and waited-for children's (cutime + cstime) ticks.
own() { awk '{print $14 + $15}' "/proc/$1/stat"; }
kids() { awk '{print $16 + $17}' "/proc/$1/stat"; }
sum() {
    local total=0 p
    for p in $2; do total=$((total + $($1 "$p"))); done
    echo "$total"
}
c0=$(own "$ctld")
a0=$(sum own "$agents")
j0=$(sum kids "$agents")
t0=$(date +%s%N)
# In a shell of its own, whose waited-for children are the N commands.
self=$(bash -c 'for _ in $(seq "$1"); do "${@:2}" < /dev/null > /dev/null; done
    awk "{print \$16 + \$17}" /proc/$$/stat' cpu "$n" "$@")
t1=$(date +%s%N)
c1=$(own "$ctld")
a1=$(sum own "$agents")
j1=$(sum kids "$agents")
per() { echo "scale=2; $1 * 1000 / $tick / $n" | bc; }
echo "wall $(echo "scale=2; ($t1 - $t0) / 1000000 / $n" | bc) ms" \
    " ctld $(per $((c1 - c0)))" \
    " agents $(per $((a1 - a0)))" \
    " jobs $(per $((j1 - j0)))" \
    " command $(per "$self") ms of CPU each"
