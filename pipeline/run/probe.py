"""Before a Ray run: does every node see the corpus and the output where this machine does?

chunkyard on a cluster needs one file system for all: a task reads its documents and
writes their chunk files at the paths the parent gave it. A node that mounts the
output elsewhere, or not at all, would write chunk files nobody reads, and the
state would name files that are not there. So, before the first document goes
out, one probe task per node (pinned to it) checks both ways:

- the parent's probe file, written just before, is there for the node with its content;
- a document of the corpus is readable from the node;
- a probe file the node writes into the output is there for the parent.

It also checks that the node runs the same chunkyard (a mix of versions would write
a mix of chunk files). Each failure is a ``UsageError`` naming the node and the fix.
The probe files live in the state folder (``CHUNKS/.chunkyard/``) for the moment
of the check, and are removed after it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sys
from pathlib import Path
from typing import Any

from pipeline.errors import UsageError
from pipeline.run.state import STATE_DIR

#: Seconds the nodes have to answer the probe (a busy cluster may queue it a while).
PROBE_TIMEOUT = 120.0

_SHARED_HINT = (
    "hint: corpus and output must be on a file system every node mounts at the same path "
    "(NFS, a cluster file system); mount it there, or run with --executor local"
)


def look_from_node(parent_probe: str, token: str, sample: str, node_probe: str) -> dict[str, Any]:
    """Runs on one node: what it sees of the parent's files, and a probe file of its own."""
    from pipeline._version import __version__

    problems: list[str] = []
    try:
        with open(parent_probe, encoding="utf-8") as fh:
            if fh.read() != token:
                problems.append(f"{parent_probe}: holds another run's probe")
    except OSError as exc:
        problems.append(f"{parent_probe}: the output is not visible ({exc.strerror or exc})")
    try:
        with open(sample, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        problems.append(f"{sample}: the corpus is not readable ({exc.strerror or exc})")
    wrote = False
    if not problems:
        try:
            with open(node_probe, "w", encoding="utf-8") as fh:
                fh.write(token)
            wrote = True
        except OSError as exc:
            problems.append(f"{node_probe}: the output is not writable ({exc.strerror or exc})")
    return {
        "host": socket.gethostname(),
        "version": __version__,
        "python": ".".join(map(str, sys.version_info[:3])),
        "problems": problems,
        "wrote": wrote,
    }


def check_shared(ray: Any, out: Path, corpus: Path, sample: str) -> None:
    """Check on every node with CPUs that ``out`` and ``corpus`` are shared; raise ``UsageError`` if not.

    ``sample`` is one document of the corpus (absolute path) for the nodes to read.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from pipeline._version import __version__

    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    if not nodes:
        raise UsageError(
            "--executor ray: the Ray cluster has no node with a CPU (hint: `ray status` shows it)"
        )
    token = secrets.token_hex(8)  # only in files removed below: nothing of it reaches the output
    state = out / STATE_DIR
    parent_probe = state / f"probe-{token}"
    node_probes = {n["NodeID"]: state / f"probe-{token}-{n['NodeID'][:12]}" for n in nodes}
    look = ray.remote(num_cpus=0, max_retries=0)(look_from_node)
    try:
        parent_probe.write_text(token, encoding="utf-8")
        refs = {
            look.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
                str(parent_probe), token, sample, str(node_probes[n["NodeID"]])
            ): n
            for n in nodes
        }
        for ref, node in refs.items():
            where = f"Ray node {node.get('NodeManagerAddress', '?')} ({node['NodeID'][:12]})"
            try:
                seen = ray.get(ref, timeout=PROBE_TIMEOUT)
            except ray.exceptions.GetTimeoutError:
                raise UsageError(
                    f"--executor ray: {where} did not answer the file system probe in {PROBE_TIMEOUT:g} s "
                    "(hint: `ray status`; a node busy with other jobs may need a free moment)"
                ) from None
            except ray.exceptions.RayError as exc:
                first = (str(exc).strip().splitlines() or [""])[-1][:300]
                raise UsageError(
                    f"--executor ray: {where} cannot run chunkyard's tasks: {first} "
                    "(hint: install the same chunkyard, with its ray extra, in the Python every node runs)"
                ) from None
            if seen["version"] != __version__:
                raise UsageError(
                    f"--executor ray: {where} runs chunkyard {seen['version']}, this machine {__version__} "
                    "(hint: install the same chunkyard on every node)"
                )
            problems = list(seen["problems"])
            if seen["wrote"] and not _holds(node_probes[node["NodeID"]], token):
                problems.append(f"{node_probes[node['NodeID']]}: written there, not visible here")
            if problems:
                raise UsageError(
                    f"--executor ray: {where}, host {seen['host']}: {'; '.join(problems)} ({_SHARED_HINT})"
                )
    finally:
        for path in (parent_probe, *node_probes.values()):
            with contextlib.suppress(OSError):
                os.unlink(path)


def _holds(path: Path, token: str) -> bool:
    try:
        return path.read_text(encoding="utf-8") == token
    except OSError:
        return False
