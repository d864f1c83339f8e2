"""spark-submit entry point: apply one tier window. The logic is redelivery.tiers.run.run_tier.

    spark-submit redelivery/jobs/tier_window.py --request '{"tier": "seconds",
        "window_end": "2026-01-01T00:00:10+00:00", "run_key": "manual-1"}' [--spark-threshold N]

``--request`` is a ``TierRunRequest`` as JSON (its other fields: ``window_start``, ``levels``,
``dry_run``). The database is REDELIVERY_DATABASE_URL (default: the embedded PostgreSQL). Prints
the run's summary as one JSON line prefixed with ``REDELIVERY_SUMMARY``.
"""

import argparse
import json

from redelivery.spark.session import get_spark
from redelivery.tiers.run import TierRunRequest, run_tier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--request", required=True, type=TierRunRequest.model_validate_json)
    parser.add_argument(
        "--spark-threshold",
        type=int,
        default=0,
        help="candidates under which the ranges run in the driver (0: the caller chose Spark already)",
    )
    args = parser.parse_args()
    spark = get_spark(f"redelivery-tier-{args.request.tier}")
    try:
        summary = run_tier(args.request, spark=spark, spark_threshold=args.spark_threshold)
    finally:
        spark.stop()
    print("REDELIVERY_SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
