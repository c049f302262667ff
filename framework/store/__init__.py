"""The run directory and everything that reads or writes it.

A run directory holds the catalog (`run.db`: configs, the schedule log, the signed meta; `catalog.py`), the signing key
that authenticates it (`signing.py`), the checkpoints (`checkpoint.py`) and the inbox other processes append commands
to (`inbox.py`). `storage.py` says where run directories live (a folder or a URI); `status.py` reads a run's state
from outside it and `steering.py` sends it commands. Nothing outside this package opens `run.db` or a checkpoint file
itself. The driver writes through `framework.driver.log.CatalogRunLog`, the `RunLog` contract of
`framework.driver._base`.

No torch, no Ray: the command line and the dashboard read runs with this package alone.
"""
