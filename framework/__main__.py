"""Command line: `python -m framework COMMAND --help` (the console script `modelhopper`): demo, show, replay, list,
status, watch, compare, export, resume, workers, pause, unpause, stop, resume-config, add, clone, extend, dashboard,
up, down (the warm local service, `framework.cluster.service`). The commands live in `framework.cli`, one module per
group of commands (`framework.cli.main` builds the parser)."""

import sys

from framework.cli.main import build_parser, entry, main

__all__ = ["build_parser", "entry", "main"]

if __name__ == "__main__":
    sys.exit(main())
