#!/usr/bin/env bash
# Instructions redis-server spends per EVALSHA of a script (callgrind, so repeatable on a
# loaded machine): starts its own redis-server under valgrind on a free loopback port, loads
# the script, sends N calls (redis-benchmark, 4 clients, pipelines of 16) with the given
# keys and arguments, and prints instructions per call. Stops its server by PID.
#
#   bash bench/tools/redis-instr.sh SCRIPT.lua N NUMKEYS KEY... ARG...
#
# `__rand_int__` in a key is replaced by redis-benchmark with a number below 100,000 (the
# peers' `spread`). Our GCRA check is lua/gcra_core.lua followed by lua/gcra.lua:
#
#   cat lua/gcra_core.lua lua/gcra.lua > /tmp/gcra-check.lua
#   K='{pb:ours:hot:0:default:#n:0}'
#   bash bench/tools/redis-instr.sh /tmp/gcra-check.lua 20000 2 "$K:g" "$K:x" "" 1 10000 100
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
