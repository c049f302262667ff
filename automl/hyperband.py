"""HyperBand (Li, Jamieson, DeSalvo, Rostamizadeh and Talwalkar, "Hyperband: A Novel Bandit-Based Approach to
Hyperparameter Optimization", JMLR 18(185), 2017), run on Cerebro's epoch-level template (Cerebro, VLDB 2020,
section 4.2 and appendix E.1)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from automl._base import ACTIVE, PROCEDURE, ConfigState, Decision, Procedure, check_states
from automl._checks import check_int, check_seed, show
from automl.space import SearchSpace

#: the most configs a bracket table (times its `iterations`) may start: beyond, a run could not hold them
MAX_CONFIGS = 1_000_000


class Rung(NamedTuple):
    """Rung i of a bracket: `n` configs (n_i) trained to `r` epochs in total (r_i)."""

    n: int
    r: int


class Bracket(NamedTuple):
    """Bracket `s` of HyperBand: its rungs from the first (most configs, fewest epochs) to the last."""

    s: int
    rungs: tuple[Rung, ...]


def hyperband_brackets(max_epochs: int, eta: int = 3) -> list[Bracket]:
    """HyperBand's bracket table (Li et al., Algorithm 1), brackets from s = s_max down to 0.

    With R = `max_epochs`, s_max = floor(log_eta R) and B = (s_max + 1) R, bracket s starts
    n = ceil(B / R * eta^s / (s + 1)) configs at r = R eta^-s epochs; rung i keeps n_i = floor(n eta^-i) configs
    and trains them to r_i = r eta^i epochs. All arithmetic is exact integer arithmetic; when R is not a power of
    eta, r_i is rounded to the nearest int (halves up), which keeps r_i >= 1, strictly increasing, and the last
    rung at exactly R. For R = 81, eta = 3 this is Li et al.'s Table 1.
    """
    max_epochs = check_int("max_epochs", max_epochs, 1)
    eta = check_int("eta", eta, 2)
    s_max = 0
    while eta ** (s_max + 1) <= max_epochs:
        s_max += 1
    brackets = []
    for s in range(s_max, -1, -1):
        n = -(-(s_max + 1) * eta**s // (s + 1))  # ceil((s_max + 1) eta^s / (s + 1)) == ceil(B/R * eta^s/(s+1))
        rungs = []
        for i in range(s + 1):
            d = eta ** (s - i)  # r_i = R / d
            rungs.append(Rung(n=n // eta**i, r=max(1, (2 * max_epochs + d) // (2 * d))))
        brackets.append(Bracket(s=s, rungs=tuple(rungs)))
    return brackets


class HyperBand(Procedure):
    """Synchronous HyperBand: every bracket of `hyperband_brackets(max_epochs, eta)` runs successive halving.

    On the round template (Cerebro section 4.2) all brackets start together in the first round, so the engine sees
    sum(n_0) configs at once (143 for max_epochs=81, eta=3) and as many as it can train in parallel. A config
    trains one epoch per round; when the configs of a bracket reach r_i epochs, the procedure ranks all of them by
    their metric at epoch r_i (best first, ties broken by the smaller id; failed configs rank last), keeps the best
    n_{i+1} training (they continue from their weights to r_{i+1} epochs, the "resume" variant that Ray Tune also
    uses, instead of Li et al.'s retraining from scratch) and stops the rest. The last rung stops every config at
    max_epochs. Rung decisions are this procedure's own ranking of the whole rung, not an Optuna pruner, whose
    survivors would depend on the order in which results of the same round are reported.

    Configs are drawn from `space` with `numpy.random.default_rng(seed)`, bracket s_max first. `iterations` repeats
    the whole bracket table (Li et al.'s outer loop); the repeats run side by side from the first round, each with
    configs of its own.

    Configs a person steers keep every bracket valid: a config a person adds is in no bracket (it trains its own
    budget, `max_epochs` by default, and is never ranked); a member a person stops leaves its bracket, whose rung
    ranks it by what it reached (last when it did not get there) and promotes only from the members still training;
    a member a person resumes is the person's from then on, outside its bracket. The budget cannot be extended (the
    bracket table fixes it).
    """

    def __init__(
        self, space: dict[str, Any], max_epochs: int, eta: int = 3, seed: int = 0, iterations: int = 1
    ) -> None:
        self.space = SearchSpace(space)
        self.max_epochs = check_int("max_epochs", max_epochs, 1)
        self.eta = check_int("eta", eta, 2)
        self.seed = check_seed(seed)
        self.iterations = check_int("iterations", iterations, 1)
        table = hyperband_brackets(self.max_epochs, self.eta)
        starts = sum(bracket.rungs[0].n for bracket in table) * self.iterations
        if starts > MAX_CONFIGS:
            raise ValueError(f"`max_epochs` is {show(self.max_epochs)} (with `eta` {self.eta} and `iterations` "
                             f"{show(self.iterations)}), but its bracket table starts {show(starts)} configs, and at "
                             f"most {MAX_CONFIGS:,} may: use a smaller max_epochs or a larger eta")
        self.brackets = table * self.iterations
        self._issued = 0
        self._members: list[list[int]] = []  # per bracket: ids of its configs
        self._rung: list[int] = []  # per bracket: index of the rung its configs are training towards

    def epochs_per_config(self) -> int:
        return self.max_epochs

    def planned_epochs(self) -> int:
        """Each rung's configs train up to its epoch budget: sum over brackets and rungs of n_i * (r_i - r_{i-1})."""
        total = 0
        for bracket in self.brackets:
            before = 0
            for rung in bracket.rungs:
                total += rung.n * (rung.r - before)
                before = rung.r
        return total

    def step(self, states: list[ConfigState]) -> Decision:
        if not states and self._issued == 0:
            rng = np.random.default_rng(self.seed)
            add = []
            for bracket in self.brackets:
                n0 = bracket.rungs[0].n
                self._members.append(list(range(len(add), len(add) + n0)))
                self._rung.append(0)
                add.extend(self.space.sample(rng) for _ in range(n0))
            self._issued = len(add)
            return Decision(add=add)
        check_states(states, self._issued)
        stop: list[int] = []
        pruned: list[int] = []
        for b in range(len(self._members)):
            self._advance(b, states, stop, pruned)
        return Decision(stop=sorted(stop), pruned=sorted(pruned))

    def _advance(self, b: int, states: list[ConfigState], stop: list[int], pruned: list[int]) -> None:
        """Successive halving in bracket `b`: once its alive configs reach their rung, keep the best for the next
        rung (appending the others to `stop` and `pruned`), or stop them all at the last rung."""
        bracket = self.brackets[b]
        alive = [i for i in self._members[b] if states[i].status == ACTIVE and states[i].owner == PROCEDURE]
        i = self._rung[b]
        if i >= len(bracket.rungs) or not alive:
            return
        r = bracket.rungs[i].r
        if any(states[c].epochs < r for c in alive):
            return  # the rung is not complete yet (all alive configs of a bracket move in lockstep)
        if i == len(bracket.rungs) - 1:
            stop.extend(alive)
        else:
            ranked = self.rank([states[c] for c in self._members[b]], epochs=r)
            keep = set([c for c in ranked if c in alive][: bracket.rungs[i + 1].n])
            stop.extend(c for c in alive if c not in keep)
            pruned.extend(c for c in alive if c not in keep)
            self._members[b] = sorted(keep)
        self._rung[b] = i + 1
