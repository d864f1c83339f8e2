"""Open or close a subscription's circuit breaker by hand (see redelivery.airflow.dags.breaker)."""

from redelivery.airflow.dags.breaker import breaker_dag

dag = breaker_dag()
