#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests (docs/storage.md, "Tests"):
#   deploy/test-postgres.sh start   prints the port of a running cluster,
#                                   creating and starting it if needed
#   deploy/test-postgres.sh stop    stops it and removes its directory
# The tests call `start` themselves (once per test process; a lock makes the
# processes that nextest runs side by side share one cluster), and .ci/run
# calls `stop` at the end. initdb refuses root, so as root the cluster runs as
# `nobody`. It listens on 127.0.0.1 and a private socket directory only, with
# trust authentication for the `postgres` role on loopback (a throwaway in a
# temp dir, never a real server), a password role `mercury_pw` for the
# password-file test, and TLS with a server certificate for
# `localhost`/127.0.0.1 signed by a test authority (`root.crt` in the directory).
set -euo pipefail
dir=${MERCURY_TEST_PG_DIR:-/tmp/mercury-test-pg}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$bin" ] || { echo "test-postgres: PostgreSQL is not installed (deploy/setup.sh installs postgresql-15)" >&2; exit 1; }

as_pg() {
  if [ "$(id -u)" = 0 ]; then
    setpriv --reuid=nobody --regid=nogroup --clear-groups -- "$@"
  else
    "$@"
  fi
}

case "${1:-start}" in
start)
  mkdir -p "$dir"
  # The lock is released when this script exits (the server must not
  # inherit it: see `9>&-` below).
  exec 9>"$dir.lock"
  flock 9
  if [ -f "$dir/port" ] && as_pg "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
    cat "$dir/port"
    exit 0
  fi
  if [ "$(id -u)" = 0 ]; then chown nobody:nogroup "$dir"; fi
  chmod 700 "$dir"
  if [ ! -f "$dir/data/PG_VERSION" ]; then
    as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; exit 1; }
    # A test authority and a server certificate it signs (rustls, as any
    # verifier should, refuses a CA certificate used as the server's own).
    (
      cd "$dir/data"
      as_pg openssl req -new -x509 -days 7 -nodes -subj /CN=mercury-test-ca \
        -keyout ca.key -out root.crt >/dev/null 2>&1
      as_pg openssl req -new -nodes -subj /CN=localhost -keyout server.key -out server.csr >/dev/null 2>&1
      printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' >server.ext
      as_pg openssl x509 -req -in server.csr -CA root.crt -CAkey ca.key -CAcreateserial -days 7 \
        -extfile server.ext -out server.crt >/dev/null 2>&1
      chmod 600 server.key ca.key
      cp root.crt "$dir/root.crt"
    )
    # The password role authenticates with scram on loopback; everything else trusts.
    printf 'host all mercury_pw 127.0.0.1/32 scram-sha-256\nhost all all 127.0.0.1/32 trust\nlocal all all trust\n' \
      >"$dir/data/pg_hba.conf"
  fi
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c ssl=on -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=400" \
    start >/dev/null 9>&- || { tail -20 "$dir/server.log" >&2; exit 1; }
  "$bin/psql" -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 \
    -c "DO \$\$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'mercury_pw') THEN CREATE ROLE mercury_pw LOGIN CREATEDB PASSWORD 'test-only-password'; END IF; END \$\$;" >/dev/null
  echo "$port" >"$dir/port"
  echo "$port"
  ;;
stop)
  if [ -d "$dir/data" ]; then
    as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$dir" "$dir.lock"
  ;;
*)
  echo "usage: $0 start|stop" >&2
  exit 2
  ;;
esac
