"""The command line for people without the UI: open a release, then materialize or backfill it.

    python -m jobs.cli setup-instance            # once per DAGSTER_HOME: instance file, pool limits
                                                 # (cluster profile: PostgreSQL, DAGSTER_PG_* variables)
    python -m jobs.cli add-release 2027          # adds release 2027 and its shards (idempotent)
    python -m jobs.cli materialize pmc_inventory --partition 2027   # one asset, one partition, here
    python -m jobs.cli pools                     # each pool's limit, the runs holding it, who waits
    python -m jobs.cli free-slots RUN_ID         # give back the slots of a run that died (kill -9)
    dagster asset materialize -m jobs.definitions --select pmc_inventory --partition 2027
    dagster asset materialize -m jobs.definitions --select pmc_raw_articles --partition '2027|000'

With the daemon running (``dagster dev`` or ``dagster-daemon run``), the inventory is enough: the
automation sensor ``panelforge_automation`` carries the release through every other stage.
(``dg launch --assets ... --partition ...`` is the same launch where dagster-dg-cli is installed.)

``add-release`` opens the release with ``PANELFORGE_SHARDS`` shards (refused when the lake was
created with another count) and records it in ``DAGSTER_HOME``'s instance, which ``dagster asset
materialize`` and ``dagster dev`` read; without it, ``--partition 2027`` fails because the partition
does not exist (``materialize`` says so, and to run ``add-release``).

A bad setting, a lake of another shard count or an instance that cannot be opened is one line on
stderr (exit status 2), never a traceback.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.cli", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add-release", help="open a release: add it and its shards as partitions")
    add.add_argument("release", help="the release key, a year such as 2027")
    sub.add_parser(
        "setup-instance",
        help="install the profile's instance file (deploy/dagster.yaml; cluster: deploy/dagster-cluster.yaml) "
        "into DAGSTER_HOME and set the pool limits",
    )
    sub.add_parser("pools", help="each pool's limit, the runs holding its slots and the steps waiting")
    free = sub.add_parser(
        "free-slots",
        help="give back the pool slots of a run whose process died (run monitoring does it by itself for "
        "runs it saw end)",
    )
    free.add_argument("run_id", help="the run's id (Runs in the UI, or `pools`)")
    free.add_argument(
        "--force",
        action="store_true",
        help="also for a run the instance still thinks in progress (a command-line run killed with -9): "
        "marks it failed first",
    )
    mat = sub.add_parser(
        "materialize",
        help="materialize one asset (one partition) in this process, in DAGSTER_HOME's instance "
        "(like `dagster asset materialize`, but a partition that is not open says so)",
    )
    mat.add_argument("asset", help="the asset's name, e.g. pmc_inventory")
    mat.add_argument("--partition", help="a release (2027) or a release and shard (2027|000)")
    args = parser.parse_args(argv)
    if args.command == "add-release" and not (args.release.isdigit() and len(args.release) == 4):
        parser.error(f"a release is named by its year (e.g. 2027), got {args.release!r}")

    from dagster import DagsterError

    from pipelines.core.errors import StageInputError

    try:
        return _command(args)
    except (StageInputError, DagsterError) as exc:  # settings, the lake's layout, the instance
        print(f"{parser.prog} {args.command}: {_first_line(exc)}", file=sys.stderr)
        return 2


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _command(args) -> int:
    if args.command in ("pools", "free-slots"):
        return pools_command(args)

    from dagster import DagsterInstance

    from assets.partitions import open_release
    from pipelines.core.lake import Lake
    from resources.settings import Settings

    settings = Settings.from_env()
    if args.command == "setup-instance":
        return setup_instance(settings)
    if args.command == "materialize":
        return materialize(args.asset, args.partition)
    Lake(settings.home).check_layout(settings.shards)  # another count than the lake's is refused
    with DagsterInstance.get() as instance:
        open_release(instance, args.release, settings.shards)
    print(f"release {args.release} is open with {settings.shards} shards")
    return 0


def missing_partition(instance, partition: str) -> str | None:
    """Why ``partition`` (``2027`` or ``2027|000``) cannot be materialized in ``instance``: the
    release or the shard is not open (None when both are)."""
    from assets.partitions import RELEASES, SHARDS

    release, _, shard = partition.partition("|")
    if release not in instance.get_dynamic_partitions(RELEASES):
        return f"release {release} is not open in this instance: run `python -m jobs.cli add-release {release}` first"
    if shard and shard not in instance.get_dynamic_partitions(SHARDS):
        return (
            f"shard {shard} does not exist in this instance (shards are opened with their release): "
            f"run `python -m jobs.cli add-release {release}` first"
        )
    return None


def materialize(asset: str, partition: str | None) -> int:
    """Run one asset's partition in this process against ``DAGSTER_HOME``'s instance."""
    from dagster import AssetKey, DagsterInstance

    from jobs.definitions import defs

    key = AssetKey(asset)
    if not defs.resolve_asset_graph().has(key):
        print(f"no asset named {asset!r}", file=sys.stderr)
        return 2
    with DagsterInstance.get() as instance:
        if partition is not None and (why := missing_partition(instance, partition)):
            print(why, file=sys.stderr)
            return 2
        job = defs.get_implicit_global_asset_job_def()
        result = job.execute_in_process(
            instance=instance, asset_selection=[key], partition_key=partition, raise_on_error=False
        )
    print(f"{asset}{f'[{partition}]' if partition else ''}: {'succeeded' if result.success else 'failed'}")
    return 0 if result.success else 1


def pools_command(args) -> int:
    """``pools`` and ``free-slots``: read or free the pool slots of ``DAGSTER_HOME``'s instance."""
    from dagster import DagsterInstance

    from jobs.pools import RunStillActive, free_slots, pools_report

    with DagsterInstance.get() as instance:
        if args.command == "pools":
            print(pools_report(instance))
            return 0
        try:
            held = free_slots(instance, args.run_id, force=args.force)
        except RunStillActive as exc:
            print(exc, file=sys.stderr)
            return 1
    freed = ", ".join(f"{h.step_key} in pool {pool}" for pool, h in held) or "none held"
    print(f"run {args.run_id}: freed {freed}")
    return 0


def setup_instance(settings) -> int:
    """Install the profile's instance file, then set the pool limits in that instance's storage.

    With the cluster profile the storage is PostgreSQL: a missing ``DAGSTER_PG_*`` variable or an
    unreachable server is reported in one line naming the host and port, never the password.
    """
    import os
    from pathlib import Path

    from jobs.instance import missing_postgres_env, prepare_instance

    home = os.environ.get("DAGSTER_HOME")
    if not home:
        print("DAGSTER_HOME is not set: point it at the directory of your Dagster instance", file=sys.stderr)
        return 2
    # a file already there is kept (the user's own, or the one Dagster's Helm chart mounts, which
    # writes the connection into the file): only the shipped cluster file needs the variables
    installs_cluster_file = settings.profile == "cluster" and not (Path(home) / "dagster.yaml").exists()
    if installs_cluster_file and (missing := missing_postgres_env(os.environ)):
        print(
            f"PANELFORGE_PROFILE=cluster keeps Dagster's instance in PostgreSQL: set {', '.join(missing)}",
            file=sys.stderr,
        )
        return 2
    print(f"instance file: {Path(home) / 'dagster.yaml'}")
    try:
        # under a lock: several set-ups started at once on a fresh SQLite home would corrupt it
        for pool, limit in prepare_instance(Path(home), settings).items():
            print(f"pool {pool}: {limit}")
    except Exception as exc:  # noqa: BLE001 - any storage failure ends here, with a readable line
        reason = _connection_failure(exc, os.environ.get("DAGSTER_PG_PASSWORD"))
        if reason is None or settings.profile != "cluster":  # SQLite's own errors keep their traceback
            raise
        where = f"{os.environ.get('DAGSTER_PG_HOST')}:{os.environ.get('DAGSTER_PG_PORT')}"
        print(f"cannot open the instance's PostgreSQL at {where}: {reason}", file=sys.stderr)
        return 1
    return 0


def _connection_failure(exc: BaseException, password: str | None) -> str | None:
    """The driver's first line when ``exc`` is a database that cannot be reached or refuses the
    login (dagster-postgres wraps it after its retries), else None.

    The password is masked even though libpq does not echo it: a secret never reaches a log.
    """
    import sqlalchemy.exc

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, sqlalchemy.exc.OperationalError):
            line = (str(seen.orig) or type(seen.orig).__name__).strip().splitlines()[0]
            return line.replace(password, "***") if password else line
        seen = seen.__cause__
    return None


if __name__ == "__main__":
    sys.exit(main())
