#!/usr/bin/env bash
# A real Slurm cluster on one machine, for trying and testing slurm/train.sbatch (see README,
# "On a cluster"). Its nodes are the test hosts of scripts/testhosts.sh: one slurmd per host
# namespace, so a 2-node allocation really spans two hosts.
#
#   scripts/slurmcluster.sh up [N]    install Slurm and munge if missing (apt-get), bring up N test
#                                     hosts (default 2) and start munged, slurmctld and their slurmds
#   scripts/slurmcluster.sh down      stop every daemon and job it started, remove the hosts and its files
#   scripts/slurmcluster.sh status    the daemons and the nodes as Slurm sees them
#
# Then point Slurm's commands at the cluster and submit from this machine:
#   export SLURM_CONF=$(scripts/slurmcluster.sh conf)
#   sbatch -N 2 --ntasks-per-node 2 slurm/train.sbatch --dataset synthetic --max-steps 40
#
# Everything lives in one folder (SLURMCLUSTER_DIR): slurm.conf, a munge key and socket of its own,
# and per-node spool, pid and log files; nothing under /etc/slurm or /etc/munge is used. Processes
# are tracked by process tree (proctrack/linuxproc): no cgroup is created. slurmctld runs on this machine and
# is reached from the hosts at the bridge address SUBNET.1.
# Settings (environment): TESTHOSTS_PREFIX (slm), TESTHOSTS_SUBNET (10.82.0), SLURMCLUSTER_CPUS
# (CPUs, i.e. task slots, per node: 2), SLURMCLUSTER_PORT (slurmctld's port: 16817),
# SLURMCLUSTER_DIR (/tmp/slurmcluster-PREFIX).
set -Eeuo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
export TESTHOSTS_PREFIX=${TESTHOSTS_PREFIX:-slm}
export TESTHOSTS_SUBNET=${TESTHOSTS_SUBNET:-10.82.0}
PREFIX=$TESTHOSTS_PREFIX
SUBNET=$TESTHOSTS_SUBNET
CPUS=${SLURMCLUSTER_CPUS:-2}
PORT=${SLURMCLUSTER_PORT:-16817}
STATE=${SLURMCLUSTER_DIR:-/tmp/slurmcluster-$PREFIX}
export TESTHOSTS_HOSTFILE=${TESTHOSTS_HOSTFILE:-$STATE/hostfile}
export TESTHOSTS_SLOTS=$CPUS
CONF=$STATE/slurm.conf
export SLURM_CONF=$CONF

say() { echo "slurmcluster: $*"; }
die() { echo "slurmcluster: $*" >&2; exit 1; }

usage() {
    sed -n '6,12p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

require_root() {
    [ "$(id -u)" -eq 0 ] || die "needs root: it creates network namespaces and runs Slurm's daemons as root. Run it as root (e.g. sudo $0 ${*:-up 2})."
    command -v ip >/dev/null || die "needs the ip command, which is missing. Install iproute2 (apt-get install iproute2) and run it again."
}

install_slurm() {
    local tool missing=
    for tool in munged slurmctld slurmd sbatch srun scancel sinfo unshare; do
        command -v "$tool" >/dev/null || missing+=" $tool"
    done
    [ -z "$missing" ] && return
    command -v apt-get >/dev/null || die "Slurm or munge is missing ($missing) and apt-get is not here to install them. Install Slurm (slurmctld, slurmd, the client commands) and munge, then run it again."
    say "installing slurm-wlm and munge (missing:$missing)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge util-linux >/dev/null
}

nodes() { seq 1 "$(cat "$STATE/nodes.count" 2>/dev/null || echo 0)"; }

write_conf() {
    local n=$1 i
    {
        echo "# Written by scripts/slurmcluster.sh: a cluster of $n test host(s); removed by its 'down'."
        echo "ClusterName=mpitrain"
        echo "MailProg=/bin/true"
        echo "SlurmctldHost=controller($SUBNET.1)"
        echo "SlurmctldPort=$PORT"
        echo "SlurmdPort=6818"
        echo "AuthType=auth/munge"
        echo "CredType=cred/munge"
        echo "AuthInfo=socket=$STATE/munge/munge.socket"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "StateSaveLocation=$STATE/controller"
        echo "SlurmctldPidFile=$STATE/controller/slurmctld.pid"
        echo "SlurmctldLogFile=$STATE/controller/slurmctld.log"
        echo "SlurmdSpoolDir=$STATE/nodes/%n/spool"
        echo "SlurmdPidFile=$STATE/nodes/%n/slurmd.pid"
        echo "SlurmdLogFile=$STATE/nodes/%n/slurmd.log"
        echo "SlurmdParameters=config_overrides"   # trust CPUs= below, not the shared machine's core count
        echo "ProctrackType=proctrack/linuxproc"    # process trees; no cgroups needed
        echo "TaskPlugin=task/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "SchedulerType=sched/backfill"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_CPU"
        echo "MpiDefault=none"
        echo "ReturnToService=2"
        echo "KillWait=10"        # seconds from scancel's SIGTERM to SIGKILL
        echo "InactiveLimit=0"
        echo "MinJobAge=300"
        echo "SlurmctldTimeout=30"
        echo "SlurmdTimeout=60"
        for i in $(seq 1 "$n"); do
            echo "NodeName=$PREFIX$i NodeAddr=$SUBNET.$((i + 1)) NodeHostname=$PREFIX$i CPUs=$CPUS State=UNKNOWN"
        done
        echo "PartitionName=hosts Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
    } > "$CONF"
    # slurmd loads a cgroup plugin even when nothing uses it; v1 loads without a cgroup2 mount
    printf 'CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n' > "$STATE/cgroup.conf"
}

start_munge() {
    mkdir -p "$STATE/munge"
    chmod 700 "$STATE/munge"
    [ -s "$STATE/munge/munge.key" ] || { dd if=/dev/urandom bs=1024 count=1 status=none > "$STATE/munge/munge.key"; chmod 400 "$STATE/munge/munge.key"; }
    munged --force --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/munge.socket" \
        --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/munge/munged.log" --seed-file="$STATE/munge/munged.seed"
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_node() {
    local i=$1 ns=$PREFIX$1
    mkdir -p "$STATE/nodes/$ns/spool"
    alive "$STATE/nodes/$ns/slurmd.pid" && return
    # the node's own host name, as a machine of its own would have (slurmd and the tasks see it)
    ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec slurmd -f "$1" -N "$0"' "$ns" "$CONF"
}

wait_for_nodes() {
    local n=$1 deadline=$((SECONDS + 60)) idle
    while :; do
        idle=$(sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$' || true)
        [ "$idle" -ge "$n" ] && return
        [ $SECONDS -lt $deadline ] || die "the nodes did not become idle within 60 s: $(sinfo -N 2>&1 | tr '\n' ';'). Logs: $STATE/nodes/*/slurmd.log, $STATE/controller/slurmctld.log"
        sleep 1
    done
}

up() {
    local n=${1:-2} i
    [[ $n =~ ^[1-9][0-9]*$ ]] && [ "$n" -le 64 ] || die "up needs the number of nodes, 1 to 64 (got '$n'), e.g. $0 up 2."
    install_slurm
    [ -n "${SLURMCLUSTER_KEEP:-}" ] || trap 'echo "slurmcluster: setting up failed (see above); removing what was created." >&2; down' ERR
    mkdir -p "$STATE/controller"
    echo "$n" > "$STATE/nodes.count"
    "$REPO/scripts/testhosts.sh" up "$n" >/dev/null
    write_conf "$n"
    alive "$STATE/munge/munged.pid" || start_munge
    # slurmctld checks that it runs on SlurmctldHost: give it that host name, not this machine's
    alive "$STATE/controller/slurmctld.pid" || unshare --uts sh -c 'hostname controller && exec slurmctld -f "$0"' "$CONF"
    for i in $(seq 1 "$n"); do start_node "$i"; done
    wait_for_nodes "$n"
    trap - ERR
    say "$n node(s) up (${PREFIX}1..$PREFIX$n on $SUBNET.0/24, $CPUS CPUs each); slurmctld at $SUBNET.1:$PORT."
    say "use it with: export SLURM_CONF=$CONF"
}

stop_pid_file() {  # TERM, then KILL after 10 s, the daemon whose pid the file holds
    local file=$1 pid waited=0
    [ -s "$file" ] || return 0
    pid=$(cat "$file")
    kill -0 "$pid" 2>/dev/null || return 0
    kill "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null && [ $waited -lt 100 ]; do sleep 0.1; waited=$((waited + 1)); done
    kill -9 "$pid" 2>/dev/null || true
}

stop_namespace_processes() {  # everything still running in a test host: slurmd, slurmstepd, job tasks
    local ns=$1 pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] || return 0
    kill $pids 2>/dev/null || true
    sleep 1
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
}

down() {
    local ns
    if [ -s "$CONF" ] && alive "$STATE/controller/slurmctld.pid"; then
        scancel --quiet --user=root 2>/dev/null || true  # every job of this cluster (it has no other)
    fi
    for ns in $(ip netns list 2>/dev/null | cut -d' ' -f1 | grep -E "^${PREFIX}[0-9]+\$" || true); do
        stop_pid_file "$STATE/nodes/$ns/slurmd.pid"
        stop_namespace_processes "$ns"
    done
    stop_pid_file "$STATE/controller/slurmctld.pid"
    stop_pid_file "$STATE/munge/munged.pid"
    "$REPO/scripts/testhosts.sh" down >/dev/null || true
    rm -rf "$STATE"
}

status() {
    local ns
    [ -s "$CONF" ] || { say "no cluster (expected its files in $STATE)"; return; }
    alive "$STATE/munge/munged.pid" && say "munged $(cat "$STATE/munge/munged.pid")" || say "munged not running"
    alive "$STATE/controller/slurmctld.pid" && say "slurmctld $(cat "$STATE/controller/slurmctld.pid") at $SUBNET.1:$PORT" || say "slurmctld not running"
    for ns in $(nodes | sed "s/^/$PREFIX/"); do
        alive "$STATE/nodes/$ns/slurmd.pid" && say "slurmd $(cat "$STATE/nodes/$ns/slurmd.pid") on $ns" || say "slurmd on $ns not running"
    done
    sinfo -N 2>/dev/null || true
}

[ $# -ge 1 ] || usage
case $1 in
    up) [ $# -le 2 ] || usage; require_root up; up "${2:-2}" ;;
    down) require_root down; down; say "removed" ;;
    status) status ;;
    conf) echo "$CONF" ;;
    *) usage ;;
esac
