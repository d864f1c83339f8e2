"""Manual redrive of dead letters (see redelivery.airflow.dags.redrive)."""

from redelivery.airflow.dags.redrive import redrive_dag

dag = redrive_dag()
