#!/usr/bin/env bash
# tbbench's verbs transport against perftest over the same RDMA link, side by side in one run:
#   bandwidth 256 MiB   tbbench link --transport verbs --mode bw   vs  ib_send_bw (and ib_write_bw on Linux)
#   latency 64 B        tbbench link --transport verbs (p50 one-way) vs  ib_send_lat (t_typical)
# Each figure is the median of ROUNDS rounds, interleaved. Goals (issue 5) on Thunderbolt 5:
# >= 95% of 80 Gbit/s at 256 MiB, <= 5 us one-way at 64 B.
#
#   scripts/bench-rdma.sh HOST_A HOST_B DEVICE [ROUNDS]
#
# HOST_A and HOST_B: ssh names of two machines cabled together, each with tbbench at this
# same path and perftest installed (Linux: apt install perftest; macOS: a perftest port with
# librdma support). DEVICE: the RDMA device on both (rdma_en3 on Macs, mlx5_0 on Linux).
# HOST_B's address on that link is read from `tbbench env --json` there. Without a device the
# script stops at once with tbbench's one-line reason.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 3 ]; then
  sed -n 2,15p "$0" >&2
  exit 2
fi
a=$1 b=$2 dev=$3 rounds=${4:-3}
tb=$(pwd)/target/release/tbbench
[ -x "$tb" ] || cargo build --release -q
for h in "$a" "$b"; do
  ssh -o BatchMode=yes "$h" "$tb env --json" > "/tmp/bench-rdma-env-$h.json" ||
    { echo "bench-rdma: cannot run tbbench on $h over ssh" >&2; exit 1; }
  if ! python3 - "$dev" "/tmp/bench-rdma-env-$h.json" <<'PY'
import json, sys
dev, path = sys.argv[1:]
e = json.load(open(path))
names = [d["name"] for d in e["rdma"]["devices"]]
if dev not in names:
    print(f"bench-rdma: {e['host']['hostname']}: {e['rdma'].get('none_because') or 'no device ' + dev + ' (have ' + ', '.join(names) + ')'}", file=sys.stderr)
    sys.exit(1)
PY
  then exit 1; fi
done
# HOST_B's IPv4 on the interface its device maps to: where perftest's client connects.
b_ip=$(python3 - "$dev" "/tmp/bench-rdma-env-$b.json" <<'PY'
import json, sys
dev, path = sys.argv[1:]
e = json.load(open(path))
iface = next(d["interface"] for d in e["rdma"]["devices"] if d["name"] == dev)
print(next(i["ipv4"][0] for i in e["interfaces"] if i["name"] == iface and i["ipv4"]))
PY
)
hosts=$(mktemp)
printf '[{"ssh": "%s"}, {"ssh": "%s", "ips": ["%s"]}]\n' "$a" "$b" "$b_ip" > "$hosts"
trap 'rm -f "$hosts"' EXIT

median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
# perftest prints a table whose last numeric row holds the figures; column 4 is BW average
# (Gbit/s with --report_gbits) for *_bw, column 5 t_typical for *_lat.
perf() { # tool size column
  ssh -o BatchMode=yes "$b" "$1 -d $dev -s $2 -F --report_gbits >/dev/null 2>&1" &
  sleep 2
  ssh -o BatchMode=yes "$a" "$1 -d $dev -s $2 -F --report_gbits $b_ip" |
    awk -v c="$3" '$1 ~ /^[0-9]+$/ && NF >= c { v = $c } END { print v }'
  wait
}
tbb() { # mode size -> Gbit/s avg or p50 us
  out=$(mktemp -d)
  "$tb" link --hostfile "$hosts" --transport verbs --rdma-device "$dev" --mode "$1" \
    --buffer "$2" --ceiling 80Gbit --out "$out/r.json" >/dev/null
  python3 - "$out/r.json" "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
if sys.argv[2] == "bw":
    print(r["bandwidth"][0]["gbit_per_s"]["avg"])
else:
    print(r["latency"][0]["one_way_us"]["median"])
PY
  rm -rf "$out"
}
declare -a tb_bw pt_bw tb_lat pt_lat pt_wr
for i in $(seq "$rounds"); do
  tb_bw+=("$(tbb bw 256MiB)")
  pt_bw+=("$(perf ib_send_bw 268435456 4)")
  tb_lat+=("$(tbb latency 64)")
  pt_lat+=("$(perf ib_send_lat 64 5)")
  [ "$(uname -s)" = Linux ] && pt_wr+=("$(perf ib_write_bw 268435456 4)")
done
b1=$(median "${tb_bw[@]}"); b2=$(median "${pt_bw[@]}")
l1=$(median "${tb_lat[@]}"); l2=$(median "${pt_lat[@]}")
printf '%-34s %12s %12s %7s\n' figure tbbench perftest ratio
printf '%-34s %12.2f %12.2f %7.2f\n' "bw 256 MiB (Gbit/s) vs ib_send_bw" "$b1" "$b2" "$(python3 -c "print($b1/$b2)")"
printf '%-34s %12.2f %12.2f %7.2f\n' "p50 one-way 64 B (us) vs ib_send_lat" "$l1" "$l2" "$(python3 -c "print($l2/$l1)")"
[ ${#pt_wr[@]} -gt 0 ] && printf '%-34s %12s %12.2f\n' "ib_write_bw 256 MiB (Gbit/s)" "-" "$(median "${pt_wr[@]}")"
printf 'goal: bw >= 76 Gbit/s (95%% of 80), one-way <= 5 us at 64 B; tbbench bw is %.1f%% of 80 Gbit/s\n' "$(python3 -c "print($b1/80*100)")"
