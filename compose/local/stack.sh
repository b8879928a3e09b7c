#!/usr/bin/env bash
# Goodput's local stack on loopback, without systemd or Docker:
#   Prometheus, Alertmanager, MariaDB + slurmdbd, munged, slurmctld, four slurmd (node1..node4,
#   8 fake GPUs each), and optionally PostgreSQL (for the receiver's PostgreSQL tests).
# Usage: stack.sh start|stop|restart|clear|status|env|install|install-test-tools|start-vm
#   (clear: cancel every Slurm job, the stack kept running)
#   State lives under $GOODPUT_STACK_DIR.
# GOODPUT_TSDB=victoriametrics: vmagent -> victoria-metrics -> vmalert -> Alertmanager in place of
# Prometheus (own ports, so `start-vm` can also run the three beside a running default stack).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
STATE=${GOODPUT_STACK_DIR:-/tmp/goodput-stack}
NODES=${GOODPUT_NODES:-4}
WITH_POSTGRES=${GOODPUT_WITH_POSTGRES:-1}
PROM_PORT=${GOODPUT_PROMETHEUS_PORT:-19090}
SHARDS=${GOODPUT_DETECTOR_SHARDS:-1}
AM_PORT=${GOODPUT_ALERTMANAGER_PORT:-19093}
TSDB=${GOODPUT_TSDB:-prometheus}
VM_PORT=${GOODPUT_VM_PORT:-19095}        # victoria-metrics: Prometheus-compatible query API
VMAGENT_PORT=${GOODPUT_VMAGENT_PORT:-19096}
VMALERT_PORT=${GOODPUT_VMALERT_PORT:-19097}
MARIADB_PORT=13306
PG_PORT=${GOODPUT_POSTGRES_PORT:-15432}
SLURMCTLD_PORT=16817
SLURMDBD_PORT=16819
SLURMD_BASE=17000
CLUSTER=goodput
DB_PASS=goodput-local-only
PACKAGES=(prometheus prometheus-alertmanager slurm-wlm munge slurmdbd mariadb-server)

say() { printf '[stack] %s\n' "$*"; }
die() { printf '[stack] error: %s\n' "$*" >&2; exit 1; }

hold_turn() { # VERB ARGS: run this script again holding the stack's lock (flock -o: the
  # daemons it starts do not inherit it), waiting while another process holds it (a test
  # session: goodput.stack.in_use); that process's own children (GOODPUT_STACK_HOLDER, the
  # token in the lock file) and the script run again go on at once
  local lock=$STATE/in-use.lock holder max=${GOODPUT_STACK_WAIT_S:-1800} rc=0
  max=${max%%.*}; [[ $max =~ ^[0-9]+$ ]] || max=1800
  [ -n "${GOODPUT_STACK_LOCKED:-}" ] && { unset GOODPUT_STACK_LOCKED; return 0; }  # not for daemons
  holder=$(head -c 200 "$lock" 2>/dev/null | tr -d '\n' || true)
  [ -n "${GOODPUT_STACK_HOLDER:-}" ] && [ "${holder%% *}" = "$GOODPUT_STACK_HOLDER" ] && return 0
  mkdir -p "$STATE"
  flock -n "$lock" true || say "waiting for pid ${holder:-another stack.sh} to finish with the stack in $STATE"
  GOODPUT_STACK_LOCKED=1 flock -o -E 75 -w "$max" "$lock" bash "$HERE/stack.sh" "$@" || rc=$?
  [ $rc = 75 ] && die "the stack in $STATE is in use by pid ${holder:-another stack.sh} (waited ${max}s; GOODPUT_STACK_WAIT_S)"
  exit $rc
}

alive() { # pidfile -> true if the process runs (zombies count as dead)
  local pid; [ -f "$1" ] || return 1; pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  case "$(ps -o stat= -p "$pid" 2>/dev/null)" in Z*|"") return 1;; esac
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # seconds description command...
  local t=$1 what=$2; shift 2
  for _ in $(seq $((t * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  die "$what did not become ready in ${t}s (logs: $STATE/logs/)"
}

launch() { # name command... : runs in background, logs and pidfile under $STATE
  local name=$1; shift
  if alive "$STATE/run/$name.pid"; then say "$name already running (pid $(cat "$STATE/run/$name.pid"))"; return 0; fi
  # fds 3-9 closed: a daemon must not inherit a caller's lock (e.g. `flock LOCK stack.sh start`
  # would otherwise stay locked for the daemon's whole life)
  setsid "$@" >"$STATE/logs/$name.log" 2>&1 < /dev/null 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &
  echo $! > "$STATE/run/$name.pid"
}

need_port() { # port name : fail clearly when someone else holds our port
  local port=$1 name=$2
  alive "$STATE/run/$name.pid" && return 0
  port_busy "$port" && die "port $port (for $name) is taken by another process; free it or set its GOODPUT_*_PORT"
  return 0
}

# what the tests drive besides the stack: the console's browser test runs Debian's Chromium, the
# scale-out tests VictoriaMetrics (victoria-metrics, vmagent, vmalert)
TEST_PACKAGES=(chromium chromium-driver victoria-metrics)

install_missing() {
  local missing=()
  [ "$WITH_POSTGRES" = 1 ] && PACKAGES+=(postgresql)
  [ "$TSDB" = victoriametrics ] && PACKAGES+=(victoria-metrics)
  [ "${WITH_TEST_TOOLS:-0}" = 1 ] && PACKAGES+=("${TEST_PACKAGES[@]}")
  for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get to install them"
  say "installing ${missing[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  # keep package scripts from starting system services: we start our own, on loopback
  [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; }
  apt-get -o DPkg::Lock::Timeout=300 update -qq >/dev/null || die "apt-get update failed"
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
}

short_host() { hostname -s; }

write_hook() { # path "sub-command args" : one of Goodput's Slurm hooks (goodput slurm ...);
  # without the project's venv the job just runs
  mkdir -p "$(dirname "$1")"
  cat > "$1" <<HOOK
#!/bin/sh
py=$REPO/.venv/bin/python
[ -x "\$py" ] || exit 0
exec "\$py" -m goodput.entry slurm $2
HOOK
  chmod +x "$1"
}

write_slurm_conf() {
  local host; host=$(short_host)
  local d=$STATE/slurm last=$((SLURMD_BASE + NODES))
  mkdir -p "$d/state" "$d/spool" "$d/dev"
  for i in 0 1 2 3 4 5 6 7; do ln -sfn /dev/null "$d/dev/gpu$i"; done
  cat > "$d/slurm.conf" <<CONF
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$SLURMCTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=5
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd-%n.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,bf_interval=1,sched_interval=1,nohold_on_prolog_fail
JobRequeue=1
ReturnToService=2
SlurmdTimeout=10
SlurmctldTimeout=10
MessageTimeout=5
InactiveLimit=0
KillWait=2
MinJobAge=300
SlurmdParameters=config_overrides
MailProg=/bin/true
JobCompType=jobcomp/none
Prolog=$d/hooks/prolog
Epilog=$d/hooks/epilog
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$SLURMDBD_PORT
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
NodeName=node[1-$NODES] NodeHostname=$host NodeAddr=127.0.0.1 Port=[$((SLURMD_BASE + 1))-$last] CPUs=16 RealMemory=64000 Gres=gpu:8 State=UNKNOWN
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  # Prolog/Epilog: Goodput's node holds, and dcgm-exporter's per-GPU job mapping (hpc_job)
  mkdir -p "$STATE/holds" "$STATE/hpc-jobs"
  write_hook "$d/hooks/prolog" "prolog --hold-dir $STATE/holds --mapping-dir $STATE/hpc-jobs"
  write_hook "$d/hooks/epilog" "epilog --mapping-dir $STATE/hpc-jobs"
  cat > "$d/gres.conf" <<CONF
AutoDetect=off
NodeName=node[1-$NODES] Name=gpu File=$d/dev/gpu[0-7]
CONF
  cat > "$d/slurmdbd.conf" <<CONF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$SLURMDBD_PORT
SlurmUser=root
PidFile=$d/slurmdbd.pid
LogFile=$STATE/logs/slurmdbd-daemon.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MARIADB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
CONF
  chmod 600 "$d/slurmdbd.conf"
}

start_mariadb() {
  local d=$STATE/mariadb
  need_port $MARIADB_PORT mariadb
  if [ ! -d "$d/data/mysql" ]; then
    mkdir -p "$d/data" "$d/run"; chown -R mysql:mysql "$d"
    mariadb-install-db --user=mysql --datadir="$d/data" --auth-root-authentication-method=socket >"$STATE/logs/mariadb-install.log" 2>&1 \
      || die "mariadb-install-db failed (see $STATE/logs/mariadb-install.log)"
  fi
  launch mariadb mariadbd --no-defaults --user=mysql --datadir="$d/data" --socket="$d/run/mysqld.sock" \
    --pid-file="$d/run/mysqld.pid" --port=$MARIADB_PORT --bind-address=127.0.0.1 --skip-name-resolve
  wait_for 30 mariadb mariadb --no-defaults -S "$d/run/mysqld.sock" -u root -e 'select 1'
  mariadb --no-defaults -S "$d/run/mysqld.sock" -u root <<SQL
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
SQL
}

start_munge() {
  [ -s /etc/munge/munge.key ] || { mkdir -p /etc/munge; dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; }
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/lib/munge /var/log/munge; chown munge:munge /run/munge /var/lib/munge /var/log/munge
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then say "munged already answering"; return 0; fi
  launch munged setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --foreground
  wait_for 10 munged sh -c 'munge -n | unmunge'
}

start_slurm() {
  export SLURM_CONF=$STATE/slurm/slurm.conf
  need_port $SLURMDBD_PORT slurmdbd; need_port $SLURMCTLD_PORT slurmctld
  launch slurmdbd slurmdbd -D
  wait_for 30 slurmdbd sacctmgr -n list cluster
  sacctmgr -n list cluster format=cluster | grep -qw $CLUSTER || sacctmgr -i add cluster $CLUSTER >/dev/null
  local running=0; alive "$STATE/run/slurmctld.pid" && running=1
  launch slurmctld slurmctld -D -i
  wait_for 30 slurmctld sh -c 'scontrol ping | grep -q UP'
  # a running Slurm takes a changed slurm.conf (e.g. a new Prolog) without a restart
  if [ "$running" = 1 ] && [ "${SLURM_CONF_CHANGED:-0}" = 1 ]; then
    scontrol reconfigure && say "slurm.conf changed: slurmctld reconfigured"
  fi
  for i in $(seq 1 "$NODES"); do
    need_port $((SLURMD_BASE + i)) "slurmd-node$i"
    launch "slurmd-node$i" slurmd -D -N "node$i"
  done
  wait_for 30 "slurm nodes" sh -c "[ \$(sinfo -h -N -t idle,mix,alloc -o %N | sort -u | wc -l) -ge $NODES ]"
  # Slurm's state outlives a stop: a drain from an earlier run would surprise the next tests
  local drained; drained=$(sinfo -h -N -t drain -o '%N %E' | grep -i goodput | sort -u || true)
  if [ -n "$drained" ]; then
    say "nodes Goodput drained in an earlier run (scontrol update nodename=NODE state=resume):"
    printf '%s\n' "$drained" | sed 's/^/  /'
  fi
}

start_prometheus() {
  local d=$STATE/prometheus
  mkdir -p "$d/data" "$d/targets"
  need_port "$PROM_PORT" prometheus
  render_scrape_config "$d/prometheus.yml"
  default_targets
  launch prometheus prometheus --config.file="$d/prometheus.yml" --storage.tsdb.path="$d/data" \
    --web.listen-address=127.0.0.1:$PROM_PORT --web.enable-lifecycle --web.enable-admin-api \
    --web.external-url=http://127.0.0.1:$PROM_PORT
  wait_for 30 prometheus curl -sf "http://127.0.0.1:$PROM_PORT/-/ready"
  # an already running Prometheus picks up regenerated rules and targets
  curl -sf -X POST "http://127.0.0.1:$PROM_PORT/-/reload" >/dev/null || die "prometheus reload failed (rules invalid?)"
}

default_targets() { # scrape targets for the simulated dcgm nodes; Goodput services add theirs too
  mkdir -p "$STATE/prometheus/targets"
  [ -f "$STATE/prometheus/targets/dcgm.json" ] || python3 - "$NODES" > "$STATE/prometheus/targets/dcgm.json" <<'PY'
import json, sys
n = int(sys.argv[1])
print(json.dumps([{"targets": [f"127.0.0.1:{19500 + i}" for i in range(1, n + 1)]}]))
PY
}

render_scrape_config() { # out : the shipped scrape config with this stack's paths and ports
  sed -e "s#@ALERTMANAGER@#127.0.0.1:$AM_PORT#" -e "s#@RULES@#$REPO/alertmanager/rules#" \
      -e "s#@TARGETS@#$STATE/prometheus/targets#" -e "s#\"@SHARDS@\"#$SHARDS#" \
      "$REPO/compose/local/prometheus.yml" > "$1"
}

start_victoriametrics() { # vmagent scrapes (same config), victoria-metrics stores, vmalert alerts
  command -v victoria-metrics >/dev/null || die "victoria-metrics is not installed (apt-get install victoria-metrics)"
  local d=$STATE/vm
  mkdir -p "$d/data" "$d/vmagent" "$STATE/prometheus/targets" "$STATE/run" "$STATE/logs"
  need_port "$VM_PORT" victoria-metrics; need_port "$VMAGENT_PORT" vmagent; need_port "$VMALERT_PORT" vmalert
  render_scrape_config "$d/scrape.yml"; default_targets
  launch victoria-metrics victoria-metrics -storageDataPath="$d/data" -retentionPeriod=7d \
    -httpListenAddr=127.0.0.1:$VM_PORT -search.latencyOffset=1s -search.disableCache
  wait_for 30 victoria-metrics curl -sf "http://127.0.0.1:$VM_PORT/health"
  launch vmagent vmagent -promscrape.config="$d/scrape.yml" -remoteWrite.url="http://127.0.0.1:$VM_PORT/api/v1/write" \
    -remoteWrite.tmpDataPath="$d/vmagent" -httpListenAddr=127.0.0.1:$VMAGENT_PORT -promscrape.configCheckInterval=5s \
    -promscrape.config.strictParse=false
  wait_for 30 vmagent curl -sf "http://127.0.0.1:$VMAGENT_PORT/health"
  launch vmalert vmalert -rule="$REPO/alertmanager/rules/*.yml" -datasource.url="http://127.0.0.1:$VM_PORT" \
    -remoteWrite.url="http://127.0.0.1:$VM_PORT" -remoteRead.url="http://127.0.0.1:$VM_PORT" \
    -notifier.url="http://127.0.0.1:$AM_PORT" -evaluationInterval=1s -external.label=cluster=goodput-local \
    -httpListenAddr=127.0.0.1:$VMALERT_PORT
  wait_for 30 vmalert curl -sf "http://127.0.0.1:$VMALERT_PORT/health"
  echo "http://127.0.0.1:$VM_PORT" > "$STATE/run/victoria-metrics.url"
}

start_alertmanager() {
  local d=$STATE/alertmanager
  mkdir -p "$d/data" "$d/secrets"
  need_port "$AM_PORT" alertmanager
  cp "$REPO/alertmanager/alertmanager.yml" "$d/alertmanager.yml"
  [ -d "$REPO/alertmanager/templates" ] && cp -r "$REPO/alertmanager/templates" "$d/"
  [ -s "$d/secrets/receiver-token" ] || { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$d/secrets/receiver-token"; chmod 600 "$d/secrets/receiver-token"; }
  launch alertmanager prometheus-alertmanager --config.file="$d/alertmanager.yml" --storage.path="$d/data" \
    --web.listen-address=127.0.0.1:$AM_PORT --cluster.listen-address= --web.external-url=http://127.0.0.1:$AM_PORT
  wait_for 30 alertmanager curl -sf "http://127.0.0.1:$AM_PORT/-/ready"
}

start_postgres() {
  [ "$WITH_POSTGRES" = 1 ] || return 0
  local bin d=$STATE/postgres
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [ -n "$bin" ] || die "postgresql is not installed"
  need_port "$PG_PORT" postgres
  if [ ! -f "$d/data/PG_VERSION" ]; then
    mkdir -p "$d/data" "$d/run"; chown -R postgres:postgres "$d"
    setpriv --reuid=postgres --regid=postgres --init-groups "$bin/initdb" -D "$d/data" -A trust -U postgres >"$STATE/logs/postgres-init.log" 2>&1 \
      || die "initdb failed (see $STATE/logs/postgres-init.log)"
  fi
  launch postgres setpriv --reuid=postgres --regid=postgres --init-groups "$bin/postgres" -D "$d/data" \
    -p "$PG_PORT" -k "$d/run" -c listen_addresses=127.0.0.1
  wait_for 30 postgres "$bin/pg_isready" -h 127.0.0.1 -p "$PG_PORT"
  psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -tAc "select 1 from pg_database where datname='goodput'" | grep -q 1 \
    || psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -qc 'create database goodput' >/dev/null
}

write_env() {
  local TSDB_URL=http://127.0.0.1:$PROM_PORT
  [ "$TSDB" = victoriametrics ] && TSDB_URL=http://127.0.0.1:$VM_PORT
  cat > "$STATE/env" <<ENV
export GOODPUT_STACK_DIR=$STATE
export SLURM_CONF=$STATE/slurm/slurm.conf
export GOODPUT_PROMETHEUS_URL=$TSDB_URL
export GOODPUT_TSDB=$TSDB
export GOODPUT_ALERTMANAGER_URL=http://127.0.0.1:$AM_PORT
export GOODPUT_RECEIVER_TOKEN_FILE=$STATE/alertmanager/secrets/receiver-token
export GOODPUT_LOG_DIR=$STATE/logs/cluster
export GOODPUT_HOLD_DIR=$STATE/holds
export DCGM_HPC_JOB_MAPPING_DIR=$STATE/hpc-jobs
ENV
  [ "$WITH_POSTGRES" = 1 ] && echo "export GOODPUT_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:$PG_PORT/goodput" >> "$STATE/env"
  return 0
}

cmd_start() {
  [ "$(id -u)" = 0 ] || die "the local stack needs root (Slurm daemons, munge, package installs)"
  install_missing
  mkdir -p "$STATE/run" "$STATE/logs/cluster/jobs" "$STATE/logs/cluster/kernel"
  local before=""  # no slurm.conf yet on a fresh machine (pipefail: no `cat missing | md5sum`)
  [ -f "$STATE/slurm/slurm.conf" ] && before=$(md5sum < "$STATE/slurm/slurm.conf")
  write_slurm_conf; write_env
  [ "$before" != "$(md5sum < "$STATE/slurm/slurm.conf")" ] && SLURM_CONF_CHANGED=1
  local t0=$SECONDS
  start_munge; start_mariadb; start_slurm
  case $TSDB in
    prometheus) start_prometheus;;
    victoriametrics) start_victoriametrics;;
    *) die "GOODPUT_TSDB=$TSDB: want prometheus or victoriametrics";;
  esac
  start_alertmanager; start_postgres
  say "up in $((SECONDS - t0))s; state in $STATE; 'source $STATE/env' for SLURM_CONF and URLs"
}

stop_pid() { # pidfile
  local pid; alive "$1" || { rm -f "$1"; return 0; }
  pid=$(cat "$1"); kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do alive "$1" || break; sleep 0.1; done
  alive "$1" && { kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true; }
  rm -f "$1"
}

stop_job_leftovers() { # a job step slurmd left running (a job slow to die on scancel)
  # slurmstepd retitles itself ("slurmstepd: [200.batch]"): found, with the job's own
  # processes, by their stdout or stderr, the job's output file under $STATE (a reader of
  # it, `tail -f`, holds it on another descriptor)
  local fd pid pids=()
  for fd in /proc/[0-9]*/fd/[12]; do
    case "$(readlink "$fd" 2>/dev/null)" in "$STATE"/logs/cluster/jobs/*)
      pid=${fd#/proc/}; pids+=("${pid%%/*}");; esac
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  mapfile -t pids < <(printf '%s\n' "${pids[@]}" | sort -u)
  kill -KILL "${pids[@]}" 2>/dev/null || true
  say "stopped ${#pids[@]} job process(es) left running"
}

cmd_clear() { # cancel every Slurm job; what a stop does first, and a test session's start
  [ -f "$STATE/slurm/slurm.conf" ] && alive "$STATE/run/slurmctld.pid" || return 0
  export SLURM_CONF=$STATE/slurm/slurm.conf
  local ids out n=0
  for _ in $(seq 60); do # by id, again while any is left: a filter cancelled some, not all
    out=$(squeue -h -o '%i %t' 2>&1) || { say "squeue failed: $out"; return 1; }
    mapfile -t ids < <(awk '$2 != "CG" {print $1}' <<<"$out")
    [ ${#ids[@]} -gt 0 ] || break
    [ $n -gt 0 ] || n=${#ids[@]}
    scancel --quiet --full "${ids[@]}" 2>/dev/null || true
    sleep 0.5
  done
  [ $n -gt 0 ] && say "cancelled $n Slurm job(s)"
  for _ in $(seq 60); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && return 0; sleep 0.5; done
  say "jobs still there after 30 s: $(squeue -h -o '%i %T' 2>/dev/null | tr '\n' ' ')"
  return 1
}

cmd_stop() {
  [ -d "$STATE/run" ] || { say "nothing to stop"; return 0; }
  cmd_clear || true  # what is left dies with its slurmd
  # goodput services first (their pidfiles are written by `goodput`), then the stack in reverse
  local order=(alertmanager vmalert vmagent victoria-metrics prometheus postgres)
  for f in "$STATE"/run/*.pid; do
    [ -e "$f" ] || continue; n=$(basename "$f" .pid)
    case " mariadb munged slurmdbd slurmctld postgres prometheus alertmanager vmalert vmagent victoria-metrics " in *" $n "*) ;; *) [[ $n == slurmd-* ]] || order=("$n" "${order[@]}");; esac
  done
  for f in "$STATE"/run/slurmd-*.pid; do [ -e "$f" ] && order+=("$(basename "$f" .pid)"); done
  order+=(slurmctld slurmdbd mariadb munged)
  for n in "${order[@]}"; do [ -f "$STATE/run/$n.pid" ] && { stop_pid "$STATE/run/$n.pid"; say "stopped $n"; }; done
  pkill -f "slurmstepd.*$STATE" 2>/dev/null || true
  stop_job_leftovers
  say "stopped; state kept in $STATE (remove it for a clean start)"
}

cmd_status() {
  local any=0
  printf '%-22s %-8s %-7s %s\n' COMPONENT STATE PID WHERE
  for f in "$STATE"/run/*.pid; do
    [ -e "$f" ] || continue; any=1
    local n pid where=""; n=$(basename "$f" .pid); pid=$(cat "$f")
    case $n in
      prometheus) where=http://127.0.0.1:$PROM_PORT;; alertmanager) where=http://127.0.0.1:$AM_PORT;;
      mariadb) where=127.0.0.1:$MARIADB_PORT;; postgres) where=127.0.0.1:$PG_PORT;;
      slurmctld) where=*:$SLURMCTLD_PORT;; slurmdbd) where=127.0.0.1:$SLURMDBD_PORT;;
      slurmd-node*) where=*:$((SLURMD_BASE + ${n#slurmd-node}));; munged) where=/run/munge;;
      *) [ -f "$STATE/run/$n.url" ] && where=$(cat "$STATE/run/$n.url");;
    esac
    if alive "$f"; then printf '%-22s %-8s %-7s %s\n' "$n" running "$pid" "$where"
    else printf '%-22s %-8s %-7s %s\n' "$n" dead "$pid" "see $STATE/logs/$n.log"; fi
  done
  [ $any = 1 ] || say "not running (state dir $STATE)"
  if [ -f "$STATE/slurm/slurm.conf" ] && alive "$STATE/run/slurmctld.pid"; then
    SLURM_CONF=$STATE/slurm/slurm.conf sinfo -N -o '%N %T %G' 2>/dev/null | sed 's/^/  /'
  fi
}

case "${1:-}" in start|stop|restart|clear) hold_turn "$@";; esac  # one at a time
case "${1:-}" in
  start) cmd_start;; stop) cmd_stop;; clear) cmd_clear;;
  status) cmd_status;; env) cat "$STATE/env";;
  restart) cmd_stop; cmd_start;;
  install) install_missing;;                      # the stack's packages, nothing started
  install-test-tools) WITH_TEST_TOOLS=1 install_missing;;  # and what the tests drive (Chromium)
  start-vm) start_victoriametrics; say "victoria-metrics on http://127.0.0.1:$VM_PORT (vmagent :$VMAGENT_PORT, vmalert :$VMALERT_PORT)";;
  *) echo "usage: $0 start|stop|restart|clear|status|env|install|install-test-tools|start-vm" >&2; exit 2;;
esac
