#!/usr/bin/env bash
# Copies a finished default sweep (results/default by default) to results/example/, the committed copy for reading:
# the report, sweep.yaml, leaderboards and figures, every eval's results.json and its samples.jsonl gzip-compressed
# (samples.jsonl.gz: the generations each number comes from), each run's run.json and metrics.jsonl, and the data
# job's data/decontamination.json (the training rows' 8-gram overlap with the benchmarks, which the report shows).
# Not copied: checkpoints, logs, lm-eval's raw output. The A/A calibration runs behind configs/calibration/tiny.json
# (uniform seeds 2-7) come along only when `snakemake calibrate` ran in the source sweep; the committed ones date from
# the calibration's commit (their run.json says which).
#   bash scripts/copy-example.sh [SWEEP_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-results/default}
[ -f "$src/report.html" ] || { echo "copy-example: $src/report.html missing: run the default sweep first" >&2; exit 1; }
tmp=$(mktemp -d results/.example.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
(cd "$src" && { ls report.html sweep.yaml leaderboard*; find data -maxdepth 1 -name decontamination.json
  find figures -type f; find eval -name results.json;
  find eval -name samples.jsonl; find runs -mindepth 3 -maxdepth 3 \( -name run.json -o -name metrics.jsonl \); } |
  xargs cp --parents -t "$OLDPWD/$tmp")
find "$tmp/eval" -name samples.jsonl -exec gzip -n -9 {} +  # -n: no name or time stamp, the same bytes every copy
rm -rf results/example
mv "$tmp" results/example
echo "copy-example: results/example from $src ($(find results/example -type f | wc -l) files)"
