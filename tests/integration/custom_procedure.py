"""A user-written procedure, loaded by the engine from the string 'tests.integration.custom_procedure:TwoConfigs'."""

from __future__ import annotations

from automl import Decision, Procedure


class TwoConfigs(Procedure):
    """Adds two configs, trains them one epoch, then continues only the better one for a second epoch."""

    def __init__(self) -> None:
        self.round = 0

    def step(self, states):
        self.round += 1
        if not states:
            return Decision(add=[{"hidden": 16, "lr": 0.05, "batch_size": 64}, {"hidden": 32, "lr": 0.2, "batch_size": 64}])
        active = [s for s in states if s.status == "active"]
        if self.round == 2:
            ranked = sorted(active, key=self.score, reverse=True)
            return Decision(stop=[s.id for s in ranked[1:]])
        return Decision(stop=[s.id for s in active])
