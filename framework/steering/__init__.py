"""A run seen from another process: its status, and commands sent to it while it runs.

`status.py` reads a run's state from its directory (finished, running, crashed, running?, unknown or unreadable:
`run_status`) and waits for a run just launched (`wait_for_run`); `connect.py` is `framework.connect(run)`, a
`RunHandle` that watches a running run and steers it through its inbox. Below `ModelSelection`: the dashboard a run
serves reads and steers it through them; `framework.runs` gives their names to the command line.
"""
