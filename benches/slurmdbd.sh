#!/usr/bin/env bash
# A reference Slurm 22.05 with accounting, to settle what sacct, sacctmgr
# and sshare print (issue 47): munged, a MariaDB of its own, slurmdbd,
# slurmctld and two `slurmd -N nX` (4 CPUs, 8 GB each) on this machine,
# in a scratch directory; the accounts ml and vision with root in both.
#
#   sudo bash benches/slurmdbd.sh [DIR]     # default /tmp/corral-slurmdbd
#   export SLURM_CONF=DIR/slurm.conf; sacct ...; sacctmgr show assoc
#   bash benches/slurmdbd.sh --stop [DIR]
#
# Installs slurm-wlm, slurmdbd, munge and mariadb-server with apt when
# missing (policy-rc.d keeps the system's own daemons from starting).
# munged uses the default socket (/run/munge/munge.socket.2): sacctmgr
# does not honour slurm.conf's AuthInfo for slurmdbd.
set -euo pipefail
if [ "${1:-}" = --stop ]; then
    S=${2:-/tmp/corral-slurmdbd}
    for p in "$S"/slurmd-n*.pid "$S/ctld.pid" "$S/dbd.pid" "$S/run/my.pid" "$S/munge/pid"; do
        [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true
    done
    exit 0
fi
S=${1:-/tmp/corral-slurmdbd}
[ "$(id -u)" = 0 ] || { echo "slurmdbd.sh: run as root" >&2; exit 1; }
if ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; then
    made=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && made=1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm slurmdbd munge mariadb-server >/dev/null
    [ $made = 1 ] && rm -f /usr/sbin/policy-rc.d
fi
rm -rf "$S"; mkdir -p "$S"/{munge,state,spool,log,db,run} /run/munge
dd if=/dev/urandom of="$S/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$S/munge/munge.key"; chmod 755 "$S/munge"
munged --key-file="$S/munge/munge.key" --socket=/run/munge/munge.socket.2 \
    --pid-file="$S/munge/pid" --log-file="$S/munge/log" --seed-file="$S/munge/seed"
mariadb-install-db --user=root --datadir="$S/db" --auth-root-authentication-method=normal >/dev/null 2>&1
mariadbd --user=root --datadir="$S/db" --socket="$S/run/my.sock" --bind-address=127.0.0.1 \
    --port=33306 --pid-file="$S/run/my.pid" >"$S/log/my.log" 2>&1 &
for _ in $(seq 100); do [ -S "$S/run/my.sock" ] && break; sleep 0.2; done
mariadb -S "$S/run/my.sock" -e "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'pw'; GRANT ALL ON *.* TO 'slurm'@'127.0.0.1';"
cat >"$S/slurmdbd.conf" <<C
AuthType=auth/munge
DbdHost=localhost
DbdPort=36819
SlurmUser=root
LogFile=$S/log/dbd.log
PidFile=$S/dbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=33306
StorageUser=slurm
StoragePass=pw
StorageLoc=slurm_acct
C
chmod 600 "$S/slurmdbd.conf"
cat >"$S/slurm.conf" <<C
ClusterName=ref
SlurmctldHost=localhost
SlurmctldPort=36817
SlurmUser=root
AuthType=auth/munge
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
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=36819
SlurmdParameters=config_overrides
KillWait=5
MinJobAge=300
NodeName=n1 NodeHostname=localhost Port=36821 CPUs=4 RealMemory=8000 State=UNKNOWN
NodeName=n2 NodeHostname=localhost Port=36822 CPUs=4 RealMemory=8000 State=UNKNOWN
PartitionName=p Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
C
export SLURM_CONF=$S/slurm.conf
slurmdbd
for _ in $(seq 50); do sacctmgr -n show cluster >/dev/null 2>&1 && break; sleep 0.2; done
sacctmgr -i add cluster ref >/dev/null
sacctmgr -i add account ml Description="machine learning" Organization=lab >/dev/null
sacctmgr -i add account vision >/dev/null
sacctmgr -i add user root account=ml >/dev/null
sacctmgr -i add user root account=vision >/dev/null
slurmctld
slurmd -N n1
slurmd -N n2
for _ in $(seq 120); do [ "$(sinfo -h -t idle -o %D 2>/dev/null)" = 2 ] && break; sleep 0.5; done
sinfo
echo "export SLURM_CONF=$S/slurm.conf"
