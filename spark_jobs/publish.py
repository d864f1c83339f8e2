"""Publish a file to a topic, every row once (redelivery.jobs.publish), with the redelivery package
installed where the driver runs:

    spark-submit spark_jobs/publish.py --topic orders --path orders.parquet --batch-id orders-1 \\
        [--format parquet|json|csv|orc]
"""

from redelivery.jobs.publish import main

if __name__ == "__main__":
    main()
