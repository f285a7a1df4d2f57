"""``make bench``: chunkyard's whole pipeline against mistletoe, LangChain and Chonkie.

    python bench/run.py [--corpora eips,rust-book,powershell-docs | all] [--runs 3] [--jobs 1,2]

The chosen corpora (from ``../shared/corpora``) are linked side by side into one
folder, so each tool sees one corpus of the same files. Then:

- chunkyard, per ``--jobs`` value: ``chunkyard ingest CORPUS --out FRESH --full
  --jobs N --target-tokens 512 --json`` as a subprocess into a fresh output folder each run, so
  process start, tokenizer load, schema check and file writes are all timed.
  Peak RSS is the largest resident set of any process of the run (``wait4``);
  tree PSS is the sampled peak of the proportional set size summed over the
  process tree (forked workers share pages with their parent; PSS splits them).
- baselines, each in its own process with the files preloaded (``bench/peers.py``):
  mistletoe's ``Document()`` alone; and, when ``pip install .[bench]`` put them
  there, LangChain and Chonkie at the same 512-token target.

The tools take turns, one run each per round (``--runs`` rounds after a warm-up round
for chunkyard; each peer warms up in its own process before its timed pass), so a
machine that slows down for a while slows them all; the table shows medians
of wall seconds and of CPU seconds (user + system, workers included): on a busy
machine the CPU seconds say more. Output folders go under ``--scratch`` (default
``bench/results/``, where a real ``chunks/`` would be); they are synced to disk after
each run and kept until the next benchmark, which removes them and waits for the disk to
settle before it times anything (see ``settle``). Results are
written to ``bench/results/`` as JSON (and the table as Markdown).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_CORPORA = "eips,rust-book,powershell-docs"
STAGES = ("read", "normalize", "parse", "sections", "split", "tokenize", "mint", "schema", "write")
#: The issue's goals: (ratio, at least this much).
GOALS = (
    ("jobs=cores vs LangChain", 1.2),
    ("jobs=1 vs mistletoe parse-only", 0.67),
    ("jobs=2 vs jobs=1", 1.7),
)
RSS_GOAL_MB = 500.0
#: Every tool chunks to this many tokens. chunkyard's default is 256 since 0.4.0: without
#: ``--target-tokens`` it made 37,264 chunks of the 18 MB corpus where the peers made theirs
#: at 512 (chunkyard at 512: 31,214), ~19 % more files, rows and records than it compared.
TARGET_TOKENS = 512


def documents(root: Path, names: list[str]) -> list[Path]:
    """Every ``*.md`` / ``*.markdown`` of the chosen corpora, as chunkyard discovers them."""
    sys.path.insert(0, str(REPO))
    from pipeline.run.discover import discover

    files: list[Path] = []
    for name in names:
        found, _ = discover(root / name)
        files.extend(Path(f.path) for f in found)
    return files


# -- memory -------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[1]) == pid:
            kids.append(int(entry.name))
    return kids


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            for line in fh:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class TreeSampler(threading.Thread):
    """Samples the summed PSS of a process and its descendants until stopped.

    Cheap, so as not to slow what it measures: the tree is re-read from ``/proc``
    once a second (workers are long-lived), the PSS of its members five times a second.
    """

    def __init__(self, pid: int, every: float = 0.2, rescan: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.pid, self.every, self.rescan, self.peak_kb = pid, every, rescan, 0
        self.done = threading.Event()

    def tree(self) -> list[int]:
        tree, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(_children(pid))
        return tree

    def run(self) -> None:
        tree, scanned = [self.pid], 0.0
        while not self.done.is_set():
            if time.monotonic() - scanned >= self.rescan:
                tree, scanned = self.tree(), time.monotonic()
            self.peak_kb = max(self.peak_kb, sum(_pss_kb(p) for p in tree))
            self.done.wait(self.every)


@dataclass
class Timed:
    """One subprocess run: wall and CPU seconds, memory, what it printed."""

    seconds: float
    cpu: float  #: user + system seconds of the process and the workers it waited for
    sys: float  #: the system part: file creation shows here
    rss_mb: float  #: the largest resident set of any one process of the tree
    pss_mb: float  #: the sampled peak of the tree's summed proportional set size
    stdout: str


def run_timed(cmd: list[str], *, sample: bool) -> Timed:
    """Run ``cmd`` to its end (killed if we are interrupted) and measure it."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=REPO)
        sampler = TreeSampler(proc.pid) if sample else None
        if sampler:
            sampler.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if sampler:
            sampler.done.set()
            sampler.join()
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode()
        if proc.returncode not in (0, 1):
            raise SystemExit(f"bench: {' '.join(cmd)} exited {proc.returncode}:\n{err.read().decode()}")
    peak_pss = sampler.peak_kb / 1024 if sampler else 0.0
    cpu = usage.ru_utime + usage.ru_stime
    return Timed(seconds, cpu, usage.ru_stime, usage.ru_maxrss / 1024, peak_pss, stdout)


# -- the tools ----------------------------------------------------------------------------


def chunkyard_cmd() -> list[str]:
    script = Path(sys.executable).with_name("chunkyard")
    return [str(script)] if script.exists() else [sys.executable, "-m", "pipeline"]


#: A file created in this many µs or less: a quiet disk (see ``create_cost_us``).
QUIET_US = 80.0


def create_cost_us(scratch: Path, folders: int = 60, files: int = 10) -> float:
    """Microseconds to create a small file beside the outputs, right now (wall, kernel-bound).

    On ext4 without a journal this jumps from ~20-50 to ~500-900 for minutes after many
    files were deleted (the allocator steps over recently freed inodes): a run with a high
    figure spent its ``write`` stage waiting on that, not on chunkyard. The files go into
    many new folders, as chunk files do: new folders spread over the disk's inode groups,
    and one folder alone can land in a group that is quiet while the others are not.
    """
    top = Path(tempfile.mkdtemp(prefix="probe-", dir=scratch))
    started = time.perf_counter()
    for d in range(folders):
        folder = top / f"d{d}"
        folder.mkdir()
        for k in range(files):
            fd = os.open(folder / f"p{k}.json", os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, b"{}" * 1000)
            os.close(fd)
    return (time.perf_counter() - started) / (folders * files) * 1e6


#: ext4 without a journal does not reuse an inode freed less than this many seconds ago
#: (``recently_deleted`` in fs/ext4/ialloc.c: 60 s, plus 300 s while the inode table
#: block is dirty); it reads the inode of each one it steps over to find that out. The
#: sync does not make 60 s enough here: a chunkyard run 2.7 min after 250 000 deletes
#: (synced) spent 1.7-2.4 s of system time writing its files, against 0.64-0.71 s at 6.4 min.
RECENTLY_DELETED_S = 360.0


def link_corpus(scratch: Path, root: Path, names: list[str], files: list[str]) -> tuple[Path, Path]:
    """``scratch/corpus`` holding a link to each named corpus under ``root``, and
    ``scratch/files.txt`` listing ``files`` (the peers read the same documents)."""
    corpus = scratch / "corpus"
    corpus.mkdir()
    for name in names:
        (corpus / name).symlink_to((root / name).resolve(), target_is_directory=True)
    file_list = scratch / "files.txt"
    file_list.write_text("".join(f"{f}\n" for f in files), encoding="utf-8")
    return corpus, file_list


def wait_out_deletes() -> None:
    """After a big delete: flush it (the inode tables are clean then) and wait out ext4's window.

    Measured here, two workers that created chunk files 30 s after 250 000 files were
    deleted spent 4-5 s of system time in their ``write`` stage instead of ~1.4 s, while
    the single-process ``create_cost_us`` probe already looked quiet; and one process,
    2.7 minutes after, still 2-3x its system time (see ``RECENTLY_DELETED_S``).
    """
    deleted = time.monotonic()
    os.sync()
    left = deleted + RECENTLY_DELETED_S + 5 - time.monotonic()
    if left > 0:
        print(f"  waiting {left:.0f} s until the deleted inodes may be reused (ext4)", flush=True)
        time.sleep(left)


def settle(scratch: Path, limit: float = 600.0) -> float:
    """Wait (up to ``limit`` seconds) until creating files costs what it does on a quiet disk."""
    started = time.monotonic()
    while (cost := create_cost_us(scratch)) > QUIET_US and time.monotonic() - started < limit:
        print(f"  waiting for the disk to settle: a file costs {cost:.0f} µs to create", flush=True)
        time.sleep(20)
    return cost


def compile_bytecode() -> int:
    """Compile chunkyard's modules to bytecode, as installing a wheel does; returns how many.

    Each timed ``chunkyard`` is a new process: with ``PYTHONDONTWRITEBYTECODE`` set (it is on
    the machines this runs on) and no ``__pycache__`` beside the sources of an editable install,
    every run compiled its ~40 modules from source before the first fork: 50-80 ms of CPU
    (``import pipeline.cli.app`` and the worker's modules: 200-215 ms without bytecode, 135-160
    ms with it) that an installed copy never spends, and the peers, loaded from their installed
    bytecode and timed in memory, do not either. Written whatever that variable says.
    """
    import compileall

    package = REPO / "pipeline"
    compileall.compile_dir(package, quiet=1)
    return sum(1 for _ in package.rglob("__pycache__/*.pyc"))


def chunkyard_once(
    corpus: Path, jobs: int, scratch: Path, label: str, command: list[str] | None = None
) -> dict[str, Any]:
    """One ``chunkyard ingest --full`` into a fresh folder, timed from process start to exit.

    ``command`` runs another checkout's chunkyard (``bench/old_vs_new.py``); default: this one's.
    """
    create_us = create_cost_us(scratch)
    out = Path(tempfile.mkdtemp(prefix=f"out-j{jobs}-", dir=scratch))
    cmd = [*(command or chunkyard_cmd()), "ingest", str(corpus), "--out", str(out)]
    cmd += ["--full", "--jobs", str(jobs), "--target-tokens", str(TARGET_TOKENS), "--json", "--quiet"]
    timed = run_timed(cmd, sample=True)
    # The output stays (until the next benchmark, see ``main``): on ext4 without a journal (this
    # machine's disk) a file created within minutes of many deletes pays for them, since
    # the inode allocator steps over every recently freed inode (``recently_deleted``),
    # and 30 000 of them made each chunk file cost ~0.7 ms of kernel time instead of ~0.05.
    os.sync()  # nor may this run's dirty pages be flushed on the next run's time
    summary = json.loads(timed.stdout)
    if summary["failed"]:
        print(f"  warning: {summary['failed']} documents failed", file=sys.stderr)
    print(
        f"  chunkyard jobs={jobs} {label}: {timed.seconds:.2f} s, cpu {timed.cpu:.2f} s "
        f"(system {timed.sys:.2f} s; creating a file took {create_us:.0f} µs just before)",
        flush=True,
    )
    return {
        "seconds": timed.seconds,
        "cpu": timed.cpu,
        "sys": timed.sys,
        "rss_mb": timed.rss_mb,
        "pss_mb": timed.pss_mb,
        "documents": summary["documents"],
        "chunks": summary["chunks"],
        "bytes": summary["bytes"],
        "internal_seconds": summary["seconds"],
        "stage_seconds": summary.get("stage_seconds", {}),
        "create_us": create_us,
        "out": str(out),
    }


def chunkyard_row(jobs: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    stages = {s: statistics.median(r["stage_seconds"].get(s, 0.0) for r in rows) for s in STAGES}
    return {
        "tool": f"chunkyard jobs={jobs}",
        "jobs": jobs,
        "documents": rows[0]["documents"],
        "chunks": rows[0]["chunks"],
        "seconds": statistics.median(r["seconds"] for r in rows),
        "cpu": statistics.median(r["cpu"] for r in rows),
        "internal_seconds": statistics.median(r["internal_seconds"] for r in rows),
        "rss_mb": max(r["rss_mb"] for r in rows),
        "pss_mb": max(r["pss_mb"] for r in rows),
        "stage_seconds": stages,
        "create_us": statistics.median(r["create_us"] for r in rows),
        "runs": rows,
    }


def peer_available(tool: str) -> bool:
    needs = {"langchain": "langchain_text_splitters", "chonkie": "chonkie", "mistletoe": "mistletoe"}[tool]
    if importlib.util.find_spec(needs) is None:
        print(f"  {tool}: not installed (pip install '.[bench]'); skipped", file=sys.stderr)
        return False
    return True


def peer_once(tool: str, file_list: Path, label: str) -> dict[str, Any]:
    """One timed pass of a peer over the preloaded files, after a warm-up pass in its process."""
    cmd = [sys.executable, str(HERE / "peers.py"), tool, str(file_list), "--runs", "1"]
    cmd += ["--target", str(TARGET_TOKENS)]
    timed = run_timed(cmd, sample=False)
    result = json.loads(timed.stdout)
    print(f"  {tool} {label}: {result['seconds'][0]:.2f} s", flush=True)
    return {"seconds": result["seconds"][0], "cpu": result["cpu"][0], "chunks": result["chunks"], "rss_mb": timed.rss_mb}


def peer_row(tool: str, rows: list[dict[str, Any]], n_docs: int) -> dict[str, Any]:
    return {
        "tool": tool,
        "jobs": 1,
        "documents": n_docs,
        "chunks": rows[0]["chunks"] or None,
        "seconds": statistics.median(r["seconds"] for r in rows),
        "cpu": statistics.median(r["cpu"] for r in rows),
        "rss_mb": max(r["rss_mb"] for r in rows),
        "pss_mb": None,
        "runs": [r["seconds"] for r in rows],
    }


# -- the report ---------------------------------------------------------------------------


def table(rows: list[dict[str, Any]], mb: float) -> str:
    head = (
        "| tool | jobs | docs | MB | chunks | s (median) | MB/s | MB/s per core | CPU s | MB per CPU s "
        "| peak RSS MB | tree PSS MB |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        mbps = mb / r["seconds"]
        pss = f"{r['pss_mb']:.0f}" if r.get("pss_mb") else "–"
        lines.append(
            f"| {r['tool']} | {r['jobs']} | {r['documents']} | {mb:.2f} | {r['chunks'] or '–'} | "
            f"{r['seconds']:.2f} | {mbps:.2f} | {mbps / r['jobs']:.2f} | {r['cpu']:.2f} | {mb / r['cpu']:.2f} | "
            f"{r['rss_mb']:.0f} | {pss} |"
        )
    return "\n".join(lines)


def stage_table(rows: list[dict[str, Any]]) -> str:
    ours = [r for r in rows if "stage_seconds" in r]
    lines = ["| stage | " + " | ".join(r["tool"] for r in ours) + " |", "|---|" + "---|" * len(ours)]
    for stage in STAGES:
        cells = []
        for r in ours:
            total = sum(r["stage_seconds"].values()) or 1.0
            s = r["stage_seconds"][stage]
            cells.append(f"{s:.2f} s ({100 * s / total:.0f} %)")
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    lines.append(
        "| total in workers | " + " | ".join(f"{sum(r['stage_seconds'].values()):.2f} s" for r in ours) + " |"
    )
    lines.append(
        "| wall, in-process / whole | "
        + " | ".join(f"{r['internal_seconds']:.2f} / {r['seconds']:.2f} s" for r in ours)
        + " |"
    )
    return "\n".join(lines)


def _per_round(rows: list[dict[str, Any]], a: str, b: str) -> list[float]:
    """``b``'s seconds over ``a``'s, round by round (the two ran minutes apart at most)."""
    runs = {r["tool"]: [x["seconds"] if isinstance(x, dict) else x for x in r.get("runs") or ()] for r in rows}
    if not runs.get(a) or len(runs[a]) != len(runs.get(b) or ()):
        return []
    return [y / x for x, y in zip(runs[a], runs[b], strict=True)]


def check_line(c: dict[str, Any]) -> str:
    """One goal of ``ratios`` as a line of the report (never "1.20× … MISSED": more places then)."""
    rel = "<" if c.get("below") else "≥"
    places = 3 if not c["met"] and round(c["value"], 2) >= c["goal"] else 2
    fmt = f"{c['value']:.0f}" if c.get("below") else f"{c['value']:.{places}f}×"
    cpu = f"; per CPU second {c['cpu_value']:.2f}×" if c.get("cpu_value") else ""
    verdict = "ok" if c["met"] else "MISSED"
    per_round = ", ".join(f"{v:.2f}" for v in c.get("rounds", ()))
    rounds = f"; round by round {per_round}" if per_round else ""
    return f"- {c['ratio']}: **{fmt}** (goal {rel} {c['goal']}) {verdict}{cpu}{rounds}"


def ratios(rows: list[dict[str, Any]], mb: float, cores: int) -> list[dict[str, Any]]:
    by = {r["tool"]: mb / r["seconds"] for r in rows}
    by_cpu = {r["tool"]: mb / r["cpu"] for r in rows}
    pairs = {
        "jobs=cores vs LangChain": (f"chunkyard jobs={cores}", "langchain"),
        "jobs=1 vs mistletoe parse-only": ("chunkyard jobs=1", "mistletoe"),
        "jobs=2 vs jobs=1": ("chunkyard jobs=2", "chunkyard jobs=1"),
    }
    out = []
    for name, goal in GOALS:
        a, b = pairs[name]
        if a in by and b in by:
            value = by[a] / by[b]
            cpu = by_cpu[a] / by_cpu[b] if a != "chunkyard jobs=2" else None
            check = {"ratio": name, "value": value, "cpu_value": cpu, "goal": goal, "met": value >= goal}
            rounds = _per_round(rows, a, b)
            if rounds:  # the same ratio from the runs of each round: how far the machine moved
                check["rounds"] = rounds
            out.append(check)
    peak = max((r["rss_mb"] for r in rows if r["tool"].startswith("chunkyard")), default=0.0)
    pss = max((r["pss_mb"] or 0.0 for r in rows if r["tool"].startswith("chunkyard")), default=0.0)
    out.append(
        {
            "ratio": "peak RSS of any chunkyard process, MB",
            "value": peak,
            "goal": RSS_GOAL_MB,
            "met": peak < RSS_GOAL_MB,
            "below": True,
        }
    )
    out.append(
        {
            "ratio": "peak tree PSS of a chunkyard run, MB",
            "value": pss,
            "goal": RSS_GOAL_MB,
            "met": pss < RSS_GOAL_MB,
            "below": True,
        }
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", default=DEFAULT_CORPORA, help="comma-separated names, or 'all'")
    ap.add_argument("--root", type=Path, default=REPO.parent / "shared" / "corpora")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per tool, after one warm-up")
    cores = len(os.sched_getaffinity(0))
    ap.add_argument("--jobs", default=",".join(map(str, sorted({1, 2, cores}))))
    ap.add_argument("--no-peers", action="store_true", help="chunkyard only")
    ap.add_argument("--results", type=Path, default=HERE / "results")
    ap.add_argument(
        "--scratch",
        type=Path,
        default=HERE / "results",
        help="where the linked corpus and the fresh output folders go (default: beside the results, "
        "on the file system a real chunks/ folder would be on; on this VM new folders right under "
        "/tmp create files ~10x slower)",
    )
    args = ap.parse_args()

    if args.corpora == "all":
        names = sorted(p.name for p in args.root.iterdir() if p.is_dir())
    else:
        names = [n.strip() for n in args.corpora.split(",") if n.strip()]
    missing = [n for n in names if not (args.root / n).is_dir()]
    if missing:
        raise SystemExit(f"bench: no corpus {', '.join(missing)} under {args.root}")
    print(f"chunkyard's modules compiled to bytecode: {compile_bytecode()} files", flush=True)
    files = documents(args.root, names)
    size = sum(f.stat().st_size for f in files)
    mb = size / 1e6
    print(f"corpora: {', '.join(names)}: {len(files)} documents, {mb:.2f} MB; cores: {cores}", flush=True)
    load_before = os.getloadavg()[0]

    rows: list[dict[str, Any]] = []
    # The outputs of a run are kept until the next benchmark, which removes them first and
    # then waits for the disk to settle: deleting 100 000+ files slows every file created
    # in the next minutes (``create_cost_us``), so a benchmark that cleaned up after itself
    # would slow whatever ran next, and be slowed by the one before.
    scratch = args.scratch / "scratch"
    if scratch.exists():
        print(f"removing the previous benchmark's outputs ({scratch})", flush=True)
        shutil.rmtree(scratch)
        wait_out_deletes()
    scratch.mkdir(parents=True)
    print(f"  a file costs {settle(scratch):.0f} µs to create (quiet: ≤ {QUIET_US:.0f})", flush=True)
    corpus, file_list = link_corpus(scratch, args.root, names, files)
    # Round by round, every tool once per round: a machine that slows down for a while
    # (shared hosts do) slows every tool alike, so the ratios stay meaningful.
    job_counts = [int(j) for j in args.jobs.split(",")]
    peers = [t for t in (("mistletoe",) if args.no_peers else ("mistletoe", "langchain", "chonkie")) if peer_available(t)]
    ours: dict[int, list[dict[str, Any]]] = {j: [] for j in job_counts}
    theirs: dict[str, list[dict[str, Any]]] = {t: [] for t in peers}
    for round_ in range(args.runs + 1):
        label = "warm-up" if round_ == 0 else f"run {round_}"
        for jobs in job_counts:
            row = chunkyard_once(corpus, jobs, scratch, label)
            if round_:
                ours[jobs].append(row)
        if round_:  # a peer warms up inside its own process each time
            for tool in peers:
                theirs[tool].append(peer_once(tool, file_list, label))
    rows.extend(chunkyard_row(j, ours[j]) for j in job_counts)
    rows.extend(peer_row(t, theirs[t], len(files)) for t in peers)

    report = [
        f"\n## chunkyard bench: {', '.join(names)} ({len(files)} documents, {mb:.2f} MB)",
        (
            f"{platform.platform()}, Python {platform.python_version()}, {cores} cores; "
            f"medians of {args.runs} runs after a warm-up; load average {load_before:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after (other work on the machine slows wall times, and CPU seconds less so)\n"
        ),
        table(rows, mb),
        "\nTime per stage, summed over worker processes (median run):\n",
        stage_table(rows),
        "\nRatios (MB/s over MB/s, same run):\n",
    ]
    checks = ratios(rows, mb, cores)
    report.extend(check_line(c) for c in checks)
    probes = [r["create_us"] for r in rows if "create_us" in r]
    if probes:
        report.append(
            f"\nCreating an empty file beside the outputs took {min(probes):.0f}–{max(probes):.0f} µs "
            "just before the runs (median per tool); ~20–50 µs is a quiet disk. Much more means "
            "recently deleted files (ext4 without a journal steps over freed inodes), and the "
            "`write` stage and the chunkyard ratios pay for it: run again a few minutes later."
        )
    if any(r["tool"] == "chonkie" for r in rows):
        report.append("\nChonkie runs its default rules: its markdown recipe is on the HF hub, offline here.")
    text = "\n".join(report)
    print(text)

    args.results.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    data = {
        "when": stamp,
        "corpora": names,
        "documents": len(files),
        "bytes": size,
        "cores": cores,
        "runs": args.runs,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "rows": rows,
        "ratios": checks,
    }
    for name in (f"bench-{stamp}.json", "latest.json"):
        (args.results / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    (args.results / "latest.md").write_text(text + "\n", encoding="utf-8")
    print(f"\nwritten: {args.results / f'bench-{stamp}.json'}")


if __name__ == "__main__":
    main()
