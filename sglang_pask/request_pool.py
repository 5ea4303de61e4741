"""A thread pool for the concurrent HTTP requests of the calibration and the benchmarks.

``concurrent.futures.ThreadPoolExecutor`` used as a context manager waits, on the way out of its
block, for every submitted task, the queued ones included. A calibration submits all of a stage's
probes at once (hundreds of requests), so Ctrl-C, SIGTERM or a failed request would first send every
queued request and only then stop the server. :func:`request_pool` cancels the queued tasks and does
not wait for the running ones when its block raises; leaving the block normally waits as usual.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def request_pool(workers: int) -> Iterator[ThreadPoolExecutor]:
    """A ``ThreadPoolExecutor`` of ``workers`` threads whose queued tasks are cancelled if the block raises.

    The tasks already running finish on their own (a request ends when its server stops or its
    timeout passes); the exception propagates at once.
    """
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
