"""AutoML procedures on the epoch-level template (no Ray imports).

The contract (`Procedure.step(states) -> Decision`, `ConfigState`, `Procedure.bind`) lives in `automl._base`;
search spaces in `automl.space`; each procedure in its own module. `simulators.run_procedure_offline` drives a
procedure without Ray, on the engine's own driver loop.
"""

from automl._base import (
    ACTIVE,
    FAILED,
    PERSON,
    PROCEDURE,
    STATUSES,
    STOPPED,
    ConfigState,
    Decision,
    FixedEpochsProcedure,
    Procedure,
    check_states,
    own_active,
)
from automl._checks import json_exact
from automl.asha import ASHA, asha_promotable, asha_rungs
from automl.bohb import BOHB
from automl.grid import GridSearch
from automl.hyperband import Bracket, HyperBand, Rung, hyperband_brackets
from automl.optuna_search import OptunaSearch
from automl.pb2 import PB2
from automl.pbt import PBT, perturb
from automl.plugins import available_procedures, load_procedure
from automl.random_search import RandomSearch
from automl.space import (
    Categorical,
    Constant,
    Domain,
    LogRandInt,
    LogUniform,
    Normal,
    QLogRandInt,
    QLogUniform,
    QNormal,
    QRandInt,
    QUniform,
    RandInt,
    SampleFrom,
    SearchSpace,
    Uniform,
    choice,
    lograndint,
    loguniform,
    qlograndint,
    qloguniform,
    qrandint,
    qrandn,
    quniform,
    randint,
    randn,
    sample_from,
    uniform,
)
from automl.tpe import TPE

__all__ = [
    "ACTIVE",
    "ASHA",
    "BOHB",
    "FAILED",
    "PERSON",
    "PROCEDURE",
    "PB2",
    "PBT",
    "STATUSES",
    "STOPPED",
    "TPE",
    "Bracket",
    "Categorical",
    "ConfigState",
    "Constant",
    "Decision",
    "Domain",
    "FixedEpochsProcedure",
    "GridSearch",
    "HyperBand",
    "LogRandInt",
    "LogUniform",
    "Normal",
    "OptunaSearch",
    "Procedure",
    "QLogRandInt",
    "QLogUniform",
    "QNormal",
    "QRandInt",
    "QUniform",
    "RandInt",
    "RandomSearch",
    "Rung",
    "SampleFrom",
    "SearchSpace",
    "Uniform",
    "asha_promotable",
    "asha_rungs",
    "available_procedures",
    "check_states",
    "choice",
    "own_active",
    "hyperband_brackets",
    "json_exact",
    "load_procedure",
    "lograndint",
    "loguniform",
    "perturb",
    "qlograndint",
    "qloguniform",
    "qrandint",
    "qrandn",
    "quniform",
    "randint",
    "randn",
    "sample_from",
    "uniform",
]
