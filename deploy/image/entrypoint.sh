#!/usr/bin/env bash
# The control plane image's entry point: the first argument names the role, and the process
# replaces this shell (exec), so it is the one tini (PID 1) hands signals to.
#
#   web       the ASGI server (workload_recovery/stack.py web_command), on 0.0.0.0:${PORT:-8000}
#   worker    celery -A tasks worker, ${WORKER_CONCURRENCY:-2} processes
#   beat      celery -A tasks beat: exactly one per deployment
#   migrate   python manage.py migrate --noinput: once, before the other roles start
#
# Further arguments are added to the role's command (`worker -Q recovery.workloads`). Any other
# command runs as given (`python manage.py createsuperuser`, `bash`).
set -euo pipefail

require_secret_key() {
  # Without it, settings would generate a key and store it in the image's var directory, which
  # is read-only here; and every replica would sign with a different key.
  if [[ -z ${SECRET_KEY:-} && -z ${SECRET_KEY_FILE:-} ]]; then
    echo "workload-recovery: set SECRET_KEY or SECRET_KEY_FILE, the same for every role" >&2
    exit 64
  fi
}

role=${1:-web}
(($# > 0)) && shift

case $role in
  web)
    require_secret_key
    exec python -m uvicorn workload_recovery.asgi:application \
      --host 0.0.0.0 --port "${PORT:-8000}" \
      --http h11 --ws websockets-sansio \
      --lifespan off --no-proxy-headers \
      --timeout-graceful-shutdown 5 "$@"
    ;;
  worker)
    require_secret_key
    exec celery -A tasks worker --loglevel INFO --concurrency "${WORKER_CONCURRENCY:-2}" "$@"
    ;;
  beat)
    require_secret_key
    exec celery -A tasks beat --loglevel INFO "$@"
    ;;
  migrate)
    require_secret_key
    exec python manage.py migrate --noinput "$@"
    ;;
  *)
    exec "$role" "$@"
    ;;
esac
