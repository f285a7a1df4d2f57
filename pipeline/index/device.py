"""``--device cpu|cuda|auto``: where an in-process embedding model runs.

* ``cpu`` (the default): always.
* ``cuda``: the model runs on an NVIDIA GPU, or the run stops before any work with a
  ``UsageError`` (exit 2) that says why: no GPU visible here, or an embedder that cannot use one.
* ``auto``: the GPU when this embedder can use one here, else the CPU, and the user is told
  which and why (never silently).

Which embedders run on a GPU: ``st:NAME`` (sentence-transformers on torch, fp32; torch's
CUDA build sees the GPU). The offline default is an int8 graph quantised dynamically
(``DynamicQuantizeLinear`` + ``MatMulInteger``): ONNX Runtime's CUDA provider has no kernel
for the former, so on a GPU most of the graph would run on the CPU with copies between the
two, slower than the CPU alone. For a GPU use ``--embedder st:all-MiniLM-L6-v2`` (the fp32
weights of the same model; an index of its own, since its vectors differ slightly). The
``openai:`` embedder runs wherever its server runs: ``--device`` does not apply to it.

On a Ray cluster the device is resolved inside each actor, on its node (``--num-gpus``
gives an actor its GPU; Ray sets ``CUDA_VISIBLE_DEVICES`` for it).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

from pipeline.errors import UsageError

DEVICES = ("cpu", "cuda", "auto")

#: Where the NVIDIA driver lists the GPUs of this machine (one folder per GPU).
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")

GPU_HINT = "use --device cpu, or run where an NVIDIA GPU and its driver are present"


def kind_of(spec: str | None) -> str:
    """``onnx``, ``st`` or ``openai``: the family of an embedder spec (as ``make_embedder`` reads it)."""
    if spec and spec.startswith("st:"):
        return "st"
    if spec and spec.startswith("openai:"):
        return "openai"
    return "onnx"


def visible_gpus() -> int:
    """NVIDIA GPUs this process may use: the driver's list, narrowed by ``CUDA_VISIBLE_DEVICES``."""
    try:
        present = sum(1 for _ in NVIDIA_GPUS.iterdir())
    except OSError:
        present = 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    return min(present, len(ids))


def no_gpu_reason(kind: str) -> str | None:
    """Why embedder family ``kind`` cannot run on a GPU in this process, or ``None`` when it can."""
    if kind == "openai":
        return "the openai: embedder runs on its server's hardware; --device does not apply to it"
    if kind == "onnx":
        if visible_gpus() == 0:
            return _no_gpu_here()
        return (
            "the default int8 ONNX model does not run on a GPU (ONNX Runtime's CUDA provider has "
            "no kernel for its dynamic quantisation); use --embedder st:all-MiniLM-L6-v2 for the GPU"
        )
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (hint: pip install torch, then pip install 'chunkyard[st]')"
    torch = importlib.import_module("torch")
    if not torch.cuda.is_available():
        built = getattr(torch.version, "cuda", None)
        if not built:
            return f"this torch ({torch.__version__}) is a CPU build (hint: install torch's CUDA build)"
        return _no_gpu_here()
    return None


def _no_gpu_here() -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f"no GPU is visible to this process (CUDA_VISIBLE_DEVICES={visible!r})"
    return f"no NVIDIA GPU on this machine ({NVIDIA_GPUS} is absent)"


def resolve_device(device: str, spec: str | None, say: Callable[[str], None] | None = None) -> str:
    """``cpu`` or ``cuda`` for ``--device`` and the embedder ``spec``; see the module docstring.

    Raises:
        UsageError: ``cuda`` asked for where it cannot be had (exit 2), or an unknown device.
    """
    if device not in DEVICES:
        raise UsageError(f"--device {device!r}: choose one of {', '.join(DEVICES)}")
    if device == "cpu":
        return "cpu"
    reason = no_gpu_reason(kind_of(spec))
    if reason is None:
        return "cuda"
    if device == "cuda":
        raise UsageError(f"--device cuda: {reason} (hint: {GPU_HINT})")
    if say is not None:
        say(f"--device auto: embedding on the CPU: {reason}")
    return "cpu"
