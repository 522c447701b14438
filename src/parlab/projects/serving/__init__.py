"""``parlab project serving`` (PAR-DISTRIBUTED-INFERENCE): replicas behind parlab's router
under each routing policy, the simulator's predictions, failover, the KV-cache transfer.

- ``config.py``     ``Preset`` (the run's sizes) and the named presets;
- ``rank.py``       what runs outside this process: replicas, the KV transfer's two ranks;
- ``documents.py``  the documents each part writes;
- ``report.py``     the report, as blocks of ``parlab.report``;
- ``run.py``        the steps, in order (``run_project``).
"""

from parlab.projects.serving.config import ALL_POLICIES, PROJECT, Preset, get_preset
from parlab.projects.serving.run import demo_step, loop_probe, run_project

__all__ = [
    "ALL_POLICIES",
    "PROJECT",
    "Preset",
    "demo_step",
    "get_preset",
    "loop_probe",
    "run_project",
]
