#!/usr/bin/env bash
# The network lab: two "hosts" as network namespaces on this machine, joined by one veth pair
# per "network", each in its own subnet and shaped with tc tbf to a profile. netem is not used
# (this kernel lacks it). Needs root.
#
#   scripts/netlab.sh up [PREFIX]     create PREFIXa and PREFIXb (default PREFIX: tbl)
#   scripts/netlab.sh down [PREFIX]   remove them
#   scripts/netlab.sh hostfile [PREFIX] [NET]   print an mlx.launch hostfile for network NET
#
# Networks (host a is .1, host b is .2):
#   0  10.71.0.0/24  tbf 2500mbit  "ethernet 2.5G" profile
#   1  10.72.0.0/24  tbf 10gbit    "ethernet 10G" profile
#   2  10.73.0.0/24  unshaped
# MTU 9000 on every link, so per-packet header overhead stays under 1% of the shaped rate.
set -euo pipefail

cmd=${1:-}
p=${2:-tbl}
rates=(2500mbit 10gbit "")

up() {
  down >/dev/null 2>&1 || true
  ip netns add "${p}a"
  ip netns add "${p}b"
  for ns in "${p}a" "${p}b"; do ip -n "$ns" link set lo up; done
  for i in 0 1 2; do
    local a="${p}${i}a" b="${p}${i}b"
    ip link add "$a" type veth peer name "$b"
    ip link set "$a" netns "${p}a"
    ip link set "$b" netns "${p}b"
    ip -n "${p}a" addr add "10.7$((i + 1)).0.1/24" dev "$a"
    ip -n "${p}b" addr add "10.7$((i + 1)).0.2/24" dev "$b"
    for end in "${p}a:$a" "${p}b:$b"; do
      local ns=${end%%:*} dev=${end#*:}
      ip -n "$ns" link set "$dev" mtu 9000 up
      if [ -n "${rates[$i]}" ]; then
        # burst: enough for the rate at a 4 ms timer tick; latency bounds the queue.
        tc -n "$ns" qdisc add dev "$dev" root tbf rate "${rates[$i]}" burst 4mb latency 20ms
      fi
    done
  done
  echo "netlab up: namespaces ${p}a ${p}b; networks 10.71.0.0/24 (2500mbit), 10.72.0.0/24 (10gbit), 10.73.0.0/24 (unshaped)"
}

down() {
  ip netns del "${p}a" 2>/dev/null || true
  ip netns del "${p}b" 2>/dev/null || true
}

hostfile() {
  local net=${3:-0}
  printf '[{"ssh": "%sa", "ips": ["10.7%d.0.1"]}, {"ssh": "%sb", "ips": ["10.7%d.0.2"]}]\n' "$p" $((net + 1)) "$p" $((net + 1))
}

case "$cmd" in
  up) up ;;
  down) down ;;
  hostfile) hostfile "$@" ;;
  *) echo "usage: $0 up|down|hostfile [PREFIX] [NET]" >&2; exit 2 ;;
esac
