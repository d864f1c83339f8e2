"""Standing redrive policies' ticks (see redelivery.airflow.dags.standing)."""

from redelivery.airflow.dags.standing import standing_dag

dag = standing_dag()
