"""One DAG per retry tier of the redelivery config file (see redelivery.airflow.dags)."""

from redelivery.airflow.dags import tier_dags

globals().update(tier_dags())
