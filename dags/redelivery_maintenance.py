"""Daily retention cleanup (see redelivery.airflow.maintenance_dag)."""

from redelivery.airflow.maintenance_dag import maintenance_dag

dag = maintenance_dag()
