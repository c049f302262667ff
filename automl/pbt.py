"""Population based training (Jaderberg, Dalibard, Osindero, Czarnecki, Donahue, Razavi, Vinyals, Green, Dunning,
Simonyan, Fernando and Kavukcuoglu, "Population Based Training of Neural Networks", arXiv:1711.09846, 2017), on
Cerebro's epoch-level template (Cerebro, VLDB 2020, section 4.2)."""

from __future__ import annotations

import copy
import math
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from automl._base import ACTIVE, PROCEDURE, ConfigState, Decision, Procedure, check_states
from automl._checks import check_fraction, check_int, check_seed, finite_real, json_exact, show
from automl.space import (
    Categorical,
    Constant,
    Domain,
    Normal,
    RandInt,
    SampleFrom,
    SearchSpace,
    Uniform,
    convert_tune,
)


def perturb(space: SearchSpace, config: dict[str, Any], rng: np.random.Generator, resample_probability: float) -> dict:
    """PBT's explore step: each searched hyper-parameter of `config` moved a little, kept inside `space`.

    Floats and ints (normal ones too) are multiplied by 0.8 or 1.2 (each with probability 1/2) and clipped to
    `[lo, hi]` (ints rounded, quantised values rounded to a multiple of `q`); a categorical value is redrawn from its
    list with probability `resample_probability`, else moved to a neighbouring entry of the list (clipped at the
    ends). Constants stay; `sample_from` values are computed again from the perturbed config. Draws happen in the
    space's key order (nested spaces depth first, as `SearchSpace.domains`).
    """
    values = space.flatten(config)
    out = {}
    for name, domain in space.domains.items():
        value = values[name]
        if isinstance(domain, (Constant, SampleFrom)):
            out[name] = value
        elif isinstance(domain, (Uniform, RandInt, Normal)):
            out[name] = domain.clip(value * (0.8 if rng.random() < 0.5 else 1.2))
        elif isinstance(domain, Categorical):
            if rng.random() < resample_probability:
                out[name] = domain.sample(rng)
            else:
                i = domain.index(value) + (-1 if rng.random() < 0.5 else 1)
                out[name] = domain.choices[min(max(i, 0), len(domain.choices) - 1)]
        else:
            raise TypeError(f"`space[{name!r}]` is {domain!r}, which PBT cannot perturb")
    return space.assemble(out)


@dataclass(frozen=True)
class CallableMutation(Domain):
    """A mutation given as a function of no argument (Ray Tune's `hyperparam_mutations={"lr": lambda: ...}`): a
    resample is `fn()`; otherwise a number is multiplied by a perturbation factor (an int stays an int, as in Tune),
    and a value that is not a number is resampled. `fn` draws from a generator of its own, which the procedure's
    seed does not repeat: a domain (`automl.uniform(...)`) does. It must pickle (the procedure is saved with the
    run)."""

    fn: Callable[[], Any]

    def __post_init__(self) -> None:
        try:
            pickle.dumps(self.fn)
        except Exception as e:  # noqa: BLE001 (what pickle raises varies)
            raise TypeError(f"its function {self.fn!r} must pickle (a module-level function, not a lambda or a nested "
                            f"function): procedures are saved with the run ({type(e).__name__}); or write a domain "
                            "(automl.uniform, loguniform, randint, ...), which the seed repeats") from None

    def sample(self, rng: np.random.Generator) -> Any:
        return json_exact(f"what {getattr(self.fn, '__qualname__', self.fn)!s}() returned", self.fn())

    def contains(self, value: Any) -> bool:
        return finite_real(value) is not None

    def clip(self, value: Any) -> Any:
        return value


def _get(config: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        config = config.get(key) if isinstance(config, dict) else None
    return config


def _set(config: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        config = config.setdefault(key, {})
    config[path[-1]] = value


def mutate(mutations: SearchSpace, config: dict[str, Any], rng: np.random.Generator, resample_probability: float,
           factors: tuple[float, ...]) -> dict:
    """PBT's explore step with Ray Tune's `hyperparam_mutations`: only the hyper-parameters named in `mutations`
    change (nested ones at their key path). Each is redrawn from its domain with probability `resample_probability`
    (or when the config's value is not in it); else a number is multiplied by one of `factors` (drawn uniformly) and
    kept inside its domain (clipped, ints rounded, quantised values snapped), and a list's value moves to a
    neighbouring entry (clipped at the ends). The rest of `config` is copied. Draws happen in `mutations`' key
    order."""
    out = copy.deepcopy(config)
    for name, domain in mutations.domains.items():
        path = mutations.paths[name]
        value = _get(config, path)
        if rng.random() < resample_probability or not domain.contains(value):
            new = domain.sample(rng)
        elif isinstance(domain, Categorical):
            i = domain.index(value) + (-1 if rng.random() < 0.5 else 1)
            new = domain.choices[min(max(i, 0), len(domain.choices) - 1)]
        else:
            new = domain.clip(value * factors[int(rng.integers(len(factors)))])
            if isinstance(domain, CallableMutation) and isinstance(value, int) and not isinstance(value, bool):
                new = int(new)
        _set(out, path, new)
    return out


_MUTABLE = (Uniform, RandInt, Normal, Categorical, CallableMutation)


def _mutations(value: Any, space: SearchSpace) -> SearchSpace | None:
    """Ray Tune's `hyperparam_mutations` as a space of the named hyper-parameters (nested as `space`)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        raise ValueError(f"`hyperparam_mutations` is {value!r}, but must be None or a non-empty dict of name -> "
                         "list, domain (automl.uniform, ...) or function")
    value = convert_tune("hyperparam_mutations", value)  # Tune's domains become ours (tune.choice a Categorical)
    nested: dict[str, Any] = {}
    for name, (path, entry) in space.named("hyperparam_mutations", value).items():
        where = f"`hyperparam_mutations[{name!r}]`"
        if isinstance(entry, (list, tuple)):
            if not entry:
                raise ValueError(f"{where} is {show(entry)}, but a list of values must hold at least one")
            try:
                domain: Domain | None = Categorical(tuple(entry))
            except (TypeError, ValueError) as e:
                raise type(e)(f"{where} is {show(entry)}: {e}") from None
        elif isinstance(entry, Domain):
            domain = entry
        elif callable(entry):
            try:
                domain = CallableMutation(entry)
            except TypeError as e:
                raise TypeError(f"{where} is {show(entry)}, but {e}") from None
        else:
            domain = None
        if not isinstance(domain, _MUTABLE):
            raise ValueError(f"{where} is {show(entry)}, but must be a list, a random domain (automl.uniform, "
                             "loguniform, randint, ...) or a function of no argument: PBT mutates it")
        if isinstance(space.domains.get(name), SampleFrom):
            raise ValueError(f"{where} is {show(entry)}, but `space[{name!r}]` is computed by sample_from: PBT "
                             "computes it again from the config, it does not mutate it")
        _set(nested, path, domain)
    return SearchSpace(nested)


def _factors(value: Any) -> tuple[float, ...]:
    ok = isinstance(value, (list, tuple)) and len(value) > 0 and all(
        (f := finite_real(v)) is not None and f > 0 for v in value)
    if not ok:
        raise ValueError(f"`perturbation_factors` is {show(value)}, but must be a non-empty tuple of finite numbers > 0")
    return tuple(float(f) for f in value)


class PBT(Procedure):
    """Synchronous PBT with truncation selection on the round template.

    `population` configs drawn from `space` start in the first round. Every `perturbation_interval` epochs the
    members are ranked by the metric; the bottom `quantile_fraction` (ceil of it, at most half the population) are
    stopped and each is replaced by a clone of a top-quantile donor (exploit: `Decision.clone=(donor_id, config)`,
    which starts from the donor's latest weights) with perturbed hyper-parameters (explore: `perturb`). The i-th
    worst member gets the (i mod q)-th best donor, so the best donor is copied first. A member that failed is
    replaced at the next perturbation as well. No exploit happens at the last epoch.

    Epoch counting: the engine's `ConfigState.epochs` of a clone restarts at 0, though its weights have already
    seen its donor's epochs. PBT keeps `offsets[id]` (the donor's lineage epochs at cloning time) and uses
    `offsets[id] + epochs` as a member's progress: perturbations happen when it reaches a multiple of
    `perturbation_interval`, and a member stops when it reaches `epochs`, so every lineage trains exactly `epochs`
    epochs and the population stays in lockstep (a clone trains in the round after its donor's perturbation, as
    its donor does).

    Configs a person steers stay outside the population: a config a person adds or clones trains its own budget
    (`epochs` by default) and is never a donor nor replaced; a member a person stops is replaced by a clone at the
    next perturbation, like a failed one; a member a person resumes leaves the population. The budget cannot be
    extended.

    `hyperparam_mutations` (as Ray Tune's): a dict of name -> a list of values, a domain (ours, or Ray Tune's
    `tune.uniform(...)`, `tune.choice([...])`, ..., converted as in a space) or a function of no argument (Tune's
    `lambda: ...`; it must pickle, so a module-level one). A nested hyper-parameter is named as Tune names it,
    `{"arch": {"momentum": [0.8, 0.9, 0.99]}}`, or `"arch/momentum"`. Only those hyper-parameters change at an exploit
    (`mutate`: redrawn with probability `resample_probability`, else multiplied by one of `perturbation_factors` or
    moved to a neighbouring list entry). Every name must be one `space` holds (a domain or a constant, also a key
    inside a constant dict): a name it lacks is refused, naming it and the names it has (put the hyper-parameter in
    the space, as a constant or a domain, to give the first population its value). Without it, every searched
    hyper-parameter of `space` is perturbed (`perturb`).
    """

    #: Probability that a hyper-parameter is redrawn instead of moved (as Ray Tune; without `hyperparam_mutations`,
    #: only categorical ones are redrawn).
    resample_probability = 0.25
    #: Ray Tune's `hyperparam_mutations` as a space (None: every searched hyper-parameter of `space` is perturbed).
    mutations: SearchSpace | None = None
    #: What a mutated number is multiplied by (one drawn uniformly), as Tune's `perturbation_factors`.
    perturbation_factors: tuple[float, ...] = (1.2, 0.8)

    def __init__(
        self,
        space: dict[str, Any],
        population: int,
        epochs: int,
        perturbation_interval: int,
        quantile_fraction: float = 0.25,
        seed: int = 0,
        *,
        hyperparam_mutations: dict[str, Any] | None = None,
        resample_probability: float = 0.25,
        perturbation_factors: tuple[float, ...] = (1.2, 0.8),
    ) -> None:
        self.space = SearchSpace(space)
        self.mutations = _mutations(hyperparam_mutations, self.space)
        self.resample_probability = check_fraction("resample_probability", resample_probability)
        self.perturbation_factors = _factors(perturbation_factors)
        self.population = check_int("population", population, 2)
        self.epochs = check_int("epochs", epochs, 1)
        self.perturbation_interval = check_int("perturbation_interval", perturbation_interval, 1)
        self.quantile_fraction = check_fraction("quantile_fraction", quantile_fraction, low_open=True, high=0.5)
        self.seed = check_seed(seed)
        self._rng = np.random.default_rng(seed)
        self._issued = 0
        self.members: list[int] = []  # the current population, one id per slot
        self.offsets: dict[int, int] = {}  # id -> lineage epochs inherited from its donor

    def progress(self, state: ConfigState) -> int:
        """Epochs of `state`'s lineage: inherited ones plus its own."""
        return self.offsets[state.id] + state.epochs

    def epochs_per_config(self) -> int:
        return self.epochs

    def completes_budget(self, state: ConfigState) -> bool:
        """A member's lineage trained `epochs` epochs (a clone counts its donor's)."""
        return state.id in self.offsets and self.progress(state) >= self.epochs

    def planned_epochs(self) -> int:
        """Every lineage trains `epochs` epochs (a clone continues its donor's count)."""
        return self.population * self.epochs

    def _observe(self, states: list[ConfigState], alive: list[ConfigState], bottom: list[int], t: int) -> None:
        """Called at every perturbation, before the clones' configs are chosen: `alive` are the members training,
        `bottom` the ids about to be replaced, `t` the lineage epochs. PBT learns nothing (PB2 fits its model)."""

    def _explore(self, donor: ConfigState) -> dict[str, Any]:
        """The config of a clone of `donor` (PBT's explore step: `perturb`, or `mutate` with
        `hyperparam_mutations`), drawn from the procedure's generator."""
        if self.mutations is None:
            return perturb(self.space, donor.config, self._rng, self.resample_probability)
        return mutate(self.mutations, donor.config, self._rng, self.resample_probability, self.perturbation_factors)

    def step(self, states: list[ConfigState]) -> Decision:
        if self._issued == 0:
            add = [self.space.sample(self._rng) for _ in range(self.population)]
            self.members = list(range(self.population))
            self.offsets = dict.fromkeys(self.members, 0)
            self._issued = self.population
            return Decision(add=add)
        check_states(states, self._issued)
        alive = [states[m] for m in self.members if states[m].status == ACTIVE and states[m].owner == PROCEDURE]
        if not alive:
            return Decision()
        t = max(self.progress(s) for s in alive)
        if t >= self.epochs:
            return Decision(stop=sorted(s.id for s in alive if self.progress(s) >= self.epochs))
        if t % self.perturbation_interval or any(self.progress(s) != t for s in alive):
            return Decision()
        ranked = self.rank(alive)
        n_q = min(math.ceil(len(alive) * self.quantile_fraction), len(alive) // 2)
        donors = ranked[: max(n_q, 1)]
        bottom = ranked[::-1][:n_q]  # worst first
        failed = [m for m in self.members if states[m].status != ACTIVE or states[m].owner != PROCEDURE]
        self._observe(states, alive, bottom, t)
        clone = []
        for j, victim in enumerate(bottom + failed):
            donor = donors[j % len(donors)]
            clone.append((donor, self._explore(states[donor])))
            new_id = len(states) + j
            self._issued += 1
            self.offsets[new_id] = self.progress(states[donor])
            self.members[self.members.index(victim)] = new_id
        return Decision(stop=sorted(bottom), clone=clone, pruned=sorted(bottom))
