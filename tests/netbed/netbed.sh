#!/usr/bin/env bash
# netbed: a test bed of "hosts" on one Linux machine, made of network
# namespaces joined by a bridge. Needs root, iproute2 (ip, tc) and a kernel
# with veth, bridge and the tbf qdisc. netem is not used.
#
# Layout for PREFIX and N hosts:
#
#   namespace PREFIX-sw   the switch: bridge br0 (up), ports p0 .. p<N-1>
#   namespace PREFIX-hI   host I: lo up, eth0 = 10.SUBNET.0.<I+1>/24,
#                         the other end of p<I>
#
# Each veth pair is created inside the switch namespace with its peer put
# straight into the host namespace (`ip -n SW link add pI type veth peer
# name eth0 netns HOST`), so no interface ever appears in the root
# namespace, and nothing of the root namespace (interfaces, routes,
# sysctls) is touched. Interface names are fixed and short (br0, pI, eth0).
#
# Use it sourced:
#     source tests/netbed/netbed.sh
#     netbed_up lsnb 3; netbed_exec lsnb 1 ping -c1 "$(netbed_addr lsnb 0)"
#     netbed_down lsnb
# or as a command:  bash tests/netbed/netbed.sh up lsnb 3
#                   bash tests/netbed/netbed.sh exec lsnb 0 ip addr
#
# Functions (each returns non-zero and prints to stderr on error):
#   netbed_leftovers PREFIX   lists namespaces named PREFIX* and root veths
#                             named PREFIX* or whose peer is in such a
#                             namespace; returns 1 if there is any.
#                             PREFIX may hold glob characters.
#   netbed_up PREFIX N [SUBNET]  builds the bed (SUBNET default 77); refuses
#                             if PREFIX-sw or PREFIX-h* exists; removes what
#                             it made if a step fails.
#   netbed_down PREFIX        SIGKILLs every process in the bed's
#                             namespaces, waits for them, deletes the
#                             namespaces. Idempotent.
#   netbed_addr PREFIX I      prints host I's IPv4 address (read from eth0).
#   netbed_ns PREFIX I        prints host I's namespace name.
#   netbed_hosts PREFIX       prints the number of hosts.
#   netbed_exec PREFIX I CMD...  runs CMD in host I's namespace with `ip
#                             netns exec`, which execs CMD in place, so CMD's
#                             pid is the pid of the `ip` process. Run in a
#                             subshell (`netbed_exec ... &`) it replaces that
#                             subshell too, so `$!` is CMD's pid and
#                             `kill -9 $!` kills CMD itself. In the calling
#                             shell itself it runs CMD as a child.
#   netbed_cut PREFIX I       pulls host I's cable at the switch: port pI
#                             down. The host's eth0 stays administratively
#                             UP but, being a veth whose peer is down, it
#                             loses carrier: flags <NO-CARRIER,...,UP>,
#                             carrier 0, operstate "down" (what a host sees
#                             when its cable is pulled). Its address and
#                             routes stay; packets sent meanwhile are dropped.
#   netbed_heal PREFIX I      plugs the cable back (pI up); waits for carrier.
#   netbed_cap PREFIX I RATE  caps host I's link to RATE (tc syntax: 200mbit,
#                             1gbit, 500kbit, 10mbps) both ways: a tbf qdisc
#                             on the host's eth0 (upload) and on pI (download).
#   netbed_uncap PREFIX I     removes both qdiscs.
#   netbed_cap_all PREFIX RATE  netbed_cap on every host.
#
# tbf parameters (netbed_cap): burst = max(128 KiB, RATE x 2 ms), latency
# 10 ms (queue limit = RATE x 10 ms + burst).
#  - veth passes GSO packets of up to 64 KiB; tbf splits (or drops) a packet
#    larger than its bucket, so the bucket must hold at least two of them,
#    hence the 128 KiB floor. RATE x 2 ms lets the bucket cover a scheduling
#    hiccup of the sender without the link going idle (at 1gbit: 250 KB).
#  - 10 ms of queue is far more than the bandwidth-delay product of a link
#    whose RTT is tens of microseconds, so a single TCP stream keeps the
#    bucket busy, while queueing delay (which heartbeats and barriers also
#    suffer) stays bounded at 10 ms.
#  Measured (tests/netbed/tcprate.py, one TCP stream, 2-core VM): 952 and
#  953 Mbit/s of payload through 1gbit, 190.8 and 191.1 through 200mbit,
#  i.e. 0.95 of RATE; tbf counts whole frames, and 1448 payload bytes per
#  1514-byte frame is 0.956, so the wire is ~99.5% busy.

NETBED_DEFAULT_SUBNET=${NETBED_DEFAULT_SUBNET:-77}

_netbed_err() { echo "netbed: $*" >&2; }

_netbed_check_prefix() {
  if [[ ! $1 =~ ^[A-Za-z0-9][A-Za-z0-9_.]*$ ]]; then
    _netbed_err "bad prefix '$1' (letters, digits, _ and . only)"
    return 1
  fi
}

_netbed_check_index() {
  if [[ ! $1 =~ ^[0-9]+$ ]]; then
    _netbed_err "bad host index '$1'"
    return 1
  fi
}

# Names of all namespaces, one a line (without the "(id: N)" suffix).
_netbed_all_ns() { ip netns list 2>/dev/null | awk '{print $1}'; }

_netbed_ns_exists() { [[ -e /run/netns/$1 ]] || _netbed_all_ns | grep -qxF -- "$1"; }

# The namespaces of bed PREFIX: the switch and hosts, as they exist.
_netbed_bed_ns() {
  local p=$1 ns
  while read -r ns; do
    [[ -n $ns ]] || continue
    if [[ $ns == "$p-sw" || $ns =~ ^"$p"-h[0-9]+$ ]]; then echo "$ns"; fi
  done < <(_netbed_all_ns)
}

netbed_ns() {
  _netbed_check_prefix "$1" && _netbed_check_index "$2" || return 2
  echo "$1-h$2"
}

netbed_hosts() {
  _netbed_check_prefix "$1" || return 2
  local n=0
  while _netbed_ns_exists "$1-h$n"; do n=$((n + 1)); done
  echo "$n"
}

netbed_leftovers() {
  local glob=${1:?usage: netbed_leftovers PREFIX}
  local found=0 ns name peer line
  while read -r ns; do
    [[ -n $ns ]] || continue
    # shellcheck disable=SC2053  # $glob is a pattern on purpose
    if [[ $ns == $glob* ]]; then echo "netns $ns"; found=1; fi
  done < <(_netbed_all_ns)
  # veths of the root namespace: "N: name@peer: ... link-netns NS ..."
  while read -r line; do
    name=${line#*: }; name=${name%%:*}; name=${name%%@*}
    peer=""
    if [[ $line =~ link-netns\ ([^ ]+) ]]; then peer=${BASH_REMATCH[1]}; fi
    # shellcheck disable=SC2053
    if [[ $name == $glob* || ( -n $peer && $peer == $glob* ) ]]; then
      echo "veth $name${peer:+ (peer in netns $peer)}"
      found=1
    fi
  done < <(ip -o link show type veth 2>/dev/null)
  return $((found))
}

netbed_up() {
  local p=$1 n=$2 subnet=${3:-$NETBED_DEFAULT_SUBNET}
  if [[ $# -lt 2 ]]; then _netbed_err "usage: netbed_up PREFIX N [SUBNET]"; return 2; fi
  _netbed_check_prefix "$p" || return 2
  if [[ ! $n =~ ^[0-9]+$ ]] || ((n < 1 || n > 250)); then
    _netbed_err "N must be 1..250, not '$n'"; return 2
  fi
  if [[ ! $subnet =~ ^[0-9]+$ ]] || ((subnet > 255)); then
    _netbed_err "SUBNET must be 0..255, not '$subnet'"; return 2
  fi
  local existing
  existing=$(_netbed_bed_ns "$p")
  if [[ -n $existing ]]; then
    _netbed_err "bed '$p' exists already (netbed_down $p first):" "${existing//$'\n'/ }"
    return 1
  fi
  if ! _netbed_build "$p" "$n" "$subnet"; then
    _netbed_err "netbed_up $p failed; removing what was made"
    netbed_down "$p" >/dev/null
    return 1
  fi
}

_netbed_build() {
  local p=$1 n=$2 subnet=$3 sw="$1-sw" i h
  ip netns add "$sw" || return 1
  ip -n "$sw" link set lo up || return 1
  ip -n "$sw" link add br0 type bridge forward_delay 0 stp_state 0 || return 1
  ip -n "$sw" link set br0 up || return 1
  for ((i = 0; i < n; i++)); do
    h="$p-h$i"
    ip netns add "$h" || return 1
    ip -n "$h" link set lo up || return 1
    ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$h" || return 1
    ip -n "$sw" link set "p$i" master br0 || return 1
    ip -n "$sw" link set "p$i" up || return 1
    ip -n "$h" addr add "10.$subnet.0.$((i + 1))/24" dev eth0 || return 1
    ip -n "$h" link set eth0 up || return 1
  done
  # Wait for carrier on every host (veth: immediate, but be sure).
  for ((i = 0; i < n; i++)); do
    _netbed_wait_carrier "$p-h$i" 1 || return 1
  done
}

# _netbed_wait_carrier NS WANT(0|1): waits up to 5 s for eth0's carrier.
_netbed_wait_carrier() {
  local ns=$1 want=$2 t c
  for ((t = 0; t < 100; t++)); do
    c=0
    [[ $(ip -n "$ns" -o link show dev eth0 2>/dev/null) == *LOWER_UP* ]] && c=1
    [[ $c == "$want" ]] && return 0
    sleep 0.05
  done
  _netbed_err "$ns: eth0 carrier did not become $want"
  return 1
}

netbed_down() {
  local p=${1:?usage: netbed_down PREFIX}
  _netbed_check_prefix "$p" || return 2
  local nss ns pid t left rc=0
  nss=$(_netbed_bed_ns "$p")
  # Kill first, everything, then wait: a process may sit in several.
  for ns in $nss; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      kill -9 "$pid" 2>/dev/null
    done
  done
  for ns in $nss; do
    for ((t = 0; t < 200; t++)); do
      left=$(ip netns pids "$ns" 2>/dev/null)
      [[ -z $left ]] && break
      # Processes that arrived after the first round (forks) go too.
      for pid in $left; do kill -9 "$pid" 2>/dev/null; done
      sleep 0.05
    done
    if [[ -n $left ]]; then
      _netbed_err "$ns: processes still there after 10 s:" "${left//$'\n'/ }"
      rc=1
    fi
  done
  for ns in $nss; do
    ip netns del "$ns" 2>/dev/null || { _netbed_ns_exists "$ns" && { _netbed_err "cannot delete netns $ns"; rc=1; }; }
  done
  return $rc
}

netbed_addr() {
  _netbed_check_prefix "$1" && _netbed_check_index "$2" || return 2
  local a
  a=$(ip -n "$1-h$2" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}' | head -1)
  if [[ -z $a ]]; then _netbed_err "no host $2 in bed $1"; return 1; fi
  echo "${a%/*}"
}

netbed_exec() {
  if [[ $# -lt 3 ]]; then _netbed_err "usage: netbed_exec PREFIX I CMD..."; return 2; fi
  _netbed_check_prefix "$1" && _netbed_check_index "$2" || return 2
  local ns="$1-h$2"
  shift 2
  if ! _netbed_ns_exists "$ns"; then _netbed_err "no netns $ns"; return 1; fi
  if [[ $BASHPID != "$$" ]]; then
    # A subshell (background job, pipeline, $(...)): replace it, so that
    # its pid ($!) is the command's pid.
    exec ip netns exec "$ns" "$@"
  fi
  ip netns exec "$ns" "$@"
}

netbed_cut() {
  _netbed_check_prefix "$1" && _netbed_check_index "$2" || return 2
  ip -n "$1-sw" link set "p$2" down || return 1
  _netbed_wait_carrier "$1-h$2" 0
}

netbed_heal() {
  _netbed_check_prefix "$1" && _netbed_check_index "$2" || return 2
  ip -n "$1-sw" link set "p$2" up || return 1
  _netbed_wait_carrier "$1-h$2" 1
}

# _netbed_rate_bits RATE: tc rate to bits per second (integer).
_netbed_rate_bits() {
  local r=${1,,} num unit mult
  if [[ ! $r =~ ^([0-9]+)(\.[0-9]+)?([a-z]*)$ ]]; then return 1; fi
  num=${BASH_REMATCH[1]}${BASH_REMATCH[2]}
  unit=${BASH_REMATCH[3]}
  case $unit in
    "" | bit) mult=1 ;;
    kbit) mult=1000 ;;       mbit) mult=1000000 ;;
    gbit) mult=1000000000 ;; tbit) mult=1000000000000 ;;
    kibit) mult=1024 ;;      mibit) mult=1048576 ;;
    gibit) mult=1073741824 ;;
    bps) mult=8 ;;           kbps) mult=8000 ;;
    mbps) mult=8000000 ;;    gbps) mult=8000000000 ;;
    kibps) mult=8192 ;;      mibps) mult=8388608 ;;
    *) return 1 ;;
  esac
  awk -v n="$num" -v m="$mult" 'BEGIN { printf "%.0f\n", n * m }'
}

netbed_cap() {
  if [[ $# -ne 3 ]]; then _netbed_err "usage: netbed_cap PREFIX I RATE"; return 2; fi
  _netbed_check_prefix "$1" && _netbed_check_index "$2" || return 2
  local p=$1 i=$2 rate=$3 bits burst
  if ! bits=$(_netbed_rate_bits "$rate") || ((bits < 8000)); then
    _netbed_err "bad rate '$rate' (e.g. 200mbit, 1gbit)"; return 2
  fi
  burst=$((bits / 8 / 500))                      # 2 ms at RATE, in bytes
  ((burst < 131072)) && burst=131072
  tc -n "$p-h$i" qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 10ms || return 1
  tc -n "$p-sw" qdisc replace dev "p$i" root tbf rate "$rate" burst "$burst" latency 10ms || return 1
}

netbed_uncap() {
  _netbed_check_prefix "$1" && _netbed_check_index "$2" || return 2
  # Deleting a root qdisc that is the default one fails: ignore that.
  tc -n "$1-h$2" qdisc del dev eth0 root 2>/dev/null
  tc -n "$1-sw" qdisc del dev "p$2" root 2>/dev/null
  ip -n "$1-h$2" link show eth0 >/dev/null && ip -n "$1-sw" link show "p$2" >/dev/null
}

netbed_cap_all() {
  if [[ $# -ne 2 ]]; then _netbed_err "usage: netbed_cap_all PREFIX RATE"; return 2; fi
  local n i
  n=$(netbed_hosts "$1") || return 2
  if ((n == 0)); then _netbed_err "no bed '$1'"; return 1; fi
  for ((i = 0; i < n; i++)); do netbed_cap "$1" "$i" "$2" || return 1; done
}

# CLI: bash netbed.sh COMMAND ARGS...
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  cmd=${1:-}
  case $cmd in
    leftovers | up | down | addr | ns | hosts | exec | cut | heal | cap | uncap | cap_all)
      shift
      if [[ $cmd == exec ]]; then
        # Replace this shell so the command's pid is this script's pid.
        _netbed_check_prefix "${1:-}" && _netbed_check_index "${2:-}" || exit 2
        ns="$1-h$2"; shift 2
        [[ $# -ge 1 ]] || { _netbed_err "usage: netbed.sh exec PREFIX I CMD..."; exit 2; }
        exec ip netns exec "$ns" "$@"
      fi
      "netbed_$cmd" "$@"
      exit $?
      ;;
    *)
      echo "usage: $0 {leftovers|up|down|addr|ns|hosts|exec|cut|heal|cap|uncap|cap_all} ARGS..." >&2
      exit 2
      ;;
  esac
fi
