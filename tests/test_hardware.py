"""GPU catalog and the interconnect probe's parsers (no GPU needed)."""

from __future__ import annotations

import pytest

from parlab.hardware import catalog, env

TOPO_2xH200 = """\
\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\t0-31\t0\t\tN/A
GPU1\tNV18\t X \t0-31\t0\t\tN/A

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""

# as nvidia-smi prints it on the 2xH200 machine: the header underlined with ANSI codes
TOPO_ANSI = (
    "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    + TOPO_2xH200.split("\n", 1)[1]
)

TOPO_PCIE = """\
        GPU0    GPU1    GPU2    CPU Affinity
GPU0     X      PIX     SYS     0-15
GPU1    PIX      X      SYS     0-15
GPU2    SYS     SYS      X      16-31
"""

NVLINK_S = """\
GPU 0: NVIDIA H200 (UUID: GPU-xxxx)
\t Link 0: 26.562 GB/s
\t Link 1: 26.562 GB/s
\t Link 17: 26.562 GB/s
"""


def test_topology_matrix_parsing() -> None:
    t = env.parse_topo_matrix(TOPO_2xH200)
    assert t is not None
    assert t["matrix"] == [["X", "NV18"], ["NV18", "X"]]
    assert t["nvlinks"] == [[0, 18], [18, 0]]
    assert env.parse_topo_matrix(TOPO_ANSI) == t
    p = env.parse_topo_matrix(TOPO_PCIE)
    assert p is not None and p["nvlinks"] == [[0, 0, 0]] * 3
    assert p["matrix"][2] == ["SYS", "SYS", "X"]
    assert env.parse_topo_matrix("No devices were found") is None


def test_bus_ids_compare_across_formats() -> None:
    assert env._bus_key("00000000:18:00.0") == env._bus_key("0000:18:00.0") == "18:00.0"


def test_nvlink_speed_gives_per_direction_bandwidth() -> None:
    per_link = env.parse_nvlink_speed(NVLINK_S)
    assert per_link == pytest.approx(26.562e9)
    assert 18 * per_link / 1e9 == pytest.approx(478.1, abs=0.1)  # 18 links x 26.562 GB/s
    assert env.parse_nvlink_speed("") is None


@pytest.mark.parametrize(
    "reported, name",
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA H20", "H20"),
        ("AMD Instinct MI300X", "MI300X"),
        ("h100-sxm", "H100-SXM"),
    ],
)
def test_catalog_lookup(reported: str, name: str) -> None:
    spec = catalog.lookup(reported)
    assert spec is not None and spec.name == name
    assert spec.peak("bf16") and spec.memory_bytes > 0 and spec.link_bw > 0


def test_unknown_gpu_has_no_peak() -> None:
    assert catalog.lookup("Voodoo2") is None
    assert catalog.peak_flops("Voodoo2") is None
    assert catalog.peak_flops("A100", "fp8") is None  # A100 has no FP8
    with pytest.raises(ValueError, match="unknown GPU 'Voodoo2': use one of"):
        catalog.require("Voodoo2")


def test_catalog_peaks_are_dense_datasheet_values() -> None:
    assert catalog.peak_flops("H100-SXM") == pytest.approx(989.4e12)
    assert catalog.peak_flops("H200") == catalog.peak_flops("H100-SXM")
    assert catalog.lookup("H200").memory_bytes == 141e9


def test_snapshot_on_a_cpu_machine() -> None:
    snap = env.snapshot(probe_links=False)
    hw, sw = snap["hardware"], snap["software"]
    assert hw["gpu_count"] == len(hw["gpus"])
    assert hw["cpu"]["count"] >= 1 and hw["host_count"] >= 1
    assert sw["torch"] and sw["python"] and sw["parlab"]
    assert all(
        k.startswith(("NCCL_", "TORCH_", "CUDA_", "NVSHMEM_", "OMP_")) for k in snap["variables"]
    )
