#!/usr/bin/env bash
# Run several areas' GPU evidence scripts in one go, each under its own time limit.
#
#   scripts/gpu/run_all.sh OUT_DIR collectives:180 training:300 ...
#
# Each AREA:SECONDS runs `scripts/gpu/AREA.sh OUT_DIR/AREA` (log in
# OUT_DIR/logs/AREA.log), killed if it passes SECONDS. At the end the documents
# and artifacts are packed into OUT_DIR/results.tgz and the logs into
# OUT_DIR/logs.tgz, so a machine that returns only a few files returns all.
set -u
OUT=${1:?usage: run_all.sh OUT_DIR AREA:SECONDS ...}
shift
cd "$(dirname "$0")/../.."
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs" "$OUT/work"
summary="$OUT/logs/summary.txt"
: > "$summary"
for spec in "$@"; do
  area=${spec%%:*}
  limit=${spec##*:}
  start=$(date +%s)
  timeout --kill-after=15 "$limit" bash "scripts/gpu/$area.sh" "$OUT/work/$area" > "$OUT/logs/$area.log" 2>&1
  rc=$?
  echo "$area rc=$rc seconds=$(( $(date +%s) - start )) limit=$limit" | tee -a "$summary"
  tail -n 25 "$OUT/logs/$area.log"
done
echo "== summary"
cat "$summary"
tar czf "$OUT/results.tgz" -C "$OUT/work" . 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$OUT/logs" .
rm -rf "$OUT/work" "$OUT/logs"
