"""``request_pool``: queued tasks are cancelled when the block raises, and only then."""

from __future__ import annotations

import threading
import time

import pytest

from sglang_pask.request_pool import request_pool


def test_a_raising_block_cancels_the_queued_tasks_and_returns_at_once():
    release = threading.Event()
    ran: list[int] = []

    def task(index: int) -> int:
        ran.append(index)
        release.wait(timeout=30)  # the running tasks block until the test lets them go
        return index

    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        with request_pool(2) as pool:
            futures = [pool.submit(task, i) for i in range(20)]
            while len(ran) < 2:
                time.sleep(0.01)
            raise KeyboardInterrupt  # as SIGTERM's handler or Ctrl-C would, mid-stage
    assert time.perf_counter() - start < 10  # did not wait for the blocked tasks
    release.set()
    assert all(f.cancelled() for f in futures[2:]) and sorted(ran) == [0, 1]
    assert [f.result(timeout=30) for f in futures[:2]] == [0, 1]
    assert sorted(ran) == [0, 1]  # nothing queued ran afterwards


def test_a_block_that_ends_normally_waits_for_every_task():
    with request_pool(2) as pool:
        futures = [pool.submit(time.sleep, 0.05) for _ in range(6)]
    assert all(f.done() and not f.cancelled() for f in futures)
