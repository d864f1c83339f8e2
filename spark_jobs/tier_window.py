"""spark-submit entry point: apply one tier window. The logic is redelivery.spark.tier_job.

    spark-submit spark_jobs/tier_window.py --tier seconds --window-end 2026-01-01T00:00:10+00:00 \
        --run-key manual-1 [--window-start ...] [--levels 1,2] [--dry-run [true|false]] [--spark-threshold N]

The database is REDELIVERY_DATABASE_URL (default: the embedded PostgreSQL). Prints the run's
summary as one JSON line prefixed with ``REDELIVERY_SUMMARY``.
"""

import argparse
import json
from datetime import datetime

from redelivery.spark.session import get_spark
from redelivery.spark.tier_job import run_tier_window


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", required=True)
    parser.add_argument("--window-end", required=True, type=datetime.fromisoformat)
    parser.add_argument("--window-start", type=lambda s: datetime.fromisoformat(s) if s else None)
    parser.add_argument("--run-key", required=True)
    parser.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",") if x.strip()] if s else None)
    parser.add_argument(
        "--dry-run",
        nargs="?",
        const="true",
        default="false",
        type=lambda s: s.strip().lower() in ("1", "true", "yes"),
    )
    parser.add_argument(
        "--spark-threshold",
        type=int,
        default=0,
        help="candidates under which the ranges run in the driver (the operator decided already)",
    )
    args = parser.parse_args()
    spark = get_spark(f"redelivery-tier-{args.tier}")
    try:
        summary = run_tier_window(
            tier=args.tier,
            window_end=args.window_end,
            window_start=args.window_start,
            run_key=args.run_key,
            levels=args.levels,
            dry_run=args.dry_run,
            spark=spark,
            spark_threshold=args.spark_threshold,
        )
    finally:
        spark.stop()
    print("REDELIVERY_SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
