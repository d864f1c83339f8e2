"""Spark jobs' logic. Entry points for spark-submit in ``jobs/``."""
