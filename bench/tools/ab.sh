#!/usr/bin/env bash
# Before and after in one sitting: two builds of bench/'s `compare`, alternated round by round
# (one round of each per turn, so that the machine's noise hits both alike), then the median
# of each row over the rounds and the ratio new/old.
#
#   bash bench/tools/ab.sh OLD_COMPARE NEW_COMPARE [OUT_DIR]
#
# Build each side in its own checkout and copy the binary out, e.g.
#   git worktree add --detach ../old fb635cf
#   (cd ../old && cargo build --release -p tower-redis-ratelimit-bench --bin compare && cp target/release/compare /tmp/compare-old)
#   cargo build --release -p tower-redis-ratelimit-bench --bin compare && cp target/release/compare /tmp/compare-new
#   bash bench/tools/ab.sh /tmp/compare-old /tmp/compare-new /tmp/ab
#
# Environment: ROUNDS (default 7), SECS (seconds per contender and workload, default 2),
# FILTER (BENCH_FILTER; default the rows answered without Redis on a hot key: the MemoryStore
# contenders, and the default Redis layer, whose flooded key the deny cache answers; their
# `spread` rows come along), NICE (a niceness for both sides, default none). Each run starts
# its own redis-server and stops it (see bench/README.md); each binary also rewrites
# bench/results/compare.{md,svg} of the checkout it was built in.
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,20p "$0" >&2; exit 2; }
old=$1; new=$2; out=${3:-$(mktemp -d)}
rounds=${ROUNDS:-7}; secs=${SECS:-2}
filter=${FILTER:-ours memory gcra,ours gcra layer (multiplexed)}
run=(); [ -n "${NICE:-}" ] && run=(nice -n "$NICE")
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for side in old new; do
    bin=$old; [ "$side" = new ] && bin=$new
    echo "round $r/$rounds: $side" >&2
    BENCH_ROUNDS=1 BENCH_SECS=$secs BENCH_FILTER=$filter "${run[@]}" "$bin" \
      >"$out/$side-$r.md" 2>"$out/$side-$r.err"
  done
done
python3 - "$out" "$rounds" <<'PY'
import re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}  # (contender, workload) -> {side: [checks/s]}
order = []
for side in ("old", "new"):
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{side}-{r}.md"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 3 or cells[1] not in ("hot", "spread") or not re.match(r"^[0-9]", cells[2]):
                continue
            key = (cells[0], cells[1])
            if key not in rows:
                rows[key] = {"old": [], "new": []}
                order.append(key)
            rows[key][side].append(float(cells[2].split()[0]))
print(f"| contender | workload | before (median) | after (median) | after/before | rounds |")
print("|---|---|---:|---:|---:|---:|")
for key in sorted(order, key=lambda k: (k[1] != "hot", order.index(k))):
    o, n = rows[key]["old"], rows[key]["new"]
    if not o or not n:
        continue
    mo, mn = statistics.median(o), statistics.median(n)
    print(f"| {key[0]} | {key[1]} | {mo:.0f} | {mn:.0f} | {mn / mo:.3f} | {len(o)}/{len(n)} |")
PY
