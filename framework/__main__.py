"""Command line: `python -m framework demo|show|replay --help`."""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def _demo(args: argparse.Namespace) -> int:
    import automl
    import framework
    from framework.examples import classifier_eval_fn, classifier_train_fn, digits_arrays, mlp_model_fn

    x, y = digits_arrays()
    ds = framework.PartitionedDataset.from_arrays(x, y, num_partitions=args.workers, seed=args.seed)
    space = {"hidden": [32, 128], "lr": [0.01, 0.05, 0.2], "batch_size": [32], "optimizer": ["sgd"]}
    print(f"Model selection on scikit-learn digits: {len(x)} images, {args.workers} partitions/workers, "
          f"grid of {2 * 3} MLP configs x {args.epochs} epochs, scheduler={args.scheduler}")
    sel = framework.ModelSelection(
        mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds, automl.GridSearch(space, epochs=args.epochs),
        num_workers=args.workers, scheduler=args.scheduler, seed=args.seed, storage_path=args.storage_path,
        metric="valid_accuracy", mode="max",
    )
    result = sel.run()
    board = result.leaderboard()
    board["config"] = board.config_id.map(result.configs)
    print("\nLeaderboard (latest epoch):")
    print(board[["config_id", "valid_accuracy", "valid_loss", "train_loss", "config"]].to_string(index=False))
    print(f"\nBest config {result.best_config_id}: {result.best_config}")
    print(f"Results written to {result.storage_path} (metrics.csv, schedule.csv, leaderboard.csv, checkpoints/, "
          f"run.db, learning_curves.png)")
    return 0


def _show(args: argparse.Namespace) -> int:
    from framework import Result

    result = Result.open(args.storage_path)
    print(result)
    print(result.leaderboard().to_string(index=False))
    if not result.failures.empty:
        print("\nFailed configs:")
        for row in result.failures.itertuples():
            print(f"--- config {row.config_id}\n{row.error}")
    return 0


def _replay(args: argparse.Namespace) -> int:
    import framework

    result = framework.replay(args.storage_path, out_path=args.out, device=args.device)
    print(f"Replayed into {result.storage_path}")
    print(result.leaderboard().to_string(index=False))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m framework", description="Model hopper parallelism on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a small model selection on an embedded local Ray")
    demo.add_argument("--workers", type=int, default=2, help="partitions and worker actors (default 2)")
    demo.add_argument("--epochs", type=int, default=5)
    demo.add_argument("--scheduler", default="randomized")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--storage-path", default=None, help="run directory (default: a new folder under ./runs)")
    demo.set_defaults(func=_demo)
    show = sub.add_parser("show", help="print the leaderboard and failures of a run directory")
    show.add_argument("storage_path")
    show.set_defaults(func=_show)
    rep = sub.add_parser("replay", help="re-run a finished run from its schedule log (bit-identical on CPU)")
    rep.add_argument("storage_path")
    rep.add_argument("--out", default=None, help="output directory (default: <storage_path>/replay)")
    rep.add_argument("--device", default=None,
                     help="where to train: cpu, cuda, cuda:1 (default: the run's device)")
    rep.set_defaults(func=_replay)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
