"""The pieces that let `make test` run in several xdist workers without them meeting."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.parallel import (
    BROWSER_GROUP,
    GroupScheduling,
    group_of,
    redis_url_of_worker,
    use_own_redis_database,
    worker_number,
)

SHARED = "redis://127.0.0.1:6379/1"


def worker_settings() -> Any:
    return SimpleNamespace(
        REDIS_URL=SHARED,
        CELERY_BROKER_URL=SHARED,
        CELERY_RESULT_BACKEND="redis://elsewhere:6379/0",
        CACHES={
            "default": {"BACKEND": "locmem"},
            "throttle": {"LOCATION": SHARED},
        },
        CHANNEL_LAYERS={"default": {"CONFIG": {"hosts": [{"address": SHARED}]}}},
    )


def test_worker_numbers_come_from_xdists_ids() -> None:
    assert [worker_number(name) for name in ("gw0", "gw3", "master", "gwx")] == [0, 3, None, None]


def test_each_worker_moves_up_from_the_runs_database() -> None:
    assert redis_url_of_worker(SHARED, 0) == SHARED
    assert redis_url_of_worker(SHARED, 2) == "redis://127.0.0.1:6379/3"
    assert redis_url_of_worker("redis://:pw@host:6380/4?timeout=3", 1) == (
        "redis://:pw@host:6380/5?timeout=3"
    )
    assert redis_url_of_worker("redis://127.0.0.1:6379", 1) == "redis://127.0.0.1:6379/1"
    with pytest.raises(pytest.UsageError, match="Redis has 16"):
        redis_url_of_worker("redis://127.0.0.1:6379/14", 2)


def test_a_worker_moves_every_setting_that_was_the_runs_redis_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    settings, environ = worker_settings(), {"REDIS_URL": SHARED}
    own = use_own_redis_database(settings, environ)
    assert own == "redis://127.0.0.1:6379/2"
    assert environ["REDIS_URL"] == settings.REDIS_URL == settings.CELERY_BROKER_URL == own
    assert settings.CELERY_RESULT_BACKEND == "redis://elsewhere:6379/0"
    assert settings.CACHES["throttle"]["LOCATION"] == own
    assert settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0]["address"] == own


@pytest.mark.parametrize("worker", ["gw0", ""])
def test_the_first_worker_and_a_run_without_workers_keep_the_runs_redis(
    monkeypatch: pytest.MonkeyPatch, worker: str
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    settings, environ = worker_settings(), {"REDIS_URL": SHARED}
    assert use_own_redis_database(settings, environ) is None
    assert settings.REDIS_URL == environ["REDIS_URL"] == SHARED


@pytest.mark.parametrize(
    ("nodeid", "group"),
    [
        ("tests/slurm/test_polling.py::test_the_task_polls_a_cluster[slurm-22.05]", "slurm-22.05"),
        ("tests/slurm/test_ssh.py::test_arguments_reach[slurm-24.11-None]", "slurm-24.11"),
        ("tests/slurm/test_drains.py::test_x[slurm-24.11-RMA 4411 PSU swap]", "slurm-24.11"),
        ("tests/deploy/test_controller_package.py::test_it_installs[9]", "slurm-wheel"),
        ("tests/e2e/test_scenarios.py::test_1_a_killed_rank[slurm-22.05]", "slurm-e2e-22.05"),
        ("tests/e2e/test_scenarios.py::test_8_a_controller_killed[slurm-24.11]", "slurm-e2e-24.11"),
        ("tests/browser/test_approvals.py::test_an_operator_approves", BROWSER_GROUP),
        ("tests/loop/test_confirmation.py::test_a_caught_exception", None),
        ("tests/detection/test_corpus.py::test_it_classifies[slurm-2205-note]", None),
    ],
)
def test_a_group_is_told_from_a_tests_id(nodeid: str, group: str | None) -> None:
    assert group_of(nodeid) == group


def test_the_scheduler_keeps_a_group_together_and_lets_other_tests_go_anywhere() -> None:
    scheduling = GroupScheduling.__new__(GroupScheduling)
    assert scheduling._split_scope("tests/slurm/test_cluster.py::test_a[slurm-22.05]") == (
        "slurm-22.05"
    )
    assert scheduling._split_scope("tests/slurm/test_cluster.py::test_a[slurm-24.11]") == (
        "slurm-24.11"
    )
    assert scheduling._split_scope("tests/api/test_errors.py::test_b") == (
        "tests/api/test_errors.py::test_b"
    )


def test_a_slurm_test_whose_id_does_not_say_so_stops_the_run(
    pytester: pytest.Pytester,
) -> None:
    """A test on the Slurm cluster that a worker outside the group could get would start a
    second cluster on the same ports: the collection refuses it."""
    pytester.makeconftest(
        """
        import pytest
        from tests.parallel import check_groups

        @pytest.fixture(params=["x"])
        def slurm_cluster(request):
            return request.param

        def pytest_collection_modifyitems(items):
            check_groups(items)
        """
    )
    pytester.makepyfile(test_cluster="def test_uses_the_cluster(slurm_cluster): pass")
    result = pytester.runpytest("-p", "no:django", "-p", "no:cacheprovider")
    result.stderr.fnmatch_lines(["*cannot tell the worker group of these tests*"])
