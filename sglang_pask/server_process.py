"""Start ``python -m sglang_pask.launch_server`` as a child process and wait until it serves.

Used by the test suite and by the benchmarks (one server start per configuration). The server's
output goes to a log file; on failure the last lines of that log are in the exception.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional, Sequence


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A running ``sglang_pask.launch_server`` (or, for comparisons, stock SGLang) child process.

    Parameters
    ----------
    args : sequence of str
        Server flags (SGLang's and sglang-pask's), without ``--host``/``--port``.
    log_path : Path
        Where the server's stdout and stderr go.
    port : int, optional
        Port to serve on; a free one by default.
    env : dict, optional
        Environment changes for the server process; a value of None removes that variable.
    module : str
        The module run with ``python -m``: ``sglang_pask.launch_server`` (default) or
        ``sglang.launch_server`` for stock SGLang, which then needs the CPU flags spelled out.
    """

    def __init__(
        self,
        args: Sequence[str],
        log_path: Path,
        port: Optional[int] = None,
        env: Optional[dict[str, Optional[str]]] = None,
        module: str = "sglang_pask.launch_server",
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", module, *args, "--host", "127.0.0.1", "--port", str(self.port)]
        environment = dict(os.environ)
        for key, value in (env or {}).items():
            if value is None:
                environment.pop(key, None)
            else:
                environment[key] = value
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,  # its own process group: stop() ends the scheduler too
        )

    def wait_ready(self, timeout_s: float = 600.0) -> "ServerProcess":
        """Block until ``/health`` answers 200; raise ServerStartError if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(f"server exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1.0)
        self.stop()
        raise ServerStartError(f"server not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the server log (also after :meth:`stop`)."""
        if not self._log.closed:
            self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def pause(self) -> None:
        """Freeze the server's whole process group (SIGSTOP): it holds its memory but takes no CPU
        until :meth:`resume`. Benchmarks that keep several servers up pause the ones not being
        timed, so an idle server's threads cannot slow the one being measured."""
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Continue a server frozen by :meth:`pause` (SIGCONT); harmless on a running one."""
        os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Terminate the server's whole process group (SIGTERM, then SIGKILL); a paused one too."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                os.killpg(self.process.pid, signal.SIGCONT)  # a paused group acts on SIGTERM once continued
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass
        self._log.close()

    def __enter__(self) -> "ServerProcess":
        return self.wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()
