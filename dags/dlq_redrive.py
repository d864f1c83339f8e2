"""Manual redrive of dead letters (see redelivery.airflow.redrive_dag)."""

from redelivery.airflow.redrive_dag import redrive_dag

dag = redrive_dag()
