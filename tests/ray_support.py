"""A real Ray cluster for tests, on loopback only, that cannot outlive the test.

Ray binds to the host's network address unless it has no other: so every Ray
process of a test runs inside a network namespace of the test's own that has only
``lo`` (``unshare --net``), and a PID namespace of its own (``--pid``) whose end ends
them all (never ``ray stop``, which kills by process name). Each cluster gets its
own temp dir, so no cluster record in Ray's default temp folder is ever joined, and
``RAY_AUTH_MODE=disabled`` for every process (Ray 2.60 turns token auth on by
default, and a second node then fails to join). See ../shared/research/distributed.md §2.

Commands run inside the namespace through ``nsenter``; the files they write are on
the host's file system (the mount namespace is a copy), so a test checks them from
outside, and watches them to act at an observed moment.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from conftest import require

BIN = Path(sys.executable).parent
HEAD_PORT = 6390
NODE_MANAGER_PORT = 6400  #: the head's raylet, then one up per node: how a test finds one to kill
OBJECT_STORE_BYTES = 100_000_000  #: per node; Ray would take 30 % of the machine's memory
ADDRESS = f"127.0.0.1:{HEAD_PORT}"

#: What every ``ray start`` of a test adds: one CPU, a capped object store, no usage stats.
FENCES = f"--num-cpus=1 --object-store-memory={OBJECT_STORE_BYTES} --disable-usage-stats"

#: For every process of the test cluster (the nodes and each driver).
RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    # a dead node is declared dead after ~3 s (default ~15 s): the node-kill test waits less
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    "COLUMNS": "300",
    "NO_COLOR": "1",
}


def unshare_problem() -> str | None:
    """Why a loopback-only namespace cannot be made here, or None when it can."""
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} not found (util-linux / iproute2)"
    try:
        probe = subprocess.run(
            ["unshare", "--net", "--pid", "--fork", "--mount-proc", "sh", "-c", "ip link set lo up"],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if probe.returncode != 0:
        return "unshare --net --pid is not permitted here (needs root, as in CI): " + (
            probe.stderr.strip() or f"exit {probe.returncode}"
        )
    return None


def skip_without_namespaces() -> None:
    """Skip (with the reason) where a test cluster cannot be fenced in; Ray never starts outside.

    Both are required parts (``conftest.require``): under ``CI=true`` a missing one fails.
    """
    require(
        "ray",
        None
        if importlib.util.find_spec("ray")
        else "the ray extra is not installed (pip install -e '.[ray]')",
    )
    problem = unshare_problem()
    require("netns", f"no Ray test cluster: {problem}" if problem else None)


@contextlib.contextmanager
def running_cluster(nodes: int = 2, hide: Path | None = None) -> Iterator[LoopbackCluster]:
    """A ``LoopbackCluster`` for the ``with`` block (the test skips, or fails under CI, without
    network namespaces), closed at its end."""
    skip_without_namespaces()
    c = LoopbackCluster(nodes, hide)
    try:
        yield c
    finally:
        c.close()


class LoopbackCluster:
    """A head node and ``nodes - 1`` more (one CPU each), inside a namespace with only loopback.

    ``hide`` is a folder the extra nodes must not see (an empty tmpfs is mounted over
    it for them): a node without the shared file system.
    """

    def __init__(self, nodes: int = 2, hide: Path | None = None) -> None:
        self.temp = Path(tempfile.mkdtemp(prefix="cy-ray-", dir="/tmp"))  # short: Ray's socket paths
        ray = BIN / "ray"
        common = FENCES
        lines = ["set -e", "ip link set lo up"]
        if nodes:  # none: the namespace only, for a test that starts Ray itself
            lines.append(
                f"{ray} start --head --port={HEAD_PORT} {common} --include-dashboard=false "
                f"--node-manager-port={NODE_MANAGER_PORT} --temp-dir={self.temp}/head > {self.temp}/head.log 2>&1"
            )
        for i in range(1, nodes):
            start = (
                f"{ray} start --address={ADDRESS} {common} --node-manager-port={NODE_MANAGER_PORT + i} "
                f"--temp-dir={self.temp}/node{i} > {self.temp}/node{i}.log 2>&1"
            )
            if hide is not None:  # this node gets a mount namespace of its own, the folder hidden
                start = f"unshare --mount sh -c 'mount -t tmpfs none {hide} && {start}'"
            lines.append(start)
        lines += ["echo ready", "exec sleep infinity"]  # pid 1 of the namespace: its end ends all
        self.proc = subprocess.Popen(
            [
                "unshare",
                "--net",
                "--pid",
                "--fork",
                "--mount-proc",
                "--kill-child",
                "bash",
                "-c",
                "\n".join(lines),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **RAY_ENV},
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - before any thread of a test starts Ray work
        )
        assert self.proc.stdout is not None
        said = self.proc.stdout.readline()  # blocks until the nodes are up, or the script failed
        if said.strip() != "ready":
            logs = "".join(p.read_text(errors="replace")[-2000:] for p in sorted(self.temp.glob("*.log")))
            self.close()
            raise RuntimeError(f"the test Ray cluster did not start: {said}{self.proc_output()}\n{logs}")
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        self.init_pid = int(children[0])  #: the namespace's pid 1, as the host sees it

    def proc_output(self) -> str:
        if self.proc.stdout is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            return self.proc.stdout.read() or ""
        return ""

    def command(self, args: Sequence[str], cwd: Path | None = None) -> list[str]:
        """``args`` as run inside the namespace (in ``cwd``, if given)."""
        wd = [f"--wd={cwd}"] if cwd is not None else []
        return ["nsenter", "--target", str(self.init_pid), "--net", "--pid", "--mount", *wd, "--", *args]

    def env(self) -> dict[str, str]:
        return {**os.environ, **RAY_ENV}

    def run(
        self, args: Sequence[str], timeout: float = 300, cwd: Path | None = None, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(args, cwd),
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**self.env(), **env},
        )

    def start(self, args: Sequence[str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env()
        )

    def chunkyard(self, *args: str) -> list[str]:
        """The command line of ``chunkyard ARGS --executor ray --address ADDRESS``."""
        return [str(BIN / "chunkyard"), *args, "--executor", "ray", "--address", ADDRESS]

    def raylet_pid(self, node: int = 1) -> int:
        """The host pid of node ``node``'s raylet (the head is 0), found by its port and temp dir."""
        port = f"--node_manager_port={NODE_MANAGER_PORT + node}"
        for pid in _pids():
            args = _cmdline(pid)
            if (
                args
                and args[0].endswith("raylet")
                and port in args
                and any(str(self.temp) in a for a in args)
            ):
                return pid
        raise LookupError(f"no raylet with {port} under {self.temp}")

    def kill_node(self, raylet: int) -> None:
        """A node crash: its raylet and every worker process of it, SIGKILLed (all started by this test).

        The raylet alone is not enough: a worker whose raylet died still finishes the task
        it runs and hands its result to the driver, so nothing would be retried.
        """
        workers = [pid for pid in _pids() if _ppid(pid) == raylet]
        os.kill(raylet, signal.SIGKILL)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def freeze_mid_task(self, raylet: int) -> bool:
        """SIGSTOP every worker of that raylet; True when one of them is frozen inside a task.

        A worker seen busy may finish its task before a kill lands, and then nothing is
        left to retry. A frozen worker cannot report its result, so a task still in its
        title after the freeze is one the node's death must make Ray run again. When none
        is, the workers are resumed and False says to look again.
        """
        workers = [pid for pid in _pids() if _ppid(pid) == raylet]
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        if self.busy_workers(raylet):
            return True
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        return False

    def driver_log(self) -> str:
        """What Ray's core logged in the drivers that ran on the head (task retries among it)."""
        logs = sorted((self.temp / "head").glob("session_*/logs/python-core-driver-*.log"))
        return "".join(p.read_text(errors="replace") for p in logs)

    def busy_workers(self, raylet: int) -> list[int]:
        """The worker processes of that raylet running a chunkyard task now (Ray retitles them)."""
        return [
            pid for pid in _pids() if _ppid(pid) == raylet and "ray::run_batch" in " ".join(_cmdline(pid))
        ]

    def close(self) -> None:
        """End the namespace: its pid 1 killed, the kernel kills every process in it."""
        with contextlib.suppress(AttributeError, ProcessLookupError, PermissionError):
            os.kill(self.init_pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        shutil.rmtree(self.temp, ignore_errors=True)


def _die_with_parent() -> None:
    """In ``unshare``, before it runs: SIGKILL it when the test process dies, whatever way.

    ``--kill-child`` then takes its child, the namespace's pid 1, and with it every Ray
    process: a test killed before its ``close`` leaves no cluster behind.
    """
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])
