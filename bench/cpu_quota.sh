#!/usr/bin/env bash
# Run a command as on a machine FACTOR times slower: the command and every process it starts share a CFS CPU quota
# of (online CPUs / FACTOR) CPUs, in a fresh cgroup removed afterwards. Used to time the default sweep as on the
# slower 2-core machine of issue #17 (1.45x slower per job) when no such machine is at hand:
#
#   bench/cpu_quota.sh 1.45 snakemake --cores 2
#
# What it emulates and what not: the quota is a pool, so while two single-thread jobs run each gets 1/FACTOR of a
# CPU (the job time of a FACTOR-slower CPU), but a job running alone can use a whole CPU (up to the pool): phases with
# one job are not slowed. The quota is enforced every period (100 ms), so processes also lose their caches more
# often than on a slower CPU: the emulation errs slow rather than fast. Needs root and the cgroup v1 `cpu` controller
# (/sys/fs/cgroup/cpu) or cgroup v2 with the `cpu` controller enabled for children of the root.
set -euo pipefail

if [[ $# -lt 2 ]]; then
    echo "usage: bench/cpu_quota.sh FACTOR COMMAND [ARG...]   (FACTOR > 1: how many times slower)" >&2
    exit 2
fi
factor=$1
shift
# the CFS default period; with 10 ms the 2-thread warm start took 65 s against 41 s at 100 ms (two sweeps, ~10% machine
# speed drift between them): its threads wait on each other when one is throttled
period_us=100000
if ! quota_us=$(python3 -c "import os, sys; f = float(sys.argv[1]); sys.exit(f'FACTOR must be a number >= 1, got \
{f}') if not f >= 1 else print(int(os.cpu_count() * $period_us / f))" "$factor" 2>&1); then
    echo "bench/cpu_quota.sh: $quota_us" >&2
    exit 2
fi
name="harness-cpu-quota-$$"

if [[ -d /sys/fs/cgroup/cpu && -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]]; then  # cgroup v1
    group=/sys/fs/cgroup/cpu/$name
    mkdir "$group"
    echo "$period_us" > "$group/cpu.cfs_period_us"
    echo "$quota_us" > "$group/cpu.cfs_quota_us"
elif [[ -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control; then  # v2
    group=/sys/fs/cgroup/$name
    mkdir "$group"
    echo "$quota_us $period_us" > "$group/cpu.max"
else
    echo "bench/cpu_quota.sh: no writable cgroup cpu controller (v1 /sys/fs/cgroup/cpu or v2 with +cpu in the" \
         "root's cgroup.subtree_control); run as root on a machine that has one" >&2
    exit 1
fi

cleanup() {
    # move this shell out so the group can be removed (its children have exited by now)
    echo $$ > "$(dirname "$group")/cgroup.procs" 2>/dev/null || true
    rmdir "$group" 2>/dev/null || echo "bench/cpu_quota.sh: could not remove $group" >&2
}
trap cleanup EXIT
echo $$ > "$group/cgroup.procs"
echo "cpu_quota: $quota_us us per $period_us us ($(python3 -c "print(round($quota_us / $period_us, 3))") CPUs of" \
     "$(nproc)), factor $factor, cgroup $group" >&2
set +e
"$@"
status=$?
set -e
exit $status
