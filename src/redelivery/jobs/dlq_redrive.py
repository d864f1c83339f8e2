"""spark-submit entry point: a large redrive, batches in Spark tasks over message-id ranges.
The logic is redelivery.redrive; the engine hook (redelivery.airflow.engine) records the request
under its run key (redelivery.redrive.open_run) and submits this for selections of at least the config's
spark_threshold messages. The request is read from the state store by its key: it never travels
as an argument (Linux caps one at 128 KiB; a list of message ids passes that).

    spark-submit redelivery/jobs/dlq_redrive.py --run-key KEY [--spark-threshold N]
"""

import argparse
import json

from redelivery.redrive import redrive, request_of_run
from redelivery.spark.session import get_spark
from redelivery.store import db


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-key", required=True)
    parser.add_argument("--spark-threshold", type=int, default=0)
    args = parser.parse_args()
    with db.connect(db.database_url(), autocommit=True) as conn:
        request, triggered_by = request_of_run(conn, args.run_key)
    spark = get_spark("redelivery-dlq-redrive")
    try:
        result = redrive(
            request,
            run_key=args.run_key,
            triggered_by=triggered_by,
            spark=spark,
            spark_threshold=args.spark_threshold,
        )
    finally:
        spark.stop()
    print("REDELIVERY_REDRIVE " + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main()
