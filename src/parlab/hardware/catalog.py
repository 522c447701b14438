"""GPU catalog: peak dense FLOP/s, memory, and intra-node links.

Every number cites its source. Peaks are *dense* (no 2:4 sparsity), per GPU.
Link bandwidth is per direction, in bytes/s (GB/s = 1e9 B/s, as nccl-tests).
An unknown GPU has no entry: callers get ``None`` and must show "unknown"
(MFU unknown), never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from parlab.errors import UsageError

T = 1e12
GB = 1e9


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One GPU model's datasheet numbers."""

    name: str
    """Canonical catalog name, e.g. ``H100-SXM``."""
    peak_flops: dict[str, float | None]
    """Dense peak FLOP/s by dtype (``bf16``, ``fp16``, ``fp8``, ``fp32``, ``tf32``); None: not supported."""
    memory_bytes: int
    """Device memory capacity in bytes (as sold: GB = 1e9)."""
    memory_bw: float
    """Device memory bandwidth, bytes/s."""
    link: str
    """Intra-node GPU-to-GPU link (``NVLink4``, ``PCIe5``, ...)."""
    link_bw: float
    """Intra-node GPU-to-GPU bandwidth per direction, bytes/s."""
    nvlink_per_link_bw: float | None
    """Per-NVLink bandwidth per direction, bytes/s (None where no NVLink)."""
    aliases: tuple[str, ...]
    """Regexes (case-insensitive) matching what drivers report as the device name."""
    source: str
    """Where the numbers come from."""
    board_power_w: float | None = None
    """Board power (TDP) in watts, for the energy a run draws; None: unknown."""
    nic_bw: float | None = None
    """Bytes/s per GPU between nodes in the vendor's reference system (one NIC per GPU,
    rail-optimised); None: no reference system (give ``--inter-node-bw``)."""
    system: str = ""
    """The reference system ``nic_bw`` and the NVLink domain come from."""

    def peak(self, dtype: str = "bf16") -> float | None:
        return self.peak_flops.get(dtype)


CATALOG: tuple[GPUSpec, ...] = (
    GPUSpec(
        name="H100-SXM",
        # NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16/FP16 989.4 TF dense
        # (1,979 with sparsity), FP8 1,979 dense, TF32 494.7 dense, FP32 66.9.
        peak_flops={
            "bf16": 989.4 * T,
            "fp16": 989.4 * T,
            "fp8": 1978.9 * T,
            "tf32": 494.7 * T,
            "fp32": 66.9 * T,
        },
        memory_bytes=80 * 10**9,  # 80 GB HBM3
        memory_bw=3.35e12,  # 3.35 TB/s
        link="NVLink4",
        link_bw=450 * GB,  # 900 GB/s bidirectional total over 18 links
        nvlink_per_link_bw=25 * GB,  # NVLink4: 50 GB/s bidirectional per link
        aliases=(r"H100.*(SXM|HBM3)", r"^H100$"),
        source="NVIDIA H100 datasheet (SXM5 column)",
        board_power_w=700.0,
        nic_bw=50 * GB,
        system="DGX H100: 8 GPUs on NVSwitch, 8 x ConnectX-7 400 Gb/s NDR, one per GPU; 700 W per GPU (H100 SXM datasheet)",
    ),
    GPUSpec(
        name="H100-PCIe",
        # NVIDIA H100 datasheet (PCIe column): BF16 756 TF dense, FP8 1,513, TF32 378, FP32 51.2.
        peak_flops={
            "bf16": 756.5 * T,
            "fp16": 756.5 * T,
            "fp8": 1513 * T,
            "tf32": 378 * T,
            "fp32": 51.2 * T,
        },
        memory_bytes=80 * 10**9,  # 80 GB HBM2e
        memory_bw=2.0e12,  # 2 TB/s
        link="PCIe5",
        link_bw=64 * GB,  # PCIe Gen5 x16, 128 GB/s bidirectional
        nvlink_per_link_bw=None,
        aliases=(r"H100.*PCIe",),
        source="NVIDIA H100 datasheet (PCIe column)",
        board_power_w=350.0,
        nic_bw=None,
        system="H100 PCIe datasheet: 350 W max",
    ),
    GPUSpec(
        name="H200",
        # NVIDIA H200 datasheet (SXM): same compute as H100 SXM; 141 GB HBM3e at 4.8 TB/s.
        peak_flops={
            "bf16": 989.4 * T,
            "fp16": 989.4 * T,
            "fp8": 1978.9 * T,
            "tf32": 494.7 * T,
            "fp32": 66.9 * T,
        },
        memory_bytes=141 * 10**9,
        memory_bw=4.8e12,
        link="NVLink4",
        link_bw=450 * GB,  # 900 GB/s bidirectional; nvidia-smi reports 18 x 26.562 GB/s
        nvlink_per_link_bw=26.5625 * GB,  # as nvidia-smi nvlink -s reports on H200
        aliases=(r"H200",),
        source="NVIDIA H200 datasheet (SXM column)",
        board_power_w=700.0,
        nic_bw=50 * GB,
        system="HGX H200: 8 GPUs on NVSwitch, one 400 Gb/s NIC per GPU; 700 W per GPU (H200 SXM datasheet)",
    ),
    GPUSpec(
        name="H20",
        # NVIDIA HGX H20 product brief: BF16 148 TF dense, FP8 296, FP32 44; 96 GB HBM3 at 4.0 TB/s; NVLink 900 GB/s.
        peak_flops={
            "bf16": 148 * T,
            "fp16": 148 * T,
            "fp8": 296 * T,
            "tf32": 74 * T,
            "fp32": 44 * T,
        },
        memory_bytes=96 * 10**9,
        memory_bw=4.0e12,
        link="NVLink4",
        link_bw=450 * GB,
        nvlink_per_link_bw=25 * GB,
        aliases=(r"\bH20\b",),
        source="NVIDIA HGX H20 product brief",
        board_power_w=400.0,
        nic_bw=None,
        system="HGX H20 product brief: 400 W",
    ),
    GPUSpec(
        name="A100-40GB",
        # NVIDIA A100 datasheet: BF16/FP16 312 TF dense, TF32 156, FP32 19.5; no FP8.
        peak_flops={
            "bf16": 312 * T,
            "fp16": 312 * T,
            "fp8": None,
            "tf32": 156 * T,
            "fp32": 19.5 * T,
        },
        memory_bytes=40 * 10**9,  # 40 GB HBM2
        memory_bw=1.555e12,
        link="NVLink3",
        link_bw=300 * GB,  # 600 GB/s bidirectional over 12 links
        nvlink_per_link_bw=25 * GB,
        aliases=(r"A100.*40GB", r"A100-SXM4-40GB", r"A100-PCIE-40GB"),
        source="NVIDIA A100 datasheet (40GB SXM column)",
        board_power_w=400.0,
        nic_bw=25 * GB,
        system="DGX A100: 8 GPUs on NVSwitch, 8 x ConnectX-6 200 Gb/s HDR, one per GPU; 400 W per GPU (A100 SXM datasheet)",
    ),
    GPUSpec(
        name="A100-80GB",
        peak_flops={
            "bf16": 312 * T,
            "fp16": 312 * T,
            "fp8": None,
            "tf32": 156 * T,
            "fp32": 19.5 * T,
        },
        memory_bytes=80 * 10**9,  # 80 GB HBM2e
        memory_bw=2.039e12,
        link="NVLink3",
        link_bw=300 * GB,
        nvlink_per_link_bw=25 * GB,
        aliases=(r"A100.*80GB", r"^A100$"),
        source="NVIDIA A100 datasheet (80GB SXM column)",
        board_power_w=400.0,
        nic_bw=25 * GB,
        system="DGX A100: 8 GPUs on NVSwitch, 8 x ConnectX-6 200 Gb/s HDR, one per GPU; 400 W per GPU (A100 SXM datasheet)",
    ),
    GPUSpec(
        name="B200",
        # NVIDIA HGX B200 datasheet (per GPU): FP8 4.5 PF dense, BF16 2.25 PF dense, TF32 1.1 PF, FP32 75 TF;
        # 180 GB HBM3e at 7.7 TB/s; NVLink5 1.8 TB/s bidirectional.
        peak_flops={
            "bf16": 2250 * T,
            "fp16": 2250 * T,
            "fp8": 4500 * T,
            "tf32": 1100 * T,
            "fp32": 75 * T,
        },
        memory_bytes=180 * 10**9,
        memory_bw=7.7e12,
        link="NVLink5",
        link_bw=900 * GB,
        nvlink_per_link_bw=50 * GB,
        aliases=(r"B200",),
        source="NVIDIA HGX B200 datasheet",
        board_power_w=1000.0,
        nic_bw=50 * GB,
        system="DGX B200: 8 GPUs on NVSwitch, 8 x ConnectX-7 400 Gb/s, one per GPU; 1,000 W per GPU (HGX B200 datasheet)",
    ),
    GPUSpec(
        name="L40S",
        # NVIDIA L40S datasheet: BF16 362.05 TF dense (733 sparse), FP8 733 dense, TF32 183, FP32 91.6;
        # 48 GB GDDR6 at 864 GB/s; no NVLink, PCIe Gen4 x16.
        peak_flops={
            "bf16": 362.05 * T,
            "fp16": 362.05 * T,
            "fp8": 733 * T,
            "tf32": 183 * T,
            "fp32": 91.6 * T,
        },
        memory_bytes=48 * 10**9,
        memory_bw=864 * GB,
        link="PCIe4",
        link_bw=32 * GB,  # PCIe Gen4 x16, 64 GB/s bidirectional
        nvlink_per_link_bw=None,
        aliases=(r"L40S",),
        source="NVIDIA L40S datasheet",
        board_power_w=350.0,
        nic_bw=None,
        system="L40S datasheet: 350 W",
    ),
    GPUSpec(
        name="MI300X",
        # AMD Instinct MI300X datasheet: BF16/FP16 1,307.4 TF dense, FP8 2,614.9, TF32 653.7, FP32 163.4;
        # 192 GB HBM3 at 5.3 TB/s; Infinity Fabric 896 GB/s aggregate peer bandwidth (7 links x 64 GB/s x 2).
        peak_flops={
            "bf16": 1307.4 * T,
            "fp16": 1307.4 * T,
            "fp8": 2614.9 * T,
            "tf32": 653.7 * T,
            "fp32": 163.4 * T,
        },
        memory_bytes=192 * 10**9,
        memory_bw=5.3e12,
        link="InfinityFabric",
        link_bw=448 * GB,
        nvlink_per_link_bw=None,
        aliases=(r"MI300X",),
        source="AMD Instinct MI300X datasheet",
        board_power_w=750.0,
        nic_bw=None,
        system="MI300X datasheet: 750 W",
    ),
)

_BY_NAME = {g.name.lower(): g for g in CATALOG}


def lookup(name: str) -> GPUSpec | None:
    """The catalog entry for a catalog name or a driver-reported device name, or None."""
    key = name.strip().lower()
    if key in _BY_NAME:
        return _BY_NAME[key]
    for spec in CATALOG:
        if any(re.search(a, name, re.IGNORECASE) for a in spec.aliases):
            return spec
    return None


def require(name: str) -> GPUSpec:
    """Like ``lookup`` but a ``UsageError`` naming the known GPUs when unknown."""
    spec = lookup(name)
    if spec is None:
        known = ", ".join(g.name for g in CATALOG)
        raise UsageError(f"unknown GPU {name!r}: use one of {known}")
    return spec


def peak_flops(name: str, dtype: str = "bf16") -> float | None:
    """Dense peak FLOP/s of a device, or None when the GPU or dtype is unknown."""
    spec = lookup(name)
    return None if spec is None else spec.peak(dtype)
