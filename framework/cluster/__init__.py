"""The Ray cluster a run uses: finding or starting it, and what outlives a run on it.

`ray_start.py` attaches to a cluster or starts an embedded local one, `orphans.py` stops the processes of an embedded
Ray whose driver was killed, `service.py` is `modelhopper up`'s long-lived cluster and `implicit_ray.py` starts Ray
on first use. `spares.py` keeps the worker actors a finished run leaves for the next run of the process. No torch:
the worker actors themselves, and the pool of them `modelhopper up` serves, are `framework.engine`'s.
"""
