"""``parlab train`` prints rank 0's median step by phase: host, and device where it ran on GPU."""

from __future__ import annotations

from parlab.cli.common import console
from parlab.cli.train import _print_phases


def test_phase_table_shows_host_and_device_medians() -> None:
    phases = {
        "host": {"forward": [0.010, 0.030, 0.020], "backward": [0.2584, 0.2590, 0.2500]},
        "device": {"forward": [0.0358, 0.0360, 0.0350], "backward": [0.2544, 0.2544, 0.2544]},
    }
    with console.capture() as cap:
        _print_phases(phases)
    out = cap.get()
    header = next(line for line in out.splitlines() if line.startswith("┃"))
    assert "device" in header
    assert "device:" in out
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("│")}
    assert "20.0 ms" in rows["forward"] and "35.8 ms" in rows["forward"]
    assert "258.4 ms" in rows["backward"] and "254.4 ms" in rows["backward"]


def test_cpu_ranks_print_the_host_alone_and_nothing_without_phases() -> None:
    with console.capture() as cap:
        _print_phases({"host": {"data": [0.0002]}})
    out = cap.get()
    header = next(line for line in out.splitlines() if line.startswith("┃"))
    assert "0.2 ms" in out and "device" not in header and "device:" not in out
    with console.capture() as cap:
        _print_phases({})
    assert cap.get() == ""
