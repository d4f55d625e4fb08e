#!/usr/bin/env bash
# Submits Snakemake itself (the orchestrator that submits and polls every job of a sweep) as one long 1-CPU Slurm
# job, for sites that kill long processes on the login node (docs/cluster.md, "Submitting"):
#   scripts/submit-orchestrator.sh [OPTIONS] SWEEP_FILE [SNAKEMAKE_ARGS...]
# The job runs, from this checkout (its working directory) and with this checkout's venv:
#   .venv/bin/snakemake --profile profiles/slurm --configfile SWEEP_FILE SNAKEMAKE_ARGS...
# SNAKEMAKE_ARGS pass through verbatim (e.g. --config 'resources={train: {partition: gpu, account: proj}}').
# Options (or their environment variables; an option wins):
#   --time T        ORCHESTRATOR_TIME       the job's time limit, sbatch --time (default 3-00:00:00): as long as the
#                                           sweep; your partition's longest is `sinfo -o '%P %l'`
#   --partition P   ORCHESTRATOR_PARTITION  sbatch --partition (default: the cluster's default partition)
#   --account A     ORCHESTRATOR_ACCOUNT    sbatch --account (default: your default account)
#   --mem M         ORCHESTRATOR_MEM        sbatch --mem (default 4G: Snakemake and a DAG of a few hundred jobs)
#   --job-name N    ORCHESTRATOR_JOB_NAME   sbatch --job-name (default snakemake-<sweep name>)
#   --stop-before S ORCHESTRATOR_STOP_BEFORE seconds before the time limit at which Snakemake is told to stop
#                                           (default 600; below)
#   --test-only                             sbatch --test-only: Slurm says when and where the job would start,
#                                           nothing is submitted
# ORCHESTRATOR_VENV (default <checkout>/.venv) is the venv whose snakemake runs; it must be on a filesystem the
# compute nodes see, as the checkout must. The log (Snakemake's output) is
# results/<sweep>/logs/orchestrator-<jobid>.log, under the results folder the sweep file names.
# Stopping: Snakemake cancels the jobs it submitted when it gets SIGINT, but on SIGTERM (what a plain `scancel` and a
# time limit send) it waits for them to finish and is killed 30 s later (Slurm's KillWait), leaving them running
# unwatched and its lock in .snakemake/. So the job asks Slurm for SIGINT --stop-before seconds before its limit
# (sbatch --signal=B:INT@S; Snakemake is the batch shell itself, by exec), and the way to stop it is
#   scancel --batch --signal=INT <jobid>
# Submitting this script again continues the sweep: finished jobs are kept, train jobs resume from their last trainer
# checkpoint (the profile reruns incomplete jobs).
# Refuses when sbatch is missing (not a Slurm login node: run Snakemake inside tmux instead), when the venv has no
# snakemake or no SLURM executor plugin, and when the sweep file does not resolve.
set -euo pipefail

die() { echo "submit-orchestrator: $*" >&2; exit 1; }

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${ORCHESTRATOR_VENV:-$REPO/.venv}
TIME=${ORCHESTRATOR_TIME:-3-00:00:00}
PARTITION=${ORCHESTRATOR_PARTITION:-}
ACCOUNT=${ORCHESTRATOR_ACCOUNT:-}
MEM=${ORCHESTRATOR_MEM:-4G}
JOB_NAME=${ORCHESTRATOR_JOB_NAME:-}
STOP_BEFORE=${ORCHESTRATOR_STOP_BEFORE:-600}
TEST_ONLY=0

need_value() { if [ $# -lt 2 ] || [ -z "$2" ]; then die "$1 needs a value (--help)"; fi; }
while [ $# -gt 0 ]; do
  case $1 in
    --time) need_value "$@"; TIME=$2; shift 2 ;;
    --partition) need_value "$@"; PARTITION=$2; shift 2 ;;
    --account) need_value "$@"; ACCOUNT=$2; shift 2 ;;
    --mem) need_value "$@"; MEM=$2; shift 2 ;;
    --job-name) need_value "$@"; JOB_NAME=$2; shift 2 ;;
    --stop-before) need_value "$@"; STOP_BEFORE=$2; shift 2 ;;
    --test-only) TEST_ONLY=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    -*) die "unknown option $1 (--help); Snakemake's own options go after SWEEP_FILE" ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || usage
command -v sbatch >/dev/null 2>&1 || die "sbatch not found: this machine is not a Slurm login node (or Slurm's" \
  "commands are not on PATH), and nothing was submitted. Run this script on a login node; where long processes" \
  "may run there, \`snakemake --profile profiles/slurm --configfile SWEEP_FILE\` inside tmux/screen does the" \
  "same without it (docs/cluster.md)"
SWEEP=$1
shift
[ -f "$SWEEP" ] || die "no sweep file $SWEEP"
SWEEP=$(cd "$(dirname "$SWEEP")" && pwd)/$(basename "$SWEEP")
[[ $STOP_BEFORE =~ ^[0-9]+$ ]] || die "--stop-before takes seconds, got $STOP_BEFORE"
[ -x "$VENV/bin/snakemake" ] || die "no snakemake in $VENV: run make setup in $REPO (or set ORCHESTRATOR_VENV)"
"$VENV/bin/python" -c 'import snakemake_executor_plugin_slurm' 2>/dev/null \
  || die "$VENV has no SLURM executor plugin: $VENV/bin/pip install -e '${REPO}[cluster]'"

# the sweep's name and results folder, as the Snakefile resolves the file (before any --config in SNAKEMAKE_ARGS);
# a sweep file that does not resolve, or a results folder another user could change, is refused here, before it
# waits in the queue; the folder and its logs/ are created as the Snakefile would (harness/config/results_folder.py)
resolved=$(cd "$REPO" && "$VENV/bin/python" - "$SWEEP" <<'EOF'
import sys
from pathlib import Path

from harness.config.loading import resolve
from harness.config.results_folder import secure_sweep_folder

resolved = resolve(Path(sys.argv[1]))
secure_sweep_folder(resolved)
(resolved.results_dir / "logs").mkdir(mode=0o755, exist_ok=True)
print(resolved.sweep.name)
print(resolved.results_dir)
EOF
) || die "the sweep file $SWEEP does not resolve, or its results folder is refused (above)"
NAME=$(tail -n 2 <<<"$resolved" | head -n 1)  # the last two lines: whatever resolving printed comes before
RESULTS=$(tail -n 1 <<<"$resolved")
LOG_DIR=$RESULTS/logs
JOB_NAME=${JOB_NAME:-snakemake-$NAME}

flags=(--parsable --job-name="$JOB_NAME" --ntasks=1 --nodes=1 --cpus-per-task=1 --mem="$MEM" --time="$TIME"
       --output="$LOG_DIR/orchestrator-%j.log" --chdir="$REPO" --signal="B:INT@$STOP_BEFORE")
[ -z "$PARTITION" ] || flags+=(--partition="$PARTITION")
[ -z "$ACCOUNT" ] || flags+=(--account="$ACCOUNT")
[ "$TEST_ONLY" = 0 ] || flags+=(--test-only)

# the batch script: every word quoted for bash (printf %q), so SNAKEMAKE_ARGS arrive as they were given
command_line=$(printf '%q ' "$VENV/bin/snakemake" --profile "$REPO/profiles/slurm" --configfile "$SWEEP" "$@")
script="#!/bin/bash
# the Snakemake orchestrator of sweep $NAME, submitted by scripts/submit-orchestrator.sh
cd $(printf '%q' "$REPO") || exit 1
exec ${command_line% }
"

if [ "$TEST_ONLY" = 1 ]; then
  sbatch "${flags[@]}" <<<"$script"  # sbatch prints when and where the job would start
  exit
fi
out=$(sbatch "${flags[@]}" <<<"$script") || die "sbatch refused the job (above)"
JOB_ID=${out%%;*}  # --parsable: <id> or <id>;<cluster>
[[ $JOB_ID =~ ^[0-9]+$ ]] || die "sbatch answered '$out', not a job id"
cat <<EOF
submitted the orchestrator of sweep $NAME as Slurm job $JOB_ID (1 CPU, time limit $TIME)
  follow: tail -f $LOG_DIR/orchestrator-$JOB_ID.log
          squeue -j $JOB_ID; squeue -u \$USER (its jobs); $VENV/bin/harness progress --sweep $SWEEP
  stop:   scancel --batch --signal=INT $JOB_ID   (Snakemake cancels the jobs it submitted, then exits; a plain
          scancel would leave them running unwatched)
  continue after it ends: run this script again (train jobs resume from their last trainer checkpoint)
EOF
