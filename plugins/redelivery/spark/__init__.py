"""Spark jobs' logic. Entry points in ``spark_jobs/`` parse arguments and call these."""
