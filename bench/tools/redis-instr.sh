#!/usr/bin/env bash
# Instructions redis-server spends per EVALSHA of a script (callgrind, so repeatable on a
# loaded machine): starts its own redis-server under valgrind on a free loopback port, loads
# the script, sends N calls (redis-benchmark, 4 clients, pipelines of 16) with the given
# keys and arguments, and prints instructions per call. Stops its server by PID.
#
#   bash bench/tools/redis-instr.sh SCRIPT.lua N NUMKEYS KEY... ARG...
#
# `__rand_int__` in a key is replaced by redis-benchmark with a number below 100,000 (the
# peers' `spread`). Our GCRA check is lua/gcra.lua alone (arguments: the step, the tolerance, a
# rested key's lifetime in ms; see its header). The peers' `hot` (100/s, burst 100) and
# `spread` (10^6/s, burst 10^6):
#
#   K='{pb:ours-nocache:hot:0::default:#n:0}'
#   bash bench/tools/redis-instr.sh lua/gcra.lua 20000 1 "$K:g" 10000 1000000 10
#   K='{pb:ours-nocache:spread:0::default:#n:__rand_int__}'
#   bash bench/tools/redis-instr.sh lua/gcra.lua 20000 1 "$K:g" 1 1000000 1
#
# The batch form, 16 checks per call (per check: divide by 16): 16 keys, the time, then one run
# of 16 checks with the same arguments:
#
#   K='{pb:ours-batch:spread:0::default:#n:__rand_int__}:g'
#   bash bench/tools/redis-instr.sh lua/gcra_batch.lua 2000 16 $(printf "$K %.0s" $(seq 16)) '' 16 1 1000000 1
#
# tower-rate-limit-redis's script (its crate's scripts/rate_limit.lua), `hot`:
#
#   bash bench/tools/redis-instr.sh rate_limit.lua 20000 1 pb:tower-rate-limit-redis:hot:0:0 100 10
set -euo pipefail
script=$1; n=$2; shift 2
out=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" \
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --logfile "" \
  >"$out/valgrind.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$out"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$script")")
redis-benchmark -p "$port" -n 200 -c 1 -P 16 -r 100000 -q EVALSHA "$sha" "$@" >/dev/null
callgrind_control -z "$pid" >/dev/null 2>&1
redis-benchmark -p "$port" -n "$n" -c 4 -P 16 -r 100000 -q EVALSHA "$sha" "$@" >/dev/null
callgrind_control -d "$pid" >/dev/null 2>&1
sleep 0.5
dump=$(ls -t "$out"/cg."$pid".* | head -1)
total=$(grep -E '^(summary|totals):' "$dump" | head -1 | awk '{print $2}')
echo "$(basename "$script"): $((total / n)) instructions per call"
