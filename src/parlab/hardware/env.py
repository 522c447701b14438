"""Environment snapshot: what the machine is, for every contract document.

- software: Python, torch, CUDA, NCCL and parlab versions;
- GPUs: name, memory, compute capability (through torch.cuda);
- interconnect: the GPU-to-GPU matrix. NVML (nvidia-ml-py) gives per-pair
  NVLink counts where it is installed; otherwise ``nvidia-smi topo -m`` gives
  the matrix (``NV18``, ``PIX``, ``SYS``, ...). Link counts times the per-link
  speed (``nvidia-smi nvlink -s``, else the catalog) give per-direction
  bandwidth, e.g. 18 x 26.562 GB/s = 478 GB/s;
- CPU count and model; the NCCL_*, TORCH_* and PYTORCH_* (the caching allocator's
  PYTORCH_CUDA_ALLOC_CONF) variables set.

Nothing here starts a process group. With no GPU the snapshot says so.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from typing import Any

import parlab
from parlab.hardware import catalog

_VAR_PREFIXES = (
    "NCCL_",
    "TORCH_",
    "PYTORCH_",
    "CUDA_VISIBLE_DEVICES",
    "NVSHMEM_",
    "OMP_NUM_THREADS",
)


def _light_software() -> dict[str, Any]:
    """Versions from the installed packages' metadata, without importing torch (a second of
    start-up the analytic commands do not need); CUDA and NCCL are then unknown."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return {
        "python": platform.python_version(),
        "torch": torch_version,
        "cuda": None,
        "nccl": None,
        "parlab": parlab.__version__,
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
    }


def _light_gpus() -> list[dict[str, Any]]:
    """The GPUs as ``nvidia-smi`` lists them (none where it is absent), without torch."""
    out = _run(
        [
            "nvidia-smi",
            "--query-gpu=index,name,memory.total,compute_cap",
            "--format=csv,noheader,nounits",
        ]
    )
    gpus_: list[dict[str, Any]] = []
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[0].isdecimal() or not parts[2].isdecimal():
            continue
        spec = catalog.lookup(parts[1])
        gpus_.append(
            {
                "index": int(parts[0]),
                "name": parts[1],
                "memory_bytes": int(parts[2]) * 2**20,
                "compute_capability": parts[3] or None,
                "catalog": spec.name if spec else None,
            }
        )
    return gpus_


def software() -> dict[str, Any]:
    import torch  # lazy: torch

    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:  # NCCL missing from this build
            nccl = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "parlab": parlab.__version__,
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
    }


def gpus() -> list[dict[str, Any]]:
    import torch  # lazy: torch

    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        spec = catalog.lookup(p.name)
        out.append(
            {
                "index": i,
                "name": p.name,
                "memory_bytes": int(p.total_memory),
                "compute_capability": f"{p.major}.{p.minor}",
                "catalog": spec.name if spec else None,
            }
        )
    return out


def cpu() -> dict[str, Any]:
    model = platform.processor() or None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"count": os.cpu_count() or 1, "usable": affinity, "model": model}


def variables() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(_VAR_PREFIXES)}


def _run(cmd: list[str], timeout: float = 10.0) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def parse_topo_matrix(text: str) -> dict[str, Any] | None:
    """Parse ``nvidia-smi topo -m`` into ``{devices, matrix, nvlinks}``.

    ``matrix[i][j]`` is the cell as printed (``X``, ``NV18``, ``PIX``, ``SYS``...),
    ``nvlinks[i][j]`` the NVLink count (0 where the path is not NVLink).
    """
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # nvidia-smi underlines the header with ANSI codes
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return None
    devices = re.findall(r"\bGPU\d+\b", lines[0])
    if not devices:
        return None
    matrix: list[list[str]] = []
    for ln in lines[1:]:
        parts = ln.split()
        if parts and parts[0] in devices and len(matrix) < len(devices):
            matrix.append(parts[1 : 1 + len(devices)])
    if len(matrix) != len(devices):
        return None
    nvlinks = [[int(c[2:]) if re.fullmatch(r"NV\d+", c) else 0 for c in row] for row in matrix]
    return {"devices": devices, "matrix": matrix, "nvlinks": nvlinks}


def parse_nvlink_speed(text: str) -> float | None:
    """Per-link speed in bytes/s from ``nvidia-smi nvlink -s`` (``Link 0: 26.562 GB/s``)."""
    speeds = [float(x) for x in re.findall(r"Link \d+:\s*([0-9.]+)\s*GB/s", text)]
    return max(speeds) * 1e9 if speeds else None


def _nvml_nvlinks(n: int) -> tuple[list[list[int]] | None, str]:
    """Per-pair active NVLink counts through NVML (None when NVML is absent), and a note."""
    try:
        import pynvml  # lazy: pynvml
    except ImportError:
        return None, "nvidia-ml-py not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return None, f"nvmlInit failed: {exc}"
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        bus = [pynvml.nvmlDeviceGetPciInfo(h).busId for h in handles]
        bus = [b.decode() if isinstance(b, bytes) else b for b in bus]
        bus_index = {_bus_key(b): i for i, b in enumerate(bus)}
        counts = [[0] * n for _ in range(n)]
        max_links = getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)
        errors: list[str] = []
        remotes: list[str] = []
        for i, h in enumerate(handles):
            for link in range(max_links):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(h, link) != pynvml.NVML_FEATURE_ENABLED:
                        continue
                    remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId
                except Exception as exc:
                    errors.append(type(exc).__name__)
                    continue
                remote = remote.decode() if isinstance(remote, bytes) else remote
                remotes.append(remote)
                j = bus_index.get(_bus_key(remote))
                if j is not None and j != i:
                    counts[i][j] += 1
        note = f"{len(remotes)} active links read"
        if errors:
            note += f"; {len(errors)} link queries failed ({errors[0]})"
        if remotes and not any(any(r) for r in counts):
            note += f"; remote bus ids {sorted(set(remotes))[:2]} match no local GPU {bus[:2]}"
        return counts, note
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _bus_key(bus_id: str) -> str:
    """``00000000:18:00.0`` and ``0000:18:00.0`` name the same device: compare bus:device.function."""
    return ":".join(bus_id.strip().lower().split(":")[-2:])


def interconnect(gpu_list: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The GPU-to-GPU matrix with per-direction bandwidth, or None with no GPU."""
    n = len(gpu_list)
    if n == 0:
        return None
    out: dict[str, Any] = {"source": None, "matrix": None, "nvlinks": None}
    nvml, nvml_note = _nvml_nvlinks(n)
    out["nvml"] = nvml_note
    topo_text = _run(["nvidia-smi", "topo", "-m"])
    topo = parse_topo_matrix(topo_text) if topo_text else None
    if topo is not None:
        out.update(source="nvidia-smi topo -m", matrix=topo["matrix"], nvlinks=topo["nvlinks"])
    if nvml is not None and any(any(r) for r in nvml):
        out.update(source="nvml", nvlinks=nvml)
    if out["nvlinks"] is None:
        out["note"] = "no NVML and no nvidia-smi: interconnect unknown"
        return out
    speed_text = _run(["nvidia-smi", "nvlink", "-s", "-i", "0"])
    per_link = parse_nvlink_speed(speed_text) if speed_text else None
    per_link_source = "nvidia-smi nvlink -s"
    if per_link is None:
        spec = catalog.lookup(gpu_list[0]["name"])
        per_link = spec.nvlink_per_link_bw if spec else None
        per_link_source = f"catalog ({spec.name})" if spec else "unknown"
    out["per_link_bw"] = per_link
    out["per_link_bw_source"] = per_link_source
    out["per_direction_bw"] = [
        [None if per_link is None or c == 0 else c * per_link for c in row]
        for row in out["nvlinks"]
    ]
    return out


@functools.lru_cache(maxsize=4)
def snapshot(probe_links: bool = True, light: bool = False) -> dict[str, Any]:
    """The ``environment`` field of a contract document. ``light``: without importing torch
    (unless it already is), for the analytic commands -- versions from package metadata,
    GPUs from ``nvidia-smi``."""
    light = light and "torch" not in sys.modules
    gpu_list = _light_gpus() if light else gpus()
    hw: dict[str, Any] = {
        "gpus": [
            {k: g[k] for k in ("name", "memory_bytes", "compute_capability")} for g in gpu_list
        ],
        "gpu_count": len(gpu_list),
        "interconnect": interconnect(gpu_list) if probe_links else None,
        "cpu": cpu(),
        "host_count": int(
            os.environ.get("PARLAB_HOST_COUNT", os.environ.get("GROUP_WORLD_SIZE", "1")) or 1
        ),
    }
    return {
        "hardware": hw,
        "software": _light_software() if light else software(),
        "variables": variables(),
        "argv": list(sys.argv),
    }
