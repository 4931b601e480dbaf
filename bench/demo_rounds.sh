#!/usr/bin/env bash
# `ppnode demo` with each of several builds in turn, ROUNDS times (A B A B ...),
# printing each run's quota cut, re-plans and result line.
#
#   ROUNDS=3 bench/demo_rounds.sh BINARY...
set -euo pipefail
out=$(mktemp -d)
for r in $(seq "${ROUNDS:-3}"); do
	for bin in "$@"; do
		echo "== $bin round $r $(date +%T)"
		"$bin" demo >"$out/demo.txt" 2>&1 || { cat "$out/demo.txt"; exit 1; }
		grep -E "quota cut|re-planned at|re-plan at|^done:" "$out/demo.txt"
	done
done
rm -rf "$out"
