#!/usr/bin/env bash
# Make sure the services the tests talk to are up: MariaDB on 127.0.0.1:3306 and Redis on
# 127.0.0.1:6379. Starts whichever is not answering, waits for it, and fails with a message
# naming what it could not provide.
set -uo pipefail

wait_for() {  # name, seconds, command...
  local name=$1 seconds=$2
  shift 2
  for ((i = 0; i < seconds * 4; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  echo "ensure-services: $name did not come up within ${seconds}s" >&2
  return 1
}

mariadb_up() { mysqladmin --protocol=tcp -h 127.0.0.1 -P 3306 -u root ping >/dev/null 2>&1; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping | grep -q PONG; }

status=0

if ! command -v mysqladmin >/dev/null; then
  echo "ensure-services: MariaDB is not installed (Debian: apt-get install mariadb-server)" >&2
  status=1
elif ! mariadb_up; then
  echo "ensure-services: starting MariaDB"
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  wait_for MariaDB 60 mariadb_up || status=1
fi

if ! command -v redis-server >/dev/null; then
  echo "ensure-services: Redis is not installed (Debian: apt-get install redis-server)" >&2
  status=1
elif ! redis_up; then
  echo "ensure-services: starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
  wait_for Redis 20 redis_up || status=1
fi

exit $status
