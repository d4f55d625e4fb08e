#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for trying `snakemake --profile profiles/slurm` on a workstation
# and for CI (tests/test_live_slurm.py). Needs root and Debian's slurm-wlm and munge packages:
#   sudo apt-get install -y slurm-wlm munge
#   sudo scripts/local-slurm.sh start     # writes slurm.conf for this machine, starts munged, slurmctld, slurmd
#   scripts/local-slurm.sh status         # daemons and `sinfo`; exit status 0 when the cluster answers
#   sudo scripts/local-slurm.sh stop      # stops what start started and removes the /etc/slurm/slurm.conf link
# The node is this machine with the CPUs and memory `slurmd -C` reports, in one default partition `local`.
# Everything (config, state, spool, logs, pid files) lives under $LOCAL_SLURM_DIR (default /var/lib/local-slurm), an
# absolute path that no one but root can change: the folder and the ones under it are owned by root and writable by no
# one else, and so is every folder above it up to / (or, like /tmp, sticky and root's: no one else can rename or remove
# root's entries there); no folder on the path may be a symbolic link. start refuses a path that breaks this, creates
# the missing folders (mode 0755) with mkdir, which fails on a link that appeared meanwhile, and checks them again
# afterwards; stop and a failed start check the path again right before they kill a pid written there. slurm.conf is
# written to a temporary file of unpredictable name inside the folder, then renamed. (Otherwise root would write
# through another user's links and stop would kill the pids that user wrote.)
# A pid file is trusted only when its process runs the expected daemon (/proc/PID/exe: $LOCAL_SLURM_SBIN/slurmctld,
# slurmd or munged) and started before the file was written: a pid reused after a reboot or a crash is never killed;
# its stale pid file is removed.
# /etc/slurm/slurm.conf becomes a link to its slurm.conf, so users' sinfo/sbatch/squeue find it without SLURM_CONF.
# A slurm.conf that this script did not write is never touched: start then stops with an error before it creates
# anything. Every Slurm command this script runs itself (sinfo, squeue, scancel) is given its own slurm.conf
# (SLURM_CONF), never whatever cluster the machine is configured for, and stop cancels jobs only while its own
# slurmctld runs and its slurm.conf carries this script's mark: on a node of a real cluster, stop cancels no one's jobs.
# The daemons listen on the loopback address only. A start that fails stops the daemons it started.
# For tests, LOCAL_SLURM_ETC_CONF (default /etc/slurm/slurm.conf) and LOCAL_SLURM_SBIN (default /usr/sbin, where the
# daemons are) replace those paths.
# No accounting database: `sacct` does not work, so Snakemake's executor plugin must poll with squeue
# (`--slurm-status-command squeue`); finished jobs stay visible to squeue for MinJobAge (10 minutes).
# start and stop are idempotent: start on a running cluster only reports it, stop on a stopped one does nothing.
set -euo pipefail

DIR=${LOCAL_SLURM_DIR:-/var/lib/local-slurm}
DIR=$(printf '%s' "$DIR" | tr -s /)  # one slash between folders, none at the end: the path is compared as written
[ "$DIR" = / ] || DIR=${DIR%/}
CONF=$DIR/slurm.conf
ETC_CONF=${LOCAL_SLURM_ETC_CONF:-/etc/slurm/slurm.conf}
SBIN=${LOCAL_SLURM_SBIN:-/usr/sbin}
MARKER="# written by scripts/local-slurm.sh"

die() { echo "local-slurm: $*" >&2; exit 1; }

need_packages() {
  local missing=()
  for cmd in slurmctld slurmd sinfo sbatch squeue scontrol munged; do
    command -v "$cmd" >/dev/null 2>&1 || [ -x "$SBIN/$cmd" ] || missing+=("$cmd")
  done
  [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}: install Debian's packages first:" \
    "sudo apt-get install -y slurm-wlm munge"
}

need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (slurmd starts jobs as their users): sudo $0 $1"; }

# a Slurm client command run against this script's own cluster, never the one /etc/slurm/slurm.conf names
own() { SLURM_CONF=$CONF "$@"; }

answers() { own timeout 10 sinfo -h >/dev/null 2>&1; }

# file $1 was written by this script
written_here() { [ -f "$1" ] && grep -q "^$MARKER" "$1" 2>/dev/null; }

# /etc/slurm/slurm.conf is there and is neither the link to our slurm.conf nor written by this script: this machine
# is configured for a real cluster
real_cluster() {
  [ -e "$ETC_CONF" ] || [ -L "$ETC_CONF" ] || return 1
  if [ -L "$ETC_CONF" ] && [ "$(readlink "$ETC_CONF")" = "$CONF" ]; then return 1; fi
  ! written_here "$ETC_CONF"
}

# the pid in file $1, when it is a number and its process is alive (not a zombie)
read_pid() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ $pid =~ ^[1-9][0-9]*$ ]] && running "$pid" && echo "$pid"
}
running() { kill -0 "$1" 2>/dev/null && [[ $(ps -o stat= -p "$1" 2>/dev/null) != Z* ]]; }

# process $1 runs the daemon $2 ($SBIN/$2, or an executable of that name) and started before its pid file $3 was
# written; a pid file outliving its daemon (a reboot, a crash) may name any process that got the pid since
is_daemon() {
  local pid=$1 daemon=$2 pidfile=$3 exe stat ticks boot written
  local -a fields
  if exe=$(readlink "/proc/$pid/exe" 2>/dev/null); then
    exe=${exe% (deleted)}  # the package was upgraded under the running daemon
    [ "$exe" = "$(readlink -f "$SBIN/$daemon")" ] || [ "${exe##*/}" = "$daemon" ] || return 1
  else  # no ptrace right over another user's process (a container without CAP_SYS_PTRACE): its command name
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$daemon" ] || return 1
  fi
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  read -r -a fields <<< "${stat##*) }"  # the fields after the command name (which may hold spaces), from the 3rd
  ticks=${fields[19]:-}  # field 22: the start time, in clock ticks after boot
  boot=$(awk '$1 == "btime" { print $2 }' /proc/stat)
  written=$(stat -c %Y "$pidfile" 2>/dev/null) || return 1
  [[ $ticks =~ ^[0-9]+$ && $boot =~ ^[0-9]+$ ]] || return 1
  # whole seconds on both sides, the boot time rounded: two seconds of slack
  (( boot + ticks / $(getconf CLK_TCK) <= written + 2 ))
}

# the pid in file $1 when its process is the daemon $2 (see is_daemon)
daemon_pid() {
  local pid
  pid=$(read_pid "$1") && is_daemon "$pid" "$2" "$1" && echo "$pid"
}

# what is wrong with folder $1, if anything: a symbolic link, not a folder, another user's, or writable by group or
# others (with $2 = sticky, a sticky folder of root's may be writable by all, like /tmp)
folder_problem() {
  local mode
  if [ -L "$1" ]; then echo "$1 is a symbolic link"
  elif [ ! -d "$1" ]; then echo "$1 is not a folder"
  elif [ "$(stat -c %u "$1")" != 0 ]; then echo "$1 belongs to another user (uid $(stat -c %u "$1"))"
  else
    mode=0$(stat -c %a "$1")
    if (( mode & 022 )) && { [ "${2:-}" != sticky ] || (( (mode & 01000) == 0 )); }; then
      echo "$1 is writable by group or others (mode ${mode#0})"
    fi
  fi
}

# what is wrong with the folders from / down to $DIR, the existing ones: each must be root's, writable by no one
# else and no symbolic link; above $DIR, a sticky folder of root's will do (no one else can rename root's entries)
path_problem() {
  local path="" part problem
  local -a parts
  [[ $DIR == /?* ]] || { echo "LOCAL_SLURM_DIR=$DIR is not an absolute path below /"; return; }
  problem=$(folder_problem / sticky)
  [ -z "$problem" ] || { echo "$problem"; return; }
  IFS=/ read -r -a parts <<< "${DIR#/}"
  for part in "${parts[@]}"; do
    case $part in . | ..) echo "LOCAL_SLURM_DIR=$DIR has a '$part' in it"; return ;; esac
    path=$path/$part
    [ -e "$path" ] || [ -L "$path" ] || return 0  # neither it nor what is below exists
    if [ "$path" = "$DIR" ]; then problem=$(folder_problem "$path"); else problem=$(folder_problem "$path" sticky); fi
    [ -z "$problem" ] || { echo "$problem"; return; }
  done
}

# what is wrong with $DIR, its path and its run folder (that holds the pid files), if anything
dir_problem() {
  local problem
  problem=$(path_problem)
  [ -n "$problem" ] || problem=$(folder_problem "$DIR")
  if [ -z "$problem" ] && { [ -e "$DIR/run" ] || [ -L "$DIR/run" ]; }; then problem=$(folder_problem "$DIR/run"); fi
  printf '%s' "$problem"
}

refuse() {
  die "$1: refusing to use $DIR (remove it, or set LOCAL_SLURM_DIR to a folder that only root can write, on a path" \
    "that only root can change)"
}

# $DIR, the folders above it and the ones under it, created if missing (state, which holds the jobs' scripts and
# environments, for root's eyes only), then checked: any that is not root's alone stops the script. What exists is
# checked before anything is created; mkdir fails on whatever appeared meanwhile, a link included.
secure_dirs() {
  local problem path="" part dir
  local -a parts
  problem=$(path_problem)
  [ -z "$problem" ] || refuse "$problem"
  IFS=/ read -r -a parts <<< "${DIR#/}"
  for part in "${parts[@]}"; do
    path=$path/$part
    if [ ! -e "$path" ] && [ ! -L "$path" ]; then mkdir -m 0755 "$path" || refuse "could not create $path"; fi
  done
  for dir in "$DIR"/{state,spool,log,run}; do
    if [ ! -e "$dir" ] && [ ! -L "$dir" ]; then
      mkdir -m "$([ "$dir" = "$DIR/state" ] && echo 0700 || echo 0755)" "$dir" || refuse "could not create $dir"
    fi
  done
  problem=$(path_problem)
  for dir in "$DIR" "$DIR"/{state,spool,log,run}; do
    [ -n "$problem" ] || problem=$(folder_problem "$dir")
  done
  [ -z "$problem" ] || refuse "$problem"
}

munge_works() { command -v munge >/dev/null && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

# slurm.conf, through a file of unpredictable name in $DIR (no name another process could prepare) renamed over it
write_conf() {
  local node host tmp
  host=$(hostname -s)
  # e.g. "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105"
  node=$(PATH=$PATH:$SBIN slurmd -C | head -n 1)
  [[ $node == NodeName=* ]] || die "slurmd -C gave no node line: $node"
  tmp=$(mktemp "$DIR/.slurm.conf.XXXXXXXXXX")
  cat > "$tmp" <<EOF || { rm -f "$tmp"; die "could not write $tmp"; }
$MARKER for $(hostname -s): state under $DIR
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
# listen on the loopback address only (not on every address of the machine)
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
# finished jobs stay in squeue (the executor plugin's status source without accounting) for 10 minutes
MinJobAge=600
# a job past its time limit gets SIGTERM, then SIGKILL after KillWait seconds
KillWait=10
InactiveLimit=0
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
$node NodeAddr=127.0.0.1 NodeHostname=$host
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  chmod 0644 "$tmp"  # users' sinfo and sbatch read it through the /etc/slurm/slurm.conf link
  mv -f -T "$tmp" "$CONF"
}

link_conf() {
  mkdir -p "$(dirname "$ETC_CONF")"
  if [ -L "$ETC_CONF" ] && [ "$(readlink "$ETC_CONF")" = "$CONF" ]; then return; fi
  ! real_cluster || \
    die "$ETC_CONF exists and was not written by this script: a real cluster is configured here; not touching it"
  rm -f "$ETC_CONF"  # a link to, or a copy of, a slurm.conf this script wrote
  ln -s "$CONF" "$ETC_CONF"
}

start_munge() {
  munge_works && return
  [ -f /etc/munge/munge.key ] || mungekey -c -k /etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- "$SBIN/munged"
  # munged daemonizes and writes its pid file; remember that this script started it
  for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.2; done
  cp /run/munge/munged.pid "$DIR/run/munged.pid" 2>/dev/null || true
  for _ in $(seq 50); do munge_works && break; sleep 0.2; done
  munge_works || die "munged did not start (see /var/log/munge/munged.log)"
}

# a start that fails stops what it started (the EXIT trap of cmd_start until it succeeds)
undo_start() {
  echo "local-slurm: start failed: stopping the daemons it started" >&2
  stop_daemons || true
  unlink_conf
}

cmd_start() {
  need_packages
  need_root start
  # before anything is created
  ! real_cluster || die "$ETC_CONF exists and was not written by this script: a real cluster is configured here;" \
    "not touching it (nothing created)"
  secure_dirs
  if daemon_pid "$DIR/run/slurmctld.pid" slurmctld >/dev/null && daemon_pid "$DIR/run/slurmd.pid" slurmd >/dev/null &&
    answers; then
    echo "local-slurm: already running (config $CONF)"; own sinfo; return
  fi
  trap undo_start EXIT
  start_munge
  write_conf
  link_conf
  daemon_pid "$DIR/run/slurmctld.pid" slurmctld >/dev/null || "$SBIN/slurmctld" -f "$CONF"
  daemon_pid "$DIR/run/slurmd.pid" slurmd >/dev/null || "$SBIN/slurmd" -f "$CONF"
  local state=""
  for _ in $(seq 60); do
    state=$(own timeout 5 sinfo -h -o %t 2>/dev/null | head -n 1 || true)
    [ "$state" = idle ] && break
    sleep 0.5
  done
  [ "$state" = idle ] || die "the node is '${state:-not answering}' after 30 s; logs: $DIR/log/"
  trap - EXIT
  echo "local-slurm: running (config $CONF, logs $DIR/log)"
  own sinfo
}

# stops the daemon $2 whose pid is in file $1, and removes the file; a pid whose process is not that daemon (see
# is_daemon) is not killed
stop_pidfile() {
  local pidfile=$1 daemon=$2 pid
  [ -e "$pidfile" ] || [ -L "$pidfile" ] || return 0
  if pid=$(read_pid "$pidfile") && ! is_daemon "$pid" "$daemon" "$pidfile"; then
    echo "local-slurm: pid $pid of $pidfile is not the $daemon that wrote the file (a stale pid file):" \
      "removing the file, killing nothing" >&2
    pid=""
  fi
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do running "$pid" || break; sleep 0.2; done
    if running "$pid" && is_daemon "$pid" "$daemon" "$pidfile"; then kill -9 "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$pidfile"
}

# the pid files are trusted only in a folder that no one but root can write, on a path no one else can change:
# checked again right before anything is killed
stop_daemons() {
  local problem
  problem=$(dir_problem)
  [ -z "$problem" ] || { echo "local-slurm: $problem: not killing the pids in $DIR/run" >&2; return 1; }
  stop_pidfile "$DIR/run/slurmd.pid" slurmd
  stop_pidfile "$DIR/run/slurmctld.pid" slurmctld
  stop_pidfile "$DIR/run/munged.pid" munged
}

unlink_conf() { if [ -L "$ETC_CONF" ] && [ "$(readlink "$ETC_CONF")" = "$CONF" ]; then rm -f "$ETC_CONF"; fi; }

cmd_stop() {
  local problem
  need_root stop
  [ -e "$DIR" ] || [ -L "$DIR" ] || { echo "local-slurm: nothing to stop (no $DIR)"; return; }
  problem=$(dir_problem)
  [ -z "$problem" ] || die "$problem: not killing the pids in $DIR/run (refusing to use $DIR)"
  # jobs still running: cancel them first, so that slurmd leaves no orphaned job processes behind; only this
  # script's own cluster's, and only while its slurmctld runs (otherwise the answer could come from another cluster)
  if real_cluster; then
    echo "local-slurm: $ETC_CONF configures a real cluster: cancelling no jobs" >&2
  elif daemon_pid "$DIR/run/slurmctld.pid" slurmctld >/dev/null && written_here "$CONF"; then
    own timeout 10 squeue -h -o %i | own xargs -r scancel || true
  fi
  stop_daemons
  unlink_conf
  echo "local-slurm: stopped (state kept in $DIR)"
}

cmd_status() {
  local rc=0 pid
  for daemon in slurmctld slurmd; do
    if pid=$(daemon_pid "$DIR/run/$daemon.pid" "$daemon"); then echo "$daemon: running (pid $pid)"
    else echo "$daemon: not running"; rc=1; fi
  done
  if answers; then own sinfo; own squeue
  else echo "sinfo: this script's cluster does not answer (config $CONF)"; rc=1; fi
  return $rc
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 start|stop|status   (state under \$LOCAL_SLURM_DIR, default /var/lib/local-slurm)" >&2; exit 2 ;;
esac
