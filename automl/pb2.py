"""PB2, population based bandits (Parker-Holder, Nguyen and Roberts, "Provably Efficient Online Hyperparameter
Optimization with Population-Based Bandits", NeurIPS 2020): PBT whose explore step is a time-varying GP bandit
(TV-GP-UCB, Bogunovic, Scarlett and Cevher, AISTATS 2016) instead of random perturbations. Ray Tune's `PB2`.

No maintained library offers PB2 apart from Ray Tune, whose scheduler needs Ray's trial runner and GPy; the GP here is
a few lines of numpy (the time-varying squared-exponential kernel of both papers, its hyper-parameters chosen by
marginal likelihood on a fixed grid, so every choice is deterministic and needs no optimiser)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from automl._base import ConfigState, Decision
from automl._checks import finite_real, show
from automl.pbt import PBT
from automl.space import (
    Constant,
    Domain,
    LogRandInt,
    LogUniform,
    QLogRandInt,
    QLogUniform,
    RandInt,
    SampleFrom,
    SearchSpace,
    Uniform,
    convert_tune,
)

#: the grid the GP's hyper-parameters are chosen from (inputs lie in [0, 1]^d, targets are standardised)
LENGTHSCALES = (0.05, 0.1, 0.2, 0.35, 0.5, 1.0, 2.0)
EPSILONS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5)
NOISES = (1e-3, 1e-2, 0.1, 0.3)
#: the GP sees the newest this many observations (older ones weigh little under the time-varying kernel)
MAX_OBSERVATIONS = 256
#: random points (in [0, 1]^d) the acquisition is evaluated at, besides the observed ones
CANDIDATES = 1000


def tv_kernel(xa: np.ndarray, ta: np.ndarray, xb: np.ndarray, tb: np.ndarray, lengthscale: float,
              epsilon: float) -> np.ndarray:
    """The time-varying squared-exponential kernel: exp(-|xa - xb|^2 / (2 l^2)) * (1 - epsilon)^(|ta - tb| / 2).

    `xa` is (n, d), `ta` (n,), `xb` (m, d), `tb` (m,); returns (n, m). `epsilon` in [0, 1) is how fast old
    observations are forgotten (0: time does not matter).
    """
    d2 = ((xa[:, None, :] - xb[None, :, :]) ** 2).sum(-1)  # (n, m)
    return np.exp(-d2 / (2 * lengthscale**2)) * (1.0 - epsilon) ** (np.abs(ta[:, None] - tb[None, :]) / 2)


@dataclass(frozen=True)
class TimeVaryingGP:
    """A GP posterior under `tv_kernel` (unit signal variance, Gaussian noise of variance `noise`).

    Attributes:
        x: (n, d) inputs in [0, 1]^d; t: (n,) their times; alpha: (n,) K^-1 y; chol: (n, n) lower Cholesky factor
        of K + noise I; lengthscale, epsilon, noise: the kernel's hyper-parameters.
    """

    x: np.ndarray
    t: np.ndarray
    alpha: np.ndarray
    chol: np.ndarray
    lengthscale: float
    epsilon: float
    noise: float

    def predict(self, x: np.ndarray, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation at the (m, d) points `x`, all at time `t`."""
        k = tv_kernel(x, np.full(len(x), float(t)), self.x, self.t, self.lengthscale, self.epsilon)  # (m, n)
        v = np.linalg.solve(self.chol, k.T)  # (n, m)
        var = np.maximum(1.0 - (v**2).sum(0), 1e-12)
        return k @ self.alpha, np.sqrt(var)

    def with_inputs(self, x: np.ndarray, t: np.ndarray) -> TimeVaryingGP:
        """The same kernel conditioned on the inputs `x`, `t` (targets zero): its `predict` standard deviation is
        what the posterior's would be once those points are observed, whatever their values."""
        return _condition(x, t, np.zeros(len(x)), self.lengthscale, self.epsilon, self.noise)[0]


def _condition(x: np.ndarray, t: np.ndarray, y: np.ndarray, lengthscale: float, epsilon: float,
               noise: float) -> tuple[TimeVaryingGP, float]:
    """The posterior on (x, t, y) and its log marginal likelihood."""
    k = tv_kernel(x, t, x, t, lengthscale, epsilon) + noise * np.eye(len(x))
    chol = np.linalg.cholesky(k)
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
    loglik = -0.5 * float(y @ alpha) - float(np.log(np.diag(chol)).sum()) - 0.5 * len(x) * math.log(2 * math.pi)
    return TimeVaryingGP(x, t, alpha, chol, lengthscale, epsilon, noise), loglik


def fit_tv_gp(x: np.ndarray, t: np.ndarray, y: np.ndarray) -> TimeVaryingGP:
    """The GP on `x` (n, d) in [0, 1]^d, times `t` (n,) and targets `y` (n,), standardised and clipped to [-2, 2]
    (as Ray Tune's PB2), with the hyper-parameters of `LENGTHSCALES` x `EPSILONS` x `NOISES` of largest marginal
    likelihood (the first of them on a tie)."""
    x, t, y = np.asarray(x, float), np.asarray(t, float), np.asarray(y, float)
    if x.ndim != 2 or len(x) != len(t) or len(x) != len(y) or len(x) < 1:
        raise ValueError(f"`x`, `t` and `y` have shapes {x.shape}, {t.shape} and {y.shape}, but must be (n, d), (n,) "
                         "and (n,) with n >= 1")
    y = np.clip((y - y.mean()) / (y.std() + 1e-8), -2.0, 2.0)
    best: tuple[float, TimeVaryingGP] | None = None
    for lengthscale in LENGTHSCALES:
        for epsilon in EPSILONS:
            for noise in NOISES:
                gp, loglik = _condition(x, t, y, lengthscale, epsilon, noise)
                if best is None or loglik > best[0]:
                    best = (loglik, gp)
    assert best is not None
    return best[1]


def ucb_kappa(n: int) -> float:
    """The UCB exploration weight for `n` observations: sqrt(0.2 + max(0, log(0.4 n))), TV-GP-UCB's schedule as
    Ray Tune's PB2 sets it."""
    return math.sqrt(0.2 + max(0.0, math.log(0.4 * n))) if n > 0 else math.sqrt(0.2)


def select_pb2_point(gp: TimeVaryingGP, t: float, pending: np.ndarray, rng: np.random.Generator,
                     candidates: int = CANDIDATES) -> np.ndarray:
    """PB2's choice for one new member: the point of [0, 1]^d that maximises mean + kappa * sd at time `t`.

    The mean is `gp`'s; the standard deviation is that of `gp` conditioned also on the `pending` points (m, d)
    (the members training now and the choices made earlier in this batch, at time `t`), so a batch spreads out
    (Desautels, Krause and Burdick, JMLR 2014, as Ray Tune's PB2). The maximum is taken over `candidates` uniform
    draws from `rng` and the observed points; the first maximiser wins a tie.
    """
    d = gp.x.shape[1]
    points = np.concatenate([rng.random((candidates, d)), gp.x])  # (c + n, d)
    mean, sd = gp.predict(points, t)
    if len(pending):
        pending = np.asarray(pending, float).reshape(-1, d)
        x = np.concatenate([gp.x, pending])
        tt = np.concatenate([gp.t, np.full(len(pending), float(t))])
        sd = gp.with_inputs(x, tt).predict(points, t)[1]
    return points[int(np.argmax(mean + ucb_kappa(len(gp.x)) * sd))]


def _log_scale(domain: Domain) -> bool:
    return isinstance(domain, (LogUniform, QLogUniform, LogRandInt, QLogRandInt))


def to_unit(domain: Uniform | RandInt, value: Any) -> float:
    """`value` of a numeric domain mapped to [0, 1] (log scale for log-uniform ones; clipped; 0.5 for a value
    that is not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value):
        return 0.5
    lo, hi, v = float(domain.lo), float(domain.hi), float(value)
    if _log_scale(domain):
        lo, hi, v = math.log(lo), math.log(hi), math.log(max(v, domain.lo))
    if hi <= lo:
        return 0.5
    return min(max((v - lo) / (hi - lo), 0.0), 1.0)


def from_unit(domain: Uniform | RandInt, u: float) -> Any:
    """The value of the domain at `u` in [0, 1] (the inverse of `to_unit`; ints rounded, quantised values snapped)."""
    lo, hi = float(domain.lo), float(domain.hi)
    if _log_scale(domain):
        return domain.clip(math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))))
    return domain.clip(lo + u * (hi - lo))


def _bounds(value: Any, space: SearchSpace) -> tuple[dict[str, Uniform | RandInt], dict[str, tuple[str, ...]]]:
    """The explored hyper-parameters: flat name -> numeric domain, and flat name -> key path."""
    numeric = (Uniform, RandInt)  # their quantised and log forms included
    if value is None:
        found = {n: d for n, d in space.searched.items() if isinstance(d, numeric)}
        if not found:
            raise ValueError(f"`hyperparam_bounds` is None, but `space` ({space.raw!r}) has no numeric hyper-parameter "
                             "(uniform, loguniform, randint or a quantised one) for PB2 to explore: pass "
                             "hyperparam_bounds")
        return found, {n: space.paths[n] for n in found}
    if not isinstance(value, dict) or not value:
        raise ValueError(f"`hyperparam_bounds` is {value!r}, but must be None or a non-empty dict of name -> [lo, hi] "
                         "or a numeric domain (automl.uniform, loguniform, randint, ...)")
    value = convert_tune("hyperparam_bounds", value)  # Ray Tune's domains become ours
    out: dict[str, Uniform | RandInt] = {}
    paths: dict[str, tuple[str, ...]] = {}
    for name, (path, b) in space.named("hyperparam_bounds", value).items():
        where = f"`hyperparam_bounds[{name!r}]`"
        if isinstance(b, (list, tuple)) and len(b) == 2 and all(finite_real(v) is not None for v in b):
            if not b[0] < b[1]:
                raise ValueError(f"{where} is {show(b)}, but `lo` must be < `hi`")
            ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in b)
            try:
                domain: Domain = RandInt(b[0], b[1]) if ints else Uniform(b[0], b[1])
            except (TypeError, ValueError) as e:
                raise type(e)(f"{where} is {show(b)}, but {e}") from None
        elif isinstance(b, numeric):
            domain = b
        else:
            raise ValueError(f"{where} is {show(b)}, but must be a [lo, hi] pair of finite numbers or a uniform, "
                             "loguniform, randint, lograndint, quniform, qloguniform or qrandint domain: PB2 explores "
                             "it continuously")
        own = space.domains.get(name)
        if own is not None and not isinstance(own, (*numeric, Constant)):
            raise ValueError(f"{where} is {b!r}, but `space[{name!r}]` is {own!r}: PB2 explores numbers only (a "
                             "computed or categorical value cannot take its bounds)")
        out[name], paths[name] = domain, path
    return out, paths


class PB2(PBT):
    """PBT (`automl.PBT`: its population, rounds, truncation selection and epoch counting) with PB2's explore step.

    Every `perturbation_interval` epochs, before exploiting, PB2 records for each member training one observation:
    (time k = lineage epochs / `perturbation_interval`, its explored hyper-parameters mapped to [0, 1], the change of
    its score over the last interval: how much the metric improved since the previous perturbation, for a clone
    since it started from its donor's weights). It fits a `TimeVaryingGP` on the newest `MAX_OBSERVATIONS` of them
    (`fit_tv_gp`) and gives each clone the explored values of `select_pb2_point` at time k, one clone after the
    other, each choice then pending for the next; the clone's other values are its donor's (as Tune's PB2; a
    `sample_from` value is computed again). Before the first observation (the first perturbation has no interval to
    measure), a clone's explored values are drawn uniformly within their bounds.

    `hyperparam_bounds` (Ray Tune's): name -> `[lo, hi]` (floats: uniform, two ints: randint) or a numeric domain
    (`uniform`, `loguniform` or `lograndint`, which are explored in log scale, `randint`, or a quantised one, whose
    multiples are kept; Ray Tune's `tune.uniform(...)`, ... too). A nested hyper-parameter is named as Tune names it,
    `{"arch": {"momentum": [0.8, 0.99]}}`, or `"arch/momentum"`. Every name must be one `space` holds (a domain or a
    constant, also a key inside a constant dict), and is explored within the bounds: a name the space lacks is
    refused, naming it and the names the space has (the first population takes its value from the space).
    None (the default): every numeric searched hyper-parameter of `space` (nested ones too) within its domain.
    Categorical and normal hyper-parameters are not explored: a clone keeps its donor's.

    Deterministic under `seed`: every random draw (the population, the candidates of the acquisition) comes from
    the procedure's generator, and the GP's hyper-parameters come from a fixed grid. Configs a person steers are
    outside the population, as in PBT.
    """

    def __init__(
        self,
        space: dict[str, Any],
        population: int,
        epochs: int,
        perturbation_interval: int,
        quantile_fraction: float = 0.25,
        seed: int = 0,
        *,
        hyperparam_bounds: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(space, population, epochs, perturbation_interval, quantile_fraction, seed)
        self.bounds, self._paths = _bounds(hyperparam_bounds, self.space)
        if any(isinstance(d, SampleFrom) for d in self.space.domains.values()):
            self._needs_assemble = True
        #: PB2's observations, oldest first: [time, x_1, ..., x_d, change of score] (floats, JSON-able)
        self.data: list[list[float]] = []
        self._gp: TimeVaryingGP | None = None
        self._now = 0.0
        self._pending: list[list[float]] = []

    _needs_assemble = False

    def _path(self, name: str) -> tuple[str, ...]:
        """The key path of the explored hyper-parameter `name` (a PB2 pickled before paths were kept: the space's)."""
        paths = vars(self).get("_paths") or {}
        return paths.get(name) or self.space.paths.get(name, (name,))

    def unit(self, config: dict[str, Any]) -> list[float]:
        """The explored hyper-parameters of `config` mapped to [0, 1], in `bounds` order."""
        values = []
        for name, domain in self.bounds.items():
            value: Any = config
            for key in self._path(name):
                value = value.get(key) if isinstance(value, dict) else None
            values.append(to_unit(domain, value))
        return values

    def _baseline(self, states: list[ConfigState], s: ConfigState) -> float | None:
        """The member's score one interval ago: from its own history, or (a clone in its first interval) its
        donor's score when it was cloned; None for an original member in its first interval."""
        if s.epochs > self.perturbation_interval:
            return self.score(s, epochs=s.epochs - self.perturbation_interval)
        if s.parent is not None and s.parent in self.offsets:
            return self.score(states[s.parent], epochs=self.offsets[s.id] - self.offsets[s.parent])
        return None

    def _observe(self, states: list[ConfigState], alive: list[ConfigState], bottom: list[int], t: int) -> None:
        self._now = float(t // self.perturbation_interval)
        for s in alive:
            before, now = self._baseline(states, s), self.score(s)
            if before is not None and math.isfinite(before) and math.isfinite(now):
                self.data.append([self._now, *self.unit(s.config), now - before])
        rows = np.asarray(self.data[-MAX_OBSERVATIONS:], float)
        self._gp = fit_tv_gp(rows[:, 1:-1], rows[:, 0], rows[:, -1]) if len(rows) else None
        self._pending = [self.unit(s.config) for s in alive if s.id not in bottom]

    def step(self, states: list[ConfigState]) -> Decision:
        decision = super().step(states)
        self._gp, self._pending = None, []  # fitted afresh at each perturbation: not saved with the run
        return decision

    def _explore(self, donor: ConfigState) -> dict[str, Any]:
        if self._gp is None:
            u = self._rng.random(len(self.bounds))
        else:
            u = select_pb2_point(self._gp, self._now, np.asarray(self._pending, float), self._rng)
        self._pending.append([float(v) for v in u])
        config = copy.deepcopy(donor.config)
        for (name, domain), v in zip(self.bounds.items(), u):
            path = self._path(name)
            target = config
            for key in path[:-1]:
                target = target.setdefault(key, {})
            target[path[-1]] = from_unit(domain, float(v))
        if self._needs_assemble:  # recompute the sample_from values from the new config
            assembled = self.space.assemble(self.space.flatten(config))
            config = {**assembled, **{k: v for k, v in config.items() if k not in assembled}}
        return config
