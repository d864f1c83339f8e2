"""Airflow glue: the Airflow environment, the tier operator and the DAG factory."""
