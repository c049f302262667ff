"""The commands made from the command registry (`framework.command_specs.COMMAND_ENTRIES`): one subcommand for each
command a person may send a running run that has no hand-written one in `framework.cli.steering`; adding an entry
to the registry adds its subcommand here, with nothing to write."""

from __future__ import annotations

import argparse

from framework.cli.common import _ANSWER_WAIT, _ints_arg, _json_arg, _report, _seconds


def add_parsers(sub, fmt) -> None:
    """A subcommand for each command a person may send (`framework.command_specs.COMMAND_ENTRIES`, which the driver's
    `COMMANDS` pairs with handlers) that has no hand-written one (the other groups add theirs first): its required
    arguments positional, the others options (a bool as --NAME / --no-NAME), each read as the registry's type says;
    the driver checks them by the entry's rules. Reads the entries only, so `--help` imports neither the driver nor
    pandas."""
    from framework.command_specs import COMMAND_ENTRIES

    readers = {"int": int, "ints": _ints_arg, "json": _json_arg}
    for c in COMMAND_ENTRIES.values():
        name = c.subcommand
        if not c.outside or name in sub.choices:
            continue
        p = sub.add_parser(name, help=c.doc, formatter_class=fmt, description=f"{c.doc} (the `{c.name}` command). "
                           "Prints what the run's driver did with it (exit code 1 when it rejected it).")
        p.add_argument("run", help="run directory of a running run")
        for a in c.args:
            option = "--" + a.name.replace("_", "-")
            if a.type == "bool":
                p.add_argument(option, dest=f"arg_{a.name}", action=argparse.BooleanOptionalAction, default=None,
                               help=a.rule)
            elif a.required:
                p.add_argument(f"arg_{a.name}", metavar=a.name.upper(), type=readers[a.type], help=a.rule)
            else:
                p.add_argument(option, dest=f"arg_{a.name}", type=readers[a.type], default=None, help=a.rule)
        p.add_argument("--timeout", type=_seconds, default=60.0, help=_ANSWER_WAIT)
        p.set_defaults(func=_registry_command, registry_command=c.name)


def _registry_command(args: argparse.Namespace) -> int:
    """A command made from the registry (`add_parsers`): the arguments given, sent to the running run."""
    from framework.steering.connect import connect

    given = {k[len("arg_"):]: v for k, v in vars(args).items() if k.startswith("arg_") and v is not None}
    return _report([connect(args.run, source="cli").send(args.registry_command, timeout=args.timeout, **given)])
