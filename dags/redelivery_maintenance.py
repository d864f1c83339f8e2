"""Hourly retention cleanup (see redelivery.airflow.dags.maintenance)."""

from redelivery.airflow.dags.maintenance import maintenance_dag

dag = maintenance_dag()
