"""Egeria's freeze / unfreeze decisions as plain arithmetic on numbers (Egeria section 4.2.2, Algorithm 1).

`FreezingPolicy` sees only numbers: the mean training loss of each evaluation interval, the learning rate, and
plasticity readings of the frontmost active layer module. It never touches a model, so it is tested with scripted
series and its state is a plain dict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class FreezingPolicyConfig:
    """Hyper-parameters of Egeria's policy (names follow the paper's guideline in section 4.2.2).

    Args:
        window: W, the number of consecutive low-slope evaluations needed to freeze a module; also the length of the
            moving average and of the least-squares window. Halved (at least 1) at every unfreeze.
        tolerance_fraction: the slope tolerance of a module is this fraction of the largest |slope| among its first
            `tolerance_readings` slope readings (Egeria: 20% of the first 3).
        tolerance_readings: number of initial slope readings that set the tolerance.
        bootstrap_change_rate: bootstrapping ends once the relative change ``|L_prev - L| / |L_prev|`` of the
            training loss drops below this (Egeria: 10%); L is the mean of the last W interval means and L_prev the
            mean of the W before them (non-overlapping windows, so it cannot end before 2W intervals).
        lr_drop_factor: unfreeze every frozen module once the LR is at most ``lr_at_first_freeze / lr_drop_factor``.
        max_frozen: at most this many front modules are frozen (None: all but the last module).
    """

    window: int = 10
    tolerance_fraction: float = 0.2
    tolerance_readings: int = 3
    bootstrap_change_rate: float = 0.1
    lr_drop_factor: float = 10.0
    max_frozen: int | None = None

    def __post_init__(self) -> None:
        for name in ("window", "tolerance_readings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"`{name}` is {value!r}, but must be an int")
            if value < 1:
                raise ValueError(f"`{name}` is {value}, but must be >= 1")
        if not 0.0 < self.tolerance_fraction <= 1.0:
            raise ValueError(f"`tolerance_fraction` is {self.tolerance_fraction}, but must be in (0, 1]")
        if not 0.0 <= self.bootstrap_change_rate:
            raise ValueError(f"`bootstrap_change_rate` is {self.bootstrap_change_rate}, but must be >= 0")
        if not self.lr_drop_factor > 1.0:
            raise ValueError(f"`lr_drop_factor` is {self.lr_drop_factor}, but must be > 1")
        if self.max_frozen is not None and self.max_frozen < 0:
            raise ValueError(f"`max_frozen` is {self.max_frozen}, but must be >= 0 or None")


def least_squares_slope(values: Sequence[float]) -> float:
    """Slope of the least-squares line through ``(i, values[i])``; 0 for fewer than two points."""
    n = len(values)
    if n < 2:
        return 0.0
    mean_x = (n - 1) / 2
    mean_y = sum(values) / n
    num = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(values))
    den = sum((i - mean_x) ** 2 for i in range(n))
    return num / den


class FreezingPolicy:
    """Egeria's bootstrapping, freezing and unfreezing rule (Egeria section 4.2.2).

    Call order per evaluation (the controller does this every ``eval_interval`` steps):
    ``on_lr(lr)`` (may unfreeze everything), then ``on_loss(mean_loss)`` while bootstrapping, then
    ``on_plasticity(module, value)`` for each reading that arrived. Only readings of the frontmost active module
    count; stale readings of another module are ignored and return False.

    Per module, each reading p is smoothed by a moving average of the last W raw readings; a least-squares slope is
    fitted over the last W smoothed values; the first `tolerance_readings` slopes fix the module's tolerance; the
    module freezes once |slope| < tolerance on W consecutive readings.
    """

    def __init__(self, num_modules: int, config: FreezingPolicyConfig | None = None) -> None:
        if isinstance(num_modules, bool) or not isinstance(num_modules, int):
            raise TypeError(f"`num_modules` is {num_modules!r}, but must be an int")
        if num_modules < 1:
            raise ValueError(f"`num_modules` is {num_modules}, but must be >= 1")
        self.config = config or FreezingPolicyConfig()
        self.num_modules = num_modules
        limit = num_modules - 1 if self.config.max_frozen is None else self.config.max_frozen
        self.max_frozen = min(limit, num_modules)
        self.window = self.config.window
        self.bootstrapping = True
        self.frozen = 0  # the first `frozen` modules are frozen
        self.generation = 0  # bumps on every freeze/unfreeze; names the frozen weights' version
        self.lr_at_first_freeze: float | None = None
        self.previous_loss: float | None = None  # mean loss of the window before the last one (for inspection)
        self.losses: list[float] = []  # the last 2W interval-mean losses
        self.evaluations = 0  # plasticity readings accepted so far, over all modules
        self._reset_module()

    def _reset_module(self) -> None:
        self.raw: list[float] = []
        self.smoothed: list[float] = []
        self.slopes: list[float] = []
        self.tolerance: float | None = None
        self.low_count = 0

    def on_loss(self, mean_loss: float) -> bool:
        """Feed the mean training loss of the last interval; returns True when bootstrapping ends at this call."""
        if not self.bootstrapping or not math.isfinite(mean_loss):
            return False
        # two adjacent, non-overlapping windows of W interval means: SGD noise on a small loss does not read as
        # change, and a short interval (T of a few steps) cannot end bootstrapping within a few steps (overlapping
        # moving averages differ by 1/W of the per-interval change, which ended it at once)
        w = self.window
        self.losses = [*self.losses, float(mean_loss)][-2 * w :]
        if len(self.losses) < 2 * w:
            return False
        previous = sum(self.losses[:w]) / w
        current = sum(self.losses[w:]) / w
        self.previous_loss = previous
        rate = abs(previous - current) / abs(previous) if previous != 0 else 0.0
        if rate < self.config.bootstrap_change_rate:
            self.bootstrapping = False
            return True
        return False

    def on_lr(self, lr: float) -> bool:
        """Feed the current LR; returns True when it unfreezes every frozen module (LR dropped by the factor)."""
        if self.frozen == 0 or self.lr_at_first_freeze is None:
            return False
        if lr > self.lr_at_first_freeze / self.config.lr_drop_factor * (1 + 1e-9):
            return False
        self.frozen = 0
        self.generation += 1
        self.lr_at_first_freeze = None
        self.window = max(1, self.window // 2)
        self._reset_module()
        return True

    @property
    def active(self) -> int | None:
        """Index of the frontmost active module whose plasticity is monitored, or None if nothing may freeze."""
        if self.bootstrapping or self.frozen >= self.max_frozen:
            return None
        return self.frozen

    def on_plasticity(self, module: int, value: float, lr: float | None = None) -> bool:
        """Feed one plasticity reading of `module`; returns True when that module freezes at this reading."""
        if module != self.active or not math.isfinite(value):
            return False
        self.evaluations += 1
        w = self.window
        self.raw.append(float(value))
        recent = self.raw[-w:]
        self.smoothed.append(sum(recent) / len(recent))
        if len(self.smoothed) < 2:
            return False
        slope = least_squares_slope(self.smoothed[-max(2, w) :])  # a line needs two points even when W is 1
        self.slopes.append(slope)
        if len(self.slopes) == self.config.tolerance_readings:
            self.tolerance = self.config.tolerance_fraction * max(abs(s) for s in self.slopes)
        if self.tolerance is None:
            return False
        # `<=` so a series that is flat from its first readings (tolerance 0) can still freeze
        self.low_count = self.low_count + 1 if abs(slope) <= self.tolerance else 0
        if self.low_count < w:
            return False
        self.frozen += 1
        self.generation += 1
        if self.lr_at_first_freeze is None:
            self.lr_at_first_freeze = lr
        self._reset_module()
        return True

    def force(self, frozen: int, lr: float | None = None) -> None:
        """Set the frozen prefix by hand (an override for users and tests); leaves bootstrapping."""
        if isinstance(frozen, bool) or not isinstance(frozen, int) or not 0 <= frozen <= self.num_modules:
            raise ValueError(f"`frozen` is {frozen!r}, but must be an int in [0, {self.num_modules}]")
        self.bootstrapping = False
        if frozen == self.frozen:
            return
        self.frozen = frozen
        self.generation += 1
        self.lr_at_first_freeze = lr if frozen > 0 else None
        self._reset_module()

    def state_dict(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "num_modules": self.num_modules,
            "window": self.window,
            "bootstrapping": self.bootstrapping,
            "frozen": self.frozen,
            "generation": self.generation,
            "lr_at_first_freeze": self.lr_at_first_freeze,
            "previous_loss": self.previous_loss,
            "losses": list(self.losses),
            "evaluations": self.evaluations,
            "raw": list(self.raw),
            "smoothed": list(self.smoothed),
            "slopes": list(self.slopes),
            "tolerance": self.tolerance,
            "low_count": self.low_count,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["num_modules"] != self.num_modules:
            raise ValueError(
                f"`state['num_modules']` is {state['num_modules']}, but must equal this policy's {self.num_modules}"
            )
        self.config = FreezingPolicyConfig(**state["config"])
        for key in ("window", "bootstrapping", "frozen", "generation", "lr_at_first_freeze", "previous_loss"):
            setattr(self, key, state[key])
        self.evaluations = state["evaluations"]
        self.losses = list(state["losses"])
        self.raw, self.smoothed, self.slopes = list(state["raw"]), list(state["smoothed"]), list(state["slopes"])
        self.tolerance, self.low_count = state["tolerance"], state["low_count"]
        limit = self.num_modules - 1 if self.config.max_frozen is None else self.config.max_frozen
        self.max_frozen = min(limit, self.num_modules)


# Egeria's worked example (section 4.2.2): ResNet-56 on CIFAR-10, 200 epochs = 78k iterations, 7 layer modules,
# W = 10 and T = 300 iterations.
PAPER_TOTAL_STEPS = 78_000
PAPER_EVAL_INTERVAL = 300
PAPER_WINDOW = 10


@dataclass(frozen=True)
class ScaledDefaults:
    """Egeria's hyper-parameters for a run of `total_steps` optimizer steps (see `scaled_defaults`)."""

    total_steps: int
    eval_interval: int
    window: int
    reference_refresh: int
    earliest_bootstrap_end: int

    def policy(self, **overrides: Any) -> FreezingPolicyConfig:
        """A `FreezingPolicyConfig` with this window (and any other field overridden)."""
        return FreezingPolicyConfig(**{"window": self.window, **overrides})


def scaled_defaults(total_steps: int, window: int = PAPER_WINDOW, reference_refresh: int = 10) -> ScaledDefaults:
    """The paper's defaults scaled to a run of `total_steps` steps, keeping every span a fixed fraction of the run.

    The rule (Egeria section 4.2.2, worked example: T = 300 of 78k iterations, W = 10):

    - T (``eval_interval``) = ``max(1, round(total_steps * 300 / 78_000))``: one evaluation every 0.385% of the
      run. At the paper's 78k steps this is 300; at 550 steps it is 2.
    - W (``window``) stays a count of evaluations (10 unless given), so the freezing window spans W*T steps = 3.8%
      of the run at W = 10, as in the paper (3000 of 78k).
    - bootstrapping compares the mean loss of two adjacent windows of W intervals (`FreezingPolicy.on_loss`), so it
      ends no earlier than 2*W*T steps (7.7% of the run at W = 10; 6000 steps, about 15 of 200 epochs, in the
      paper's setting) and later while the loss still falls by 10% per window.
    - the reference is rebuilt every `reference_refresh` evaluations (the paper gives no number; 10 evaluations
      is one window at W = 10).

    Args:
        total_steps: the optimizer steps the run is expected to take (epochs x steps per epoch).
        window: W; tune it on seeds you do not report.
    """
    for name, value in (("total_steps", total_steps), ("window", window), ("reference_refresh", reference_refresh)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"`{name}` is {value!r}, but must be an int")
        if value < 1:
            raise ValueError(f"`{name}` is {value}, but must be >= 1")
    interval = max(1, round(total_steps * PAPER_EVAL_INTERVAL / PAPER_TOTAL_STEPS))
    return ScaledDefaults(total_steps, interval, window, reference_refresh, 2 * window * interval)
