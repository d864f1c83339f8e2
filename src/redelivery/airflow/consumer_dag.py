"""Deprecated import path, kept for one release:
``redelivery.airflow.consumer_dag`` moved to ``redelivery.airflow.dags.consumer``."""

import warnings

from redelivery.airflow.dags.consumer import http_consumer_dag

__all__ = ["http_consumer_dag"]

warnings.warn(
    "redelivery.airflow.consumer_dag moved to redelivery.airflow.dags.consumer "
    "(this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
