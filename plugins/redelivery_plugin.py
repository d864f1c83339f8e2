"""Airflow plugin: the "Dead letters" page (redelivery.airflow.ui) in the Airflow UI's navigation,
and the trigger check of redelivery DAGs (redelivery.airflow.trigger_check)."""

from airflow.plugins_manager import AirflowPlugin

from redelivery.airflow.trigger_check import RefuseBadConf
from redelivery.airflow.ui import app


class RedeliveryPlugin(AirflowPlugin):
    name = "redelivery"
    fastapi_apps = [{"app": app, "url_prefix": "/redelivery", "name": "redelivery"}]
    # a trigger of a redelivery DAG with an unknown conf key or a refused value: 400, every problem
    fastapi_root_middlewares = [{"middleware": RefuseBadConf, "name": "redelivery-trigger-check"}]
    external_views = [
        {
            "name": "Dead letters",
            "href": "/redelivery/dlq",
            "url_route": "dead-letters",
            "destination": "nav",
            "category": "browse",
        }
    ]
