"""Commands that run a selection or print one's results: `demo` (a small model selection on an embedded local Ray),
`show` (a run's leaderboard and failures, read from its directory) and `replay` (a finished run again from its
schedule log)."""

from __future__ import annotations

import argparse

from framework.cli.common import _ACCEPT_CHANGED, _board_text, _count, _pack, _positive_int, _ran, _say


def _demo(args: argparse.Namespace) -> int:
    import automl
    import framework
    from framework.examples import classifier_step_fn, digits_arrays, mlp_model_fn

    x, y = digits_arrays()
    ds = framework.PartitionedDataset.from_arrays(x, y, num_partitions=args.workers, seed=args.seed)
    space = {"hidden": [32, 128], "lr": [0.01, 0.05, 0.2], "batch_size": [32], "optimizer": ["sgd"]}
    _say(f"Model selection on scikit-learn digits: {len(x)} images, {args.workers} partitions/workers, "
         f"grid of {2 * 3} MLP configs x {args.epochs} epochs, scheduler={args.scheduler}")
    sel = framework.ModelSelection(
        mlp_model_fn, step_fn=classifier_step_fn, dataset=ds, procedure=automl.GridSearch(space, epochs=args.epochs),
        num_workers=args.workers, scheduler=args.scheduler, seed=args.seed, storage_path=args.storage_path,
        metric="valid_accuracy", mode="max", pack=args.pack,
    )
    result = sel.run()
    board = result.leaderboard()
    board["config"] = board.config_id.map(result.configs)
    _say("\nLeaderboard (latest epoch):")
    _say(board[["config_id", "valid_accuracy", "valid_loss", "train_loss", "config"]].to_string(index=False))
    _say(f"\nBest config {result.best_config_id}: {result.best_config}")
    _say(f"Results written to {result.storage_path} (metrics.csv, schedule.csv, leaderboard.csv, checkpoints/, "
         f"run.db, learning_curves.png)")
    return _ran(result, args)


def _show(args: argparse.Namespace) -> int:
    from framework.steering.status import open_result
    from framework.store.catalog import CatalogError

    with open_result(args.storage_path) as result:  # a run opened from a URI is a temporary copy: removed after
        try:
            return _print_run(result, args)
        except (KeyError, TypeError, IndexError, AttributeError) as e:
            if result.verified:
                raise
            # rows of an edited catalog need not fit together: say so in one line, as for any unverified run
            raise CatalogError(f"the run in {args.storage_path!r} is not verified and its rows do not fit together "
                               f"({type(e).__name__}: {e})") from e


def _print_run(result, args: argparse.Namespace) -> int:
    import json

    board = result.get_dataframe(args.metric, args.mode, args.scope)
    if args.top is not None:
        board = board.head(args.top)
    if args.json:
        out = {"storage_path": result.storage_path, "metric": args.metric or result.metric,
               "mode": args.mode or result.mode, "configs": len(result.configs),
               "leaderboard": json.loads(board.to_json(orient="records")),
               "failures": json.loads(result.failures.to_json(orient="records"))}
        _say(json.dumps(out, indent=1))
        return 0
    _say(result)
    _say(_board_text(result, board))
    if not result.failures.empty:
        _say("\nFailed configs:")
        for row in result.failures.itertuples():
            _say(f"--- config {row.config_id}\n{row.error}")
    return 0


def _replay(args: argparse.Namespace) -> int:
    import framework
    from framework.store.storage import unusable_dir

    why = unusable_dir(args.out) if args.out is not None else None
    if why is not None:
        raise ValueError(f"`--out` is {args.out!r}, but {why}: it must be a new folder (or one that holds no run)")
    result = framework.replay(args.storage_path, out_path=args.out, device=args.device,
                              trust_unverified=args.trust_unverified, accept_changed_data=args.accept_changed_data)
    _say(f"Replayed into {result.storage_path}")
    _say(result.leaderboard().drop(columns=["round"], errors="ignore").to_string(index=False))
    return _ran(result, args)


def add_parsers(sub, fmt) -> None:
    """demo, show and replay."""
    demo = sub.add_parser("demo", help="run a small model selection on an embedded local Ray", formatter_class=fmt)
    demo.add_argument("--workers", type=_positive_int, default=2, help="partitions and worker actors")
    demo.add_argument("--epochs", type=_positive_int, default=5, help="epochs per config")
    demo.add_argument("--scheduler", default="randomized", help="a name from framework.scheduling.SCHEDULERS")
    demo.add_argument("--seed", type=_count, default=0, help="run seed")
    demo.add_argument("--pack", type=_pack, default=1,
                      help="configs of one architecture a worker trains at once as one fused model: 1..16 or auto")
    demo.add_argument("--storage-path", default=None,
                      help="run directory or URI (None: a new folder under $MODELHOPPER_STORAGE or ~/modelhopper_runs)")
    demo.set_defaults(func=_demo)
    show = sub.add_parser("show", help="print a run's leaderboard and failures (reads only)", formatter_class=fmt)
    show.add_argument("storage_path", help="run directory (or the URI it was mirrored to)")
    show.add_argument("--top", type=_positive_int, default=None, help="show only the best N configs (None: all)")
    show.add_argument("--metric", default=None, help="rank by this metric (None: the run's)")
    show.add_argument("--mode", choices=("min", "max"), default=None, help="min or max (None: the run's)")
    show.add_argument("--scope", default="last",
                      help="rank each config by its last epoch (last), its best (all), or the mean over all or its "
                           "last N epochs (avg, last-N-avg)")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.set_defaults(func=_show)
    rep = sub.add_parser("replay", help="re-run a finished run from its schedule log (bit-identical on CPU)",
                         formatter_class=fmt)
    rep.add_argument("storage_path", help="run directory (or the URI it was mirrored to)")
    rep.add_argument("--out", default=None,
                     help="a new output directory (None: <storage_path>-replay beside the run, or -replay-2, ... "
                          "if taken)")
    rep.add_argument("--device", default=None, help="where to train: cpu, cuda, cuda:1 (None: the run's device)")
    rep.add_argument("--trust-unverified", action="store_true",
                     help="replay a run whose run.db does not verify under this machine's key (one from someone "
                          "else, or edited); it still imports no function the run names")
    rep.add_argument("--accept-changed-data", action="store_true", help=_ACCEPT_CHANGED)
    rep.set_defaults(func=_replay)
