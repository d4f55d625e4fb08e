#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for trying `snakemake --profile profiles/slurm` on a workstation
# and for CI (tests/test_live_slurm.py). Needs root and Debian's slurm-wlm and munge packages:
#   sudo apt-get install -y slurm-wlm munge
#   sudo scripts/local-slurm.sh start     # writes slurm.conf for this machine, starts munged, slurmctld, slurmd
#   scripts/local-slurm.sh status         # daemons and `sinfo`; exit status 0 when the cluster answers
#   sudo scripts/local-slurm.sh stop      # stops what start started and removes the /etc/slurm/slurm.conf link
# The node is this machine with the CPUs and memory `slurmd -C` reports, in one default partition `local`.
# Everything (config, state, spool, logs, pid files) lives under $LOCAL_SLURM_DIR (default /var/lib/local-slurm), a
# folder owned by root that no one else can write: start creates it (mode 0755) and refuses one that is a symbolic
# link, is owned by another user or is writable by group or others (root would write through another user's links
# and stop would kill the pids that user wrote). /etc/slurm/slurm.conf becomes a link to its slurm.conf, so
# sinfo/sbatch/squeue find it without SLURM_CONF. A slurm.conf that this script did not write is never touched:
# start stops with an error instead. The daemons listen on the loopback address only. A start that fails stops
# the daemons it started.
# No accounting database: `sacct` does not work, so Snakemake's executor plugin must poll with squeue
# (`--slurm-status-command squeue`); finished jobs stay visible to squeue for MinJobAge (10 minutes).
# start and stop are idempotent: start on a running cluster only reports it, stop on a stopped one does nothing.
set -euo pipefail

DIR=${LOCAL_SLURM_DIR:-/var/lib/local-slurm}
CONF=$DIR/slurm.conf
ETC_CONF=/etc/slurm/slurm.conf
MARKER="# written by scripts/local-slurm.sh"

die() { echo "local-slurm: $*" >&2; exit 1; }

need_packages() {
  local missing=()
  for cmd in slurmctld slurmd sinfo sbatch squeue scontrol munged; do
    command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("$cmd")
  done
  [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}: install Debian's packages first:" \
    "sudo apt-get install -y slurm-wlm munge"
}

need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (slurmd starts jobs as their users): sudo $0 $1"; }

# a live process (not a zombie) with the pid in file $1
alive() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  kill -0 "$pid" 2>/dev/null && [[ $(ps -o stat= -p "$pid" 2>/dev/null) != Z* ]]
}

answers() { timeout 10 sinfo -h >/dev/null 2>&1; }

# $1 is a real folder (not a link) owned by root and writable by root alone
root_only() { [ -d "$1" ] && [ ! -L "$1" ] && [ "$(stat -c %u "$1")" = 0 ] && [ $(( 0$(stat -c %a "$1") & 022 )) = 0 ]; }

# $DIR and the folders under it, created if missing (state, which holds the jobs' scripts and environments, for
# root's eyes only); any that exists and is not root's alone stops the script
secure_dirs() {
  local dir
  for dir in "$DIR" "$DIR"/{state,spool,log,run}; do
    if [ -e "$dir" ] || [ -L "$dir" ]; then
      root_only "$dir" || die "$dir is a symbolic link, not root's, or writable by others: refusing to use it" \
        "(remove it, or set LOCAL_SLURM_DIR to a folder only root can write)"
    else
      install -d -o root -g root -m "$([ "$dir" = "$DIR/state" ] && echo 0700 || echo 0755)" "$dir"
    fi
  done
}

munge_works() { command -v munge >/dev/null && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

write_conf() {
  local node host
  host=$(hostname -s)
  # e.g. "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105"
  node=$(PATH=$PATH:/usr/sbin slurmd -C | head -n 1)
  [[ $node == NodeName=* ]] || die "slurmd -C gave no node line: $node"
  cat > "$CONF.tmp" <<EOF
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
  mv "$CONF.tmp" "$CONF"
}

link_conf() {
  mkdir -p "$(dirname "$ETC_CONF")"
  if [ -L "$ETC_CONF" ] && [ "$(readlink "$ETC_CONF")" = "$CONF" ]; then return; fi
  if [ -e "$ETC_CONF" ] || [ -L "$ETC_CONF" ]; then
    grep -q "^$MARKER" "$ETC_CONF" 2>/dev/null && rm -f "$ETC_CONF" || \
      die "$ETC_CONF exists and was not written by this script: a real cluster is configured here; not touching it"
  fi
  ln -s "$CONF" "$ETC_CONF"
}

start_munge() {
  munge_works && return
  [ -f /etc/munge/munge.key ] || mungekey -c -k /etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged
  # munged daemonizes and writes its pid file; remember that this script started it
  for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.2; done
  cp /run/munge/munged.pid "$DIR/run/munged.pid" 2>/dev/null || true
  for _ in $(seq 50); do munge_works && break; sleep 0.2; done
  munge_works || die "munged did not start (see /var/log/munge/munged.log)"
}

# a start that fails stops what it started (the EXIT trap of cmd_start until it succeeds)
undo_start() {
  echo "local-slurm: start failed: stopping the daemons it started" >&2
  stop_daemons
  unlink_conf
}

cmd_start() {
  need_packages
  need_root start
  secure_dirs
  if alive "$DIR/run/slurmctld.pid" && alive "$DIR/run/slurmd.pid" && answers; then
    echo "local-slurm: already running (config $CONF)"; sinfo; return
  fi
  trap undo_start EXIT
  start_munge
  write_conf
  link_conf
  alive "$DIR/run/slurmctld.pid" || /usr/sbin/slurmctld -f "$CONF"
  alive "$DIR/run/slurmd.pid" || /usr/sbin/slurmd -f "$CONF"
  local state=""
  for _ in $(seq 60); do
    state=$(timeout 5 sinfo -h -o %t 2>/dev/null | head -n 1 || true)
    [ "$state" = idle ] && break
    sleep 0.5
  done
  [ "$state" = idle ] || die "the node is '${state:-not answering}' after 30 s; logs: $DIR/log/"
  trap - EXIT
  echo "local-slurm: running (config $CONF, logs $DIR/log)"
  sinfo
}

stop_pidfile() {
  local pidfile=$1 pid
  alive "$pidfile" || { rm -f "$pidfile"; return; }
  pid=$(cat "$pidfile")
  kill "$pid"
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  rm -f "$pidfile"
}

stop_daemons() {
  stop_pidfile "$DIR/run/slurmd.pid"
  stop_pidfile "$DIR/run/slurmctld.pid"
  stop_pidfile "$DIR/run/munged.pid"
}

unlink_conf() { if [ -L "$ETC_CONF" ] && [ "$(readlink "$ETC_CONF")" = "$CONF" ]; then rm -f "$ETC_CONF"; fi; }

cmd_stop() {
  need_root stop
  [ -e "$DIR" ] || { echo "local-slurm: nothing to stop (no $DIR)"; return; }
  # the pid files are trusted only in a folder no one but root can write
  root_only "$DIR" && root_only "$DIR/run" || die "$DIR or $DIR/run is not root's alone: not killing the pids in it"
  # jobs still running: cancel them first, so that slurmd leaves no orphaned job processes behind
  if answers; then squeue -h -o %i | xargs -r scancel || true; fi
  stop_daemons
  unlink_conf
  echo "local-slurm: stopped (state kept in $DIR)"
}

cmd_status() {
  local rc=0
  for daemon in slurmctld slurmd; do
    if alive "$DIR/run/$daemon.pid"; then echo "$daemon: running (pid $(cat "$DIR/run/$daemon.pid"))"
    else echo "$daemon: not running"; rc=1; fi
  done
  if answers; then sinfo; squeue; else echo "sinfo: no cluster answers"; rc=1; fi
  return $rc
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 start|stop|status   (state under \$LOCAL_SLURM_DIR, default /var/lib/local-slurm)" >&2; exit 2 ;;
esac
