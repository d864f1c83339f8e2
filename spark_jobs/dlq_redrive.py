"""A large redrive recorded under its run key (redelivery.jobs.dlq_redrive: the engine hook
submits the same job), with the redelivery package installed where the driver runs:

    spark-submit spark_jobs/dlq_redrive.py --run-key KEY [--spark-threshold N]
"""

from redelivery.jobs.dlq_redrive import main

if __name__ == "__main__":
    main()
