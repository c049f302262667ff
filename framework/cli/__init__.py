"""The command line, `python -m framework COMMAND --help` (the console script `modelhopper`), one module per group of
commands. Each group module holds its commands' handlers and an `add_parsers(sub, fmt)` that adds their subcommands
(each handler set with `set_defaults(func=...)`); a new command is one entry in one group module.

- `main`: `build_parser` (the top-level parser; the groups add their subcommands in the order `--help` lists them),
  `main` (one line and exit code 2 for bad input) and `entry` (the `modelhopper` console script)
- `common`: what the groups share: argument types, help texts, `_say`, the wait for a run that is starting, ...
- `selections`: demo, show, replay
- `service`: cleanup, and the warm local service runs attach to, up and down (`framework.cluster.service`)
- `status`: list, status, watch (they read run directories only)
- `steering`: workers, pause, unpause, stop, resume-config, add, clone, extend (a running run, through
  `framework.steering.connect`)
- `runs`: compare, export, resume, dashboard
- `registry`: a subcommand for each other command a running run takes (`framework.command_specs.COMMAND_ENTRIES`)

The commands about runs are thin glue over `framework.runs` (reading them), `framework.steering.connect` (steering a
running one) and `framework.dashboard` (a web page of one). When imported, a module imports only the standard
library, `framework.text` and its siblings here: what a command needs (pandas, torch, Ray) is imported by its
handler, so `--help` and the commands that read a run start fast.
"""
