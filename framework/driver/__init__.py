"""The driver: one event loop over a `Backend` (see `framework.driver.loop`)."""

from framework.driver._state import RunState
from framework.driver.log import MemoryRunLog, SQLiteRunLog
from framework.driver.loop import Driver

__all__ = ["Driver", "MemoryRunLog", "RunState", "SQLiteRunLog"]
