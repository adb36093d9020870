# Sourced by .ci/run: start a throwaway PostgreSQL server on loopback for the multi-worker tests
# and export ARCHSEARCH_TEST_POSTGRES_URL. Idempotent: a server this script started earlier (same
# data dir, still answering) is reused; a dead one's leftovers are wiped and a fresh one is made.
# Runs as root on a fresh Debian 12 (installs postgresql if missing); the server itself runs as the
# unprivileged `postgres` user because initdb and postgres refuse to run as root.
# Overridable: ARCHSEARCH_PG_DIR (data dir), ARCHSEARCH_PG_PORT (default: first free from 55432).

_pg_log() { echo "[.ci/postgres] $*" >&2; }

_pg_bindir() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then echo "$d"; return 0; fi
  done
  return 1
}

_pg_port_free() {
  # true when nothing listens on 127.0.0.1:$1
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

_pg_as() {
  # run a command as the postgres user (runuser needs no password and no tty)
  if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

archsearch_start_postgres() {
  local bindir datadir port url
  if ! bindir=$(_pg_bindir); then
    _pg_log "installing postgresql"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    # policy-rc.d (exit 101) stops the package from starting its own cluster; we run our own.
    local had_policy=0
    [ -e /usr/sbin/policy-rc.d ] && had_policy=1
    [ "$had_policy" = 1 ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; }
    apt-get install -y -qq postgresql >/dev/null
    [ "$had_policy" = 1 ] || rm -f /usr/sbin/policy-rc.d
    bindir=$(_pg_bindir) || { _pg_log "postgresql install failed"; return 1; }
  fi
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
  fi

  datadir=${ARCHSEARCH_PG_DIR:-/tmp/archsearch-ci-postgres}
  if [ -f "$datadir/archsearch.port" ] && _pg_as "$bindir/pg_ctl" -D "$datadir" status >/dev/null 2>&1; then
    port=$(cat "$datadir/archsearch.port")
    _pg_log "reusing the server on port $port ($datadir)"
  else
    # Leftovers of a server that died (or of an interrupted run) are thrown away.
    if [ -d "$datadir" ]; then
      _pg_as "$bindir/pg_ctl" -D "$datadir" stop -m immediate >/dev/null 2>&1 || true
      rm -rf "$datadir"
    fi
    port=${ARCHSEARCH_PG_PORT:-55432}
    while ! _pg_port_free "$port"; do port=$((port + 1)); done
    mkdir -p "$datadir"
    [ "$(id -u)" = 0 ] && chown postgres: "$datadir"
    chmod 700 "$datadir"
    # trust auth is fine: loopback only, throwaway data, test runs only.
    _pg_as "$bindir/initdb" -D "$datadir" -U postgres --auth=trust -E UTF8 --no-locale >/dev/null \
      || { _pg_log "initdb failed"; return 1; }
    echo "$port" > "$datadir/archsearch.port"
    [ "$(id -u)" = 0 ] && chown postgres: "$datadir/archsearch.port"
    # The socket goes into the data dir: /var/run/postgresql may not exist on a fresh machine.
    _pg_as "$bindir/pg_ctl" -D "$datadir" -l "$datadir/server.log" -w -t 60 start \
      -o "-c listen_addresses=127.0.0.1 -p $port -k $datadir -c max_connections=200 -c fsync=off" >/dev/null \
      || { _pg_log "server did not start:"; tail -20 "$datadir/server.log" >&2; return 1; }
    _pg_log "started on 127.0.0.1:$port ($datadir)"
    ARCHSEARCH_PG_STARTED=1
  fi
  if ! _pg_as "$bindir/psql" -h 127.0.0.1 -p "$port" -U postgres -Atqc \
      "SELECT 1 FROM pg_database WHERE datname='archsearch_test'" postgres | grep -q 1; then
    _pg_as "$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres archsearch_test
  fi
  export ARCHSEARCH_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$port/archsearch_test"
  export ARCHSEARCH_PG_BINDIR="$bindir" ARCHSEARCH_PG_DATADIR="$datadir"
}

archsearch_stop_postgres() {
  # only a server this shell started; one reused from an earlier run stays up
  [ "${ARCHSEARCH_PG_STARTED:-0}" = 1 ] && [ -n "${ARCHSEARCH_PG_DATADIR:-}" ] || return 0
  _pg_as "$ARCHSEARCH_PG_BINDIR/pg_ctl" -D "$ARCHSEARCH_PG_DATADIR" stop -m fast >/dev/null 2>&1 || true
}
