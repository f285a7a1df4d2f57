"""``index --device cpu|cuda|auto`` and the executor options, checked on this machine (issue 30).

Where no GPU is present (here, and in CI), ``--device cuda`` must stop before any work with
exit 2 and the reason, and ``--device auto`` must index on the CPU and say so. Where a GPU
is present, the first two tests check the other way round: cuda is accepted by ``st:``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import UsageError
from pipeline.index.device import kind_of, no_gpu_reason, resolve_device, visible_gpus

pytest.importorskip("sqlite_vec", reason="the index extra is not installed (pip install -e '.[index]')")

BIN = Path(sys.executable).parent
SAMPLE = Path(__file__).resolve().parents[1] / "corpus"


@pytest.fixture(scope="module")
def chunks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A chunk folder of two sample documents, not indexed."""
    root = tmp_path_factory.mktemp("device")
    corpus = root / "corpus"
    corpus.mkdir()
    for path in sorted(SAMPLE.rglob("*.md"))[:2]:
        shutil.copy2(path, corpus / path.name)
    run = subprocess.run(
        [str(BIN / "chunkyard"), "ingest", str(corpus), "--out", str(root / "chunks"), "--quiet"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    return root / "chunks"


def chunkyard_index(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "chunkyard"), "index", "--out", str(out), *args],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "300"},
    )


needs_no_gpu = pytest.mark.skipif(visible_gpus() > 0, reason="a GPU is present: the no-GPU paths cannot be seen")


@needs_no_gpu
def test_cuda_without_a_gpu_says_so_and_exits_2(chunks: Path, tmp_path: Path) -> None:
    out = shutil.copytree(chunks, tmp_path / "chunks")
    run = chunkyard_index(out, "--device", "cuda", "--json")
    assert run.returncode == 2, run.stderr
    error = json.loads(run.stdout)
    assert error["ok"] is False and "--device cuda: no NVIDIA GPU on this machine" in error["error"]
    assert "hint: use --device cpu" in error["error"]
    assert not (out / ".chunkyard" / "index.sqlite").exists()  # refused before any work


@needs_no_gpu
def test_auto_without_a_gpu_indexes_on_the_cpu_and_says_so(chunks: Path, tmp_path: Path) -> None:
    out = shutil.copytree(chunks, tmp_path / "chunks")
    run = chunkyard_index(out, "--device", "auto", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["embedded"] == report["chunks"] > 0
    assert "--device auto: embedding on the CPU: no NVIDIA GPU on this machine" in run.stderr
    plain = chunkyard_index(shutil.copytree(chunks, tmp_path / "plain"), "--json")
    assert json.loads(plain.stdout)["index_hash"] == report["index_hash"]  # the CPU index, the same


def test_device_rules_per_embedder(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [kind_of(s) for s in (None, "default", "st:x", "openai:m@http://h/v1")] == [
        "onnx",
        "onnx",
        "st",
        "openai",
    ]
    assert resolve_device("cpu", "openai:m@http://h/v1") == "cpu"
    notes: list[str] = []
    assert resolve_device("auto", "openai:m@http://h/v1", notes.append) == "cpu"
    said = "--device auto: embedding on the CPU: the openai: embedder runs on its server's hardware"
    assert notes == [f"{said}; --device does not apply to it"]
    with pytest.raises(UsageError, match="--device 'tpu': choose one of cpu, cuda, auto"):
        resolve_device("tpu", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a Ray actor without --num-gpus sees none
    assert visible_gpus() == 0
    assert "no GPU is visible to this process (CUDA_VISIBLE_DEVICES='')" in str(no_gpu_reason("onnx"))
    with pytest.raises(UsageError, match="--device cuda: no GPU is visible"):
        resolve_device("cuda", "default")


@pytest.mark.parametrize(
    "args",
    [["--actors", "2"], ["--address", "127.0.0.1:1"], ["--num-gpus", "1"], ["--cpus-per-actor", "2"]],
)
def test_ray_options_need_the_ray_executor(chunks: Path, args: list[str]) -> None:
    run = chunkyard_index(chunks, *args)
    assert run.returncode == 2 and "need --executor ray" in run.stderr


def test_an_unknown_executor_or_device_is_a_usage_error(chunks: Path) -> None:
    assert "--executor 'spark': choose one of local, ray" in chunkyard_index(chunks, "--executor", "spark").stderr
    run = chunkyard_index(chunks, "--device", "tpu")
    assert run.returncode == 2 and "--device 'tpu': choose one of cpu, cuda, auto" in run.stderr
