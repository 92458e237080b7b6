#!/usr/bin/env bash
# Test hosts on one machine: N network namespaces, each with its own address on a private
# bridge, so that mpirun runs a real multi-host job here (see README, "Test hosts").
#
#   scripts/testhosts.sh up N        create hosts 1..N (again: the same N hosts, nothing twice)
#                                    and write the hostfile
#   scripts/testhosts.sh down        remove them all, with their hostfile
#   scripts/testhosts.sh shape RATE [I..]  limit every host's link (or hosts I..: 3 is ${PREFIX}3) to RATE
#                                    each way (tc tbf: 1gbit, 100mbit); a straggler: shape 1gbit, then shape 100mbit 3
#   scripts/testhosts.sh unshape     remove the limits
#   scripts/testhosts.sh status      list the hosts, their addresses and limits
#
# Host i is namespace ${PREFIX}i with address ${SUBNET}.(i+1)/24 on its eth0, a veth whose
# other end joins the bridge ${PREFIX}br; the bridge has ${SUBNET}.1, the address the hosts
# reach mpirun's side at. Inside each namespace the hosts resolve by name (/etc/netns/*/hosts)
# and no name server is configured (lookups of unknown names fail at once).
# Settings (environment): TESTHOSTS_PREFIX (testhost), TESTHOSTS_SUBNET (10.77.0),
# TESTHOSTS_SLOTS (2 ranks per host), TESTHOSTS_HOSTFILE (hostfile.testhosts in the repository).
set -Eeuo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${TESTHOSTS_PREFIX:-testhost}
SUBNET=${TESTHOSTS_SUBNET:-10.77.0}
SLOTS=${TESTHOSTS_SLOTS:-2}
HOSTFILE=${TESTHOSTS_HOSTFILE:-$REPO/hostfile.testhosts}
BRIDGE=${PREFIX}br

say() { echo "testhosts: $*"; }
die() { echo "testhosts: $*" >&2; exit 1; }

usage() {
    sed -n '5,11p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# host i is ${PREFIX}i: a prefix that ends in a digit would take another prefix's hosts (pfx1 + 1 is pfx + 11) for its
# own; interface names (${PREFIX}250v) take at most 15 characters
[[ $PREFIX =~ ^[a-z]([a-z0-9]{0,8}[a-z])?$ ]] || die "TESTHOSTS_PREFIX '$PREFIX' must be 1 to 10 lower-case letters and digits that begin and end with a letter (host i is ${PREFIX}i)."
[[ $SLOTS =~ ^[0-9]+$ && $SLOTS -ge 1 ]] || die "TESTHOSTS_SLOTS '$SLOTS' must be a whole number of ranks per host, 1 or more."

require_tools() {
    [ "$(id -u)" -eq 0 ] || die "needs root: it creates network namespaces, virtual links and traffic limits. Run it as root (e.g. sudo $0 ${*:-up 2})."
    command -v ip >/dev/null || die "needs the ip command, which is missing. Install iproute2 (apt-get install iproute2) and run it again."
}

namespaces() { ip netns list 2>/dev/null | cut -d' ' -f1 | grep -E "^${PREFIX}[0-9]+\$" | sort -V || true; }
veth_of() { echo "${PREFIX}${1#"$PREFIX"}v"; }  # root-side end of host i's link: ${PREFIX}iv

remove_host() {
    local ns=$1
    ip link del "$(veth_of "$ns")" 2>/dev/null || true  # takes the peer inside the namespace with it
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
}

down() {
    local ns
    for ns in $(namespaces); do remove_host "$ns"; done
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -f "$HOSTFILE"
}

add_host() {
    local i=$1 ns=$PREFIX$1 veth
    veth=$(veth_of "$ns")
    [ -e "/run/netns/$ns" ] || ip netns add "$ns"
    if ! ip link show "$veth" >/dev/null 2>&1; then
        ip link add "$veth" type veth peer name eth0 netns "$ns"
    fi
    ip link set "$veth" master "$BRIDGE" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr replace "$SUBNET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route replace default via "$SUBNET.1"
}

up() {
    local n=$1 i ns hosts
    [[ $n =~ ^[1-9][0-9]*$ ]] && [ "$n" -le 250 ] || die "up needs the number of hosts, 1 to 250 (got '$n'), e.g. $0 up 2."
    [ "${#PREFIX}" -le 10 ] || die "TESTHOSTS_PREFIX '$PREFIX' is too long: interface names allow 15 characters; use at most 10."
    trap 'echo "testhosts: setting up failed (see above); removing what was created." >&2; down' ERR
    for ns in $(namespaces); do  # hosts beyond N from an earlier, larger set
        [ "${ns#"$PREFIX"}" -le "$n" ] || remove_host "$ns"
    done
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
    ip addr replace "$SUBNET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    hosts="127.0.0.1 localhost"$'\n'
    for i in $(seq 1 "$n"); do
        add_host "$i"
        hosts+="$SUBNET.$((i + 1)) $PREFIX$i"$'\n'"::ffff:$SUBNET.$((i + 1)) $PREFIX$i"$'\n'  # also as seen by dual-stack sockets
    done
    for i in $(seq 1 "$n"); do
        mkdir -p "/etc/netns/$PREFIX$i"
        printf '%s' "$hosts" > "/etc/netns/$PREFIX$i/hosts"
        # No name server on this network: refused at once, where an unreachable one stalls every lookup.
        echo "nameserver 127.0.0.1" > "/etc/netns/$PREFIX$i/resolv.conf"
    done
    {
        echo "# Test hosts of scripts/testhosts.sh (network namespaces); launch with"
        echo "# PRTE_MCA_plm_ssh_agent=$REPO/scripts/netns-agent (see README)."
        for i in $(seq 1 "$n"); do echo "$SUBNET.$((i + 1)) slots=$SLOTS"; done
    } > "$HOSTFILE"
    trap - ERR
    say "$n host(s) up on $SUBNET.0/24 (mpirun's side: $BRIDGE, $SUBNET.1); hostfile: $HOSTFILE"
}

rate_bytes() {  # tc rate (e.g. 1gbit, 100mbit, 500kbit) -> bytes per second
    local rate=${1,,} number unit
    [[ $rate =~ ^([0-9]+)(kbit|mbit|gbit|bit)?$ ]] || die "rate '$1' is not understood; give bits per second like 1gbit, 100mbit or 500kbit."
    number=${BASH_REMATCH[1]}
    unit=${BASH_REMATCH[2]:-bit}
    [ ${#number} -le 12 ] || die "rate '$1' is above 100gbit, more than tc shapes on these links."
    case $unit in kbit) number=$((number * 1000)) ;; mbit) number=$((number * 1000000)) ;; gbit) number=$((number * 1000000000)) ;; esac
    [ "$number" -gt 0 ] || die "rate '$1' must be positive."
    [ "$number" -le 100000000000 ] || die "rate '$1' is above 100gbit, more than tc shapes on these links."
    echo $((number / 8))
}

shape() {
    local rate=$1 bytes burst ns i chosen=()
    shift
    command -v tc >/dev/null || die "needs the tc command, which is missing. Install iproute2 (apt-get install iproute2)."
    bytes=$(rate_bytes "$rate")
    burst=$((bytes / 100))  # 10 ms worth; never below one 64 KiB segment, which tbf would otherwise drop
    [ "$burst" -ge 131072 ] || burst=131072
    [ -n "$(namespaces)" ] || die "no test hosts to shape; run $0 up N first."
    for i in "$@"; do
        [ -e "/run/netns/$PREFIX$i" ] || die "there is no test host $PREFIX$i to shape (hosts: $(namespaces | tr '\n' ' ')); give host numbers, e.g. $0 shape $rate 2."
        chosen+=("$PREFIX$i")
    done
    [ ${#chosen[@]} -gt 0 ] || mapfile -t chosen < <(namespaces)
    for ns in "${chosen[@]}"; do  # both ends: into the host (root side) and out of it (its eth0)
        tc qdisc replace dev "$(veth_of "$ns")" root tbf rate "$rate" burst "$burst" latency 50ms
        ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms
    done
    if [ $# -gt 0 ]; then say "link of ${chosen[*]} limited to $rate each way"; else say "every host's link limited to $rate each way"; fi
}

unshape() {
    local ns
    for ns in $(namespaces); do
        tc qdisc del dev "$(veth_of "$ns")" root 2>/dev/null || true
        ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
    done
    say "limits removed"
}

status() {
    local ns
    [ -n "$(namespaces)" ] || { say "no test hosts (prefix $PREFIX)"; return; }
    for ns in $(namespaces); do
        echo "$ns $(ip -n "$ns" -4 -o addr show dev eth0 | awk '{print $4}') $(ip netns exec "$ns" tc qdisc show dev eth0 | head -1)"
    done
}

[ $# -ge 1 ] || usage
require_tools "$@"
case $1 in
    up) [ $# -eq 2 ] || usage; up "$2" ;;
    down) down; say "removed" ;;
    shape) [ $# -ge 2 ] || usage; shift; shape "$@" ;;
    unshape) unshape ;;
    status) status ;;
    *) echo "testhosts: unknown command '$1'; the commands are:" >&2; usage ;;
esac
