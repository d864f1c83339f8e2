"""One DAG per retry tier of the redelivery config file (see redelivery.airflow.dags.tiers)."""

from redelivery.airflow.dags.tiers import tier_dags

globals().update(tier_dags())
