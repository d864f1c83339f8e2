"""Run Python functions as Spark tasks with the DataFrame API only, so that the same job runs
through Spark Connect (which has no RDD API and no SparkContext) and through spark-submit.

``run_in_tasks(spark, task, items)`` makes one Spark task per item (``spark.range`` with one row
per partition, then ``mapInArrow``) and returns ``task(item)`` of each, in item order. The function
and the items travel to the Python workers pickled (cloudpickle), the results come back pickled:
``task`` must be importable on the workers (a module-level function of this package, or a
``functools.partial`` of one). Each task first checks that its executor runs the driver's
redelivery (``deploy.checked``: one line naming both versions otherwise). Spark may run a task
more than once (a retried or speculative attempt); every task of redelivery is one or more
guarded transactions, so a second attempt changes nothing the first one committed.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from redelivery.spark.deploy import map_partitions

T = TypeVar("T")
RESULT_SCHEMA = "index long, result binary"


def _run_partition(task: Callable[[Any], Any], items: Sequence[Any]):
    def run(batches: Iterator) -> Iterator:
        import pyarrow as pa

        for batch in batches:
            indexes = batch.column(0).to_pylist()
            results = [pickle.dumps(task(items[i])) for i in indexes]
            yield pa.RecordBatch.from_arrays(
                [pa.array(indexes, pa.int64()), pa.array(results, pa.binary())], names=["index", "result"]
            )

    return run


def run_in_tasks(spark, task: Callable[[T], Any], items: Sequence[T]) -> list[Any]:
    """``[task(item) for item in items]``, each call in a Spark task of its own (in parallel, as
    many at once as the cluster has cores). Raises what Spark raises when a task fails for good
    (``deploy.ExecutorEnvironmentError`` when an executor has not the driver's redelivery)."""
    if not items:
        return []
    count = len(items)
    rows = map_partitions(spark.range(0, count, 1, count), _run_partition(task, list(items)), RESULT_SCHEMA)
    results = dict((row["index"], pickle.loads(row["result"])) for row in rows)
    return [results[i] for i in range(count)]


def default_parallelism(spark) -> int:
    """How many tasks the session runs at once: ``spark.default.parallelism`` when set, else the
    cores of a ``local[N]`` master, else 2. Works on classic and Spark Connect sessions (Connect
    has no SparkContext to ask)."""
    for key in ("spark.default.parallelism", "spark.master"):
        try:
            value = spark.conf.get(key, None)
        except Exception:  # a Connect server that does not know the key
            value = None
        if not value:
            continue
        if key == "spark.default.parallelism":
            return max(1, int(value))
        if value.startswith("local["):
            cores = value[len("local[") :].split(",")[0].rstrip("]")
            return os.cpu_count() or 2 if cores == "*" else max(1, int(cores))
    return 2
