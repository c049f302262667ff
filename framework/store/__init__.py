"""The run directory and everything that reads or writes it.

A run directory holds the catalog (`run.db`: configs, the schedule log, the meta, every row signed; `catalog.py`, with
the keys and signatures of `signing.py`), the checkpoints (`checkpoint.py`) and the inbox other processes append
commands to (`inbox.py`). `storage.py` says where run directories live (a folder, or a local copy mirrored to a
URI); `lock.py` is the writer lock that lets one process on a host write a run. Nothing outside this package opens
`run.db` or a checkpoint file itself (tested); the driver writes through `framework.driver.log.SQLiteRunLog`, the
`RunLog` contract of `framework.driver._base`.

No torch and no Ray at import (checkpoints import torch when one is written or read): the command line reads runs
without them.
"""
