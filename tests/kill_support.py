"""SIGKILL from outside, at a random moment while work is in flight, and what must hold after.

``stop_in_flight`` freezes the run (``SIGSTOP``: the whole process group, or the parent
alone) at a moment drawn from a seeded generator, looks at the output as it is at that
moment, and tells whether the run was mid-way: neither where it started nor where a clean
run ends. Only then is the frozen process sent ``SIGKILL``: a kill at exactly the moment
that was looked at (a stopped process does nothing more), so each kill is known to have
landed in flight. A moment too early resumes the run and draws a later one; a moment too
late (the run had finished) is a miss, and the caller starts again with a fresh run.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from conftest import note_for_summary, schema_errors, stable_bytes

from pipeline.run.db import dump_state
from pipeline.run.feed import read_feed

STATE_DIR = ".chunkyard"
PR_SET_CHILD_SUBREAPER = 36  #: prctl(2)
#: Kills per phase scale with ``CHUNKYARD_KILLS`` (a factor; 1 by default, e.g. 5 for a long run).
SCALE = float(os.environ.get("CHUNKYARD_KILLS", "1"))
#: The seed every phase draws its moments from: ``CHUNKYARD_KILL_SEED`` (conftest draws one
#: when it is not set, and pytest's header prints it).
SEED = int(os.environ.get("CHUNKYARD_KILL_SEED") or random.SystemRandom().randrange(2**32))


def kills(default: int) -> int:
    return max(1, round(default * SCALE))


def chunk_view(out: Path) -> dict[str, bytes]:
    """The visible chunk files (``doc_*.json``, temp files aside) as stable bytes."""
    files = {}
    for path in out.rglob("doc_*.json"):
        rel = path.relative_to(out).as_posix()
        if not rel.startswith(STATE_DIR + "/"):
            files[rel] = stable_bytes(path.read_bytes())
    return files


def state_view(out: Path) -> dict[str, Any] | None:
    """The state's documents, redirects and in-flight marker (None before a state exists)."""
    if not (out / STATE_DIR).is_dir():
        return None
    try:
        state = dump_state(out)
    except Exception:  # noqa: BLE001 # not created yet (a first run before its first commit)
        return None
    return {"docs": state["docs"], "redirects": state["redirects"], "inflight": state["inflight"]}


def output_view(out: Path) -> tuple[dict[str, bytes], dict[str, Any] | None]:
    return chunk_view(out), state_view(out)


def loader_view(out: Path) -> dict[str, tuple[str, str]]:
    """What a loader that replayed the whole change feed holds: id → (chunk_id, hash)."""
    store: dict[str, tuple[str, str]] = {}
    for line in read_feed(out, 0):
        e = line.event
        if e["event"] == "ingest.write":
            store[e["id"]] = (e["chunk_id"], e["hash"])
        elif e["event"] == "ingest.delete":
            store.pop(e["id"], None)
    return store


def output_truth(out: Path) -> dict[str, tuple[str, str]]:
    truth = {}
    for path in out.rglob("doc_*.json"):
        if not path.relative_to(out).as_posix().startswith(STATE_DIR + "/"):
            rec = orjson.loads(path.read_bytes())
            truth[rec["id"]] = (rec["chunk_id"], rec["hash"])
    return truth


def raw_files(out: Path) -> dict[str, bytes]:
    """The visible chunk files (``doc_*.json``, temp files aside) as they are on disk."""
    files = {}
    for path in out.rglob("doc_*.json"):
        rel = path.relative_to(out).as_posix()
        if not rel.startswith(STATE_DIR + "/"):
            files[rel] = path.read_bytes()
    return files


def assert_whole(out: Path, known_good: set[bytes], where: str) -> int:
    """Every visible chunk file parses and passes the schema (files equal, but for the two
    volatile stamps, to a clean run's were checked once); returns how many were checked here."""
    checked = 0
    for rel, data in raw_files(out).items():
        if stable_bytes(data) in known_good:
            continue
        try:
            record = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise AssertionError(f"{where}: {rel} is not whole JSON after the kill: {exc}") from exc
        errors = schema_errors(record)
        assert not errors, f"{where}: {rel} fails the schema after the kill: {errors[:2]}"
        checked += 1
    return checked


def good_files(out: Path) -> set[bytes]:
    """A clean run's chunk files (stable bytes), each checked against the schema once."""
    files = raw_files(out)
    for rel, data in files.items():
        assert not schema_errors(orjson.loads(data)), f"the clean run's {rel} fails the schema"
    return {stable_bytes(data) for data in files.values()}


@dataclass
class Tally:
    """Kills that landed in flight, and the moments that came too late (misses), per phase."""

    phase: str
    landed: int = 0
    misses: int = 0
    resumed: int = 0
    mid_commit: int = 0  #: index kills that froze the writer inside its commit
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        return (
            f"kill phase {self.phase}: {self.landed} SIGKILLs landed in flight and converged "
            f"({self.misses} moments too late, {self.resumed} too early resumed, {self.mid_commit} inside "
            f"a commit; seed {SEED}; "
            f"{time.monotonic() - self.started:.1f} s)"
        )


def report(tally: Tally) -> None:
    """The phase's closing line: printed, and kept for the suite's summary (conftest)."""
    print("\n" + tally.line())
    note_for_summary("kills", [tally.phase, tally.landed, tally.line()])


def freeze(proc: subprocess.Popen[Any], group: bool, sig: signal.Signals) -> None:
    if group:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)


def wait_thawed(proc: subprocess.Popen[Any], group: bool, timeout: float) -> None:
    """``proc.wait``, sending SIGCONT again every half second until it exits.

    A run started through ``nsenter --pid`` (the Ray phase) has nsenter as its parent, and
    nsenter does job control: when it finds its child stopped it stops itself, and goes on
    only when continued. Frozen and thawed together, nsenter can read the child's stop after
    the thaw and stop itself for good: the run ends, nsenter never does. A later SIGCONT
    lets it reap the child and exit.
    """
    end = time.monotonic() + timeout
    while True:
        try:
            proc.wait(timeout=min(0.5, max(0.0, end - time.monotonic())))
            return
        except subprocess.TimeoutExpired:
            if time.monotonic() >= end:
                raise
            with contextlib.suppress(ProcessLookupError):
                freeze(proc, group, signal.SIGCONT)


def stop_in_flight(
    proc: subprocess.Popen[Any],
    rng: random.Random,
    in_flight: Callable[[], str],
    *,
    group: bool,
    first: float,
    step: float,
    tally: Tally,
    deadline: float = 240.0,
    started: Callable[[], bool] | None = None,
    exits: bool = True,
) -> bool:
    """Freeze ``proc`` at random moments until one is in flight, then SIGKILL it there.

    ``in_flight()`` looks at the frozen output: "before" (nothing done yet: resume, try later),
    "done" (a clean end: a miss) or "flight". ``first`` bounds the first wait, ``step`` the
    next ones; ``started``, when given, is polled first and the wait counts from when it
    holds. True when the kill landed in flight (the process and, with ``group``, its
    workers are dead); False on a miss (the run was let finish). ``exits=False`` (``watch``,
    which runs on): a miss returns at once, for the caller to stop it.
    """
    end = time.monotonic() + deadline
    while started is not None and not started() and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.002)  # the work begins (a lock taken): the random wait counts from there
    time.sleep(rng.uniform(0, first))
    while time.monotonic() < end:
        if proc.poll() is not None:
            tally.misses += 1
            return False
        freeze(proc, group, signal.SIGSTOP)
        where = in_flight()
        if where == "flight":
            freeze(proc, group, signal.SIGKILL)
            proc.wait()
            assert proc.returncode == -signal.SIGKILL, f"exit {proc.returncode}, not the kill"
            return True
        freeze(proc, group, signal.SIGCONT)
        if where == "done":
            tally.misses += 1
            if not exits:
                return False
            wait_thawed(proc, group, deadline)
            return False
        tally.resumed += 1
        time.sleep(rng.uniform(0, step))
    raise AssertionError(f"{tally.phase}: no moment in flight within {deadline} s")


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """Make this process the reaper of orphans (``PR_SET_CHILD_SUBREAPER``) for a while: the
    workers of a killed parent become our children, so their end can be waited for."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0, os.strerror(ctypes.get_errno())
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def wait_group_gone(pgid: int, timeout: float = 60.0) -> None:
    """After the parent alone was killed (under ``subreaper``): its workers, now our children,
    must end on their own, never outliving the run; each is reaped here."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return  # none left in the group
        if pid == 0:
            time.sleep(0.01)
    os.killpg(pgid, signal.SIGKILL)
    raise AssertionError(f"a worker outlived its killed parent by {timeout} s (process group {pgid})")


#: Run in a fresh interpreter by ``sync_killed_at``: each named function is replaced by one that
#: SIGKILLs its own process, then one ``Session.sync`` runs. Nothing after the kill runs: no
#: ``finally``, no ``Session.__exit__``, no lock released, no database closed.
_KILLED_AT = """
import importlib, json, os, signal, sys
spec = json.loads(sys.argv[1])
def die(*_a, **_k):
    os.kill(os.getpid(), signal.SIGKILL)
for target in spec["at"]:
    owner, _, name = target.rpartition(".")
    try:
        obj = importlib.import_module(owner)
    except ModuleNotFoundError:  # a class attribute: module.Class.method
        module, _, cls = owner.rpartition(".")
        obj = getattr(importlib.import_module(module), cls)
    assert hasattr(obj, name), target
    setattr(obj, name, die)
from pipeline.models import Policy
from pipeline.run.ingest import Options, Session
policy = Policy(**spec["policy"])
from pathlib import Path
with Session(Options(corpus=Path(spec["corpus"]), out=Path(spec["out"]), policy=policy, jobs=1)) as session:
    session.sync()
print("the run was not killed")
"""


def sync_killed_at(corpus: Path, out: Path, *targets: str, **policy: Any) -> None:
    """One ``Session.sync`` of ``corpus`` into ``out`` in a subprocess that is SIGKILLed the moment
    it calls any of ``targets`` (``"pipeline.run.ingest.fold"``, ``"pipeline.run.ingest.Session._x"``)."""
    import json
    import sys

    spec = json.dumps({"at": targets, "corpus": str(corpus), "out": str(out), "policy": policy})
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_AT, spec], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == -signal.SIGKILL, (
        f"not killed at {targets}: exit {proc.returncode}\n{proc.stdout}{proc.stderr[-2000:]}"
    )
