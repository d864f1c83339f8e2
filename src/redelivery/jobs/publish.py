"""spark-submit entry point: publish a file to a topic, every row once. The logic is
redelivery.spark.publishing.publish_dataframe: rows go partition by partition, each partition in
its order (one file under ``spark.sql.files.maxPartitionBytes``, 128 MB: in the file's order).

    spark-submit redelivery/jobs/publish.py --topic orders --path s3a://bucket/orders.parquet \\
        --batch-id orders-2026-03-01 [--format parquet|json|csv|orc]

``--path`` is anything Spark reads (a file, a folder of part files, a glob; local, HDFS, S3...).
Its columns are the message's, by name: ``body`` (string: JSON text, or binary), ``key``,
``content_type``, ``properties`` (optional); other columns are left out. A CSV file is read with
its header line naming the columns. ``--batch-id`` makes the publish exactly once: a run again
with the same id and content publishes nothing more. The database is REDELIVERY_DATABASE_URL
(default: the embedded PostgreSQL). Prints the batch's summary as one JSON line prefixed with
``REDELIVERY_PUBLISHED``; raises what ``publish_dataframe`` raises, before anything is published.
"""

import argparse
import json

from redelivery.spark.publishing import publish_dataframe
from redelivery.spark.session import get_spark

#: The formats ``--format`` takes: Spark's built-in readers.
FORMATS = ("parquet", "json", "csv", "orc")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", required=True)
    parser.add_argument("--path", required=True, help="what Spark reads: a file, a folder, a glob")
    parser.add_argument("--format", choices=FORMATS, default="parquet")
    parser.add_argument("--batch-id", required=True, help="the same id again publishes nothing more")
    args = parser.parse_args()
    spark = get_spark("redelivery-publish")
    try:
        reader = spark.read.format(args.format)
        if args.format == "csv":
            reader = reader.option("header", "true")
        messages = publish_dataframe(reader.load(args.path), args.topic, args.batch_id)
    finally:
        spark.stop()
    summary = {"topic": args.topic, "batch_id": args.batch_id, "path": args.path, "format": args.format}
    print("REDELIVERY_PUBLISHED " + json.dumps({**summary, "messages": messages}), flush=True)


if __name__ == "__main__":
    main()
