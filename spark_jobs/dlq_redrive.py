"""spark-submit entry point: a large redrive, batches in Spark tasks over message-id ranges.
The logic is redelivery.redrive; the dlq_redrive DAG submits this for selections over
redelivery.redrive.SPARK_THRESHOLD messages.

    spark-submit spark_jobs/dlq_redrive.py --run-key KEY --request '{"group": "g", "dry_run": false}'
"""

import argparse
import json

from redelivery.redrive import RedriveRequest, redrive
from redelivery.spark.session import get_spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-key", required=True)
    parser.add_argument("--triggered-by", default="")
    parser.add_argument("--request", required=True, type=RedriveRequest.model_validate_json)
    parser.add_argument("--spark-threshold", type=int, default=0)
    args = parser.parse_args()
    spark = get_spark("redelivery-dlq-redrive")
    try:
        result = redrive(
            args.request,
            run_key=args.run_key,
            triggered_by=args.triggered_by or None,
            spark=spark,
            spark_threshold=args.spark_threshold,
        )
    finally:
        spark.stop()
    print("REDELIVERY_REDRIVE " + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main()
