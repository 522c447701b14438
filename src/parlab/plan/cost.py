"""Is the cost acceptable: a plan's time to train, GPU-hours, money and energy for a token budget.

For a training budget of ``tokens`` and a candidate predicted at ``tokens_per_s_per_gpu`` on
``G`` GPUs:

- time to train = tokens / (tokens_per_s_per_gpu x G);
- GPU-hours = time (hours) x G; cost = GPU-hours x the price of one GPU-hour;
- energy = the GPU's board power (its TDP, ``parlab.hardware.catalog``) x G x time: what the GPUs
  may draw, not the host, network or cooling (a floor of the facility's bill).

Each figure carries the prediction's error band (``parlab.plan.precision``) when one is given.
"""

from __future__ import annotations

from dataclasses import dataclass

from parlab.errors import UsageError
from parlab.hardware.catalog import GPUSpec


@dataclass(frozen=True, kw_only=True)
class Budget:
    """What the user asks the cost of."""

    tokens: float | None = None
    """Training tokens (``--tokens``); None: report per step only."""
    gpu_hour_price: float | None = None
    """Price of one GPU-hour (``--gpu-hour-price``, any currency); None: no money figure."""

    def __post_init__(self) -> None:
        if self.tokens is not None and not self.tokens > 0:
            raise UsageError(f"--tokens {self.tokens:g}: give a positive token budget, e.g. 15e12")
        if self.gpu_hour_price is not None and not self.gpu_hour_price > 0:
            raise UsageError(
                f"--gpu-hour-price {self.gpu_hour_price:g}: give a positive price, e.g. 2.5"
            )


@dataclass(frozen=True, kw_only=True)
class Cost:
    """What training the budget on one candidate costs."""

    seconds: float
    """Time to train."""
    gpu_hours: float
    """GPU-hours."""
    money: float | None
    """GPU-hours x price; None without a price."""
    energy_kwh: float | None
    """Board power x GPUs x time, kWh; None where the catalog has no board power."""

    def to_json(self) -> dict[str, float | None]:
        return {
            "time_to_train_s": self.seconds,
            "gpu_hours": self.gpu_hours,
            "cost": self.money,
            "energy_kwh": self.energy_kwh,
        }


def cost_of(tokens_per_s_per_gpu: float, gpus: int, gpu: GPUSpec, budget: Budget) -> Cost | None:
    """The cost of ``budget.tokens`` at that throughput; None without a token budget."""
    if budget.tokens is None or tokens_per_s_per_gpu <= 0:
        return None
    seconds = budget.tokens / (tokens_per_s_per_gpu * gpus)
    gpu_hours = seconds / 3600.0 * gpus
    money = gpu_hours * budget.gpu_hour_price if budget.gpu_hour_price else None
    energy = gpu.board_power_w * gpus * seconds / 3.6e6 if gpu.board_power_w else None
    return Cost(seconds=seconds, gpu_hours=gpu_hours, money=money, energy_kwh=energy)


def duration(seconds: float) -> str:
    """``3.2 days``, ``5.1 hours``, ``12 minutes``."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.3g} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.3g} hours"
    return f"{seconds / 60:.3g} minutes"
