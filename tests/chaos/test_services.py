"""The chaos run's own servers: a restart never hands the run a stranger on its port."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from bench.chaos.services import PrivateRedis, ServiceError


def test_a_port_taken_while_the_server_was_down_fails_the_start_loudly(tmp_path: Path) -> None:
    """Beside ``make test``, a test's own server on a free port can take the port of the run's
    Redis while it restarts: the stranger would answer the readiness probe, and the run's
    workers and beat would talk to it (a full run beside ``make test`` stopped restarting its
    processes after a Redis restart)."""
    redis = PrivateRedis(tmp_path)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as stranger:
        stranger.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        stranger.bind(("127.0.0.1", redis.port))
        stranger.listen()
        with pytest.raises(ServiceError, match="taken by another process"):
            redis.start(wait_s=5)
    redis.start(wait_s=10)
    try:
        assert redis.ready()
    finally:
        redis.stop(kill=True)
