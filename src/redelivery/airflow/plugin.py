"""Airflow plugin: the "Dead letters" page (redelivery.airflow.ui.app) in the Airflow UI's navigation,
and the trigger check of redelivery DAGs (redelivery.airflow.ui.trigger_check)."""

from airflow.plugins_manager import AirflowPlugin

from redelivery.airflow.ui.app import app
from redelivery.airflow.ui.trigger_check import RefuseBadConf


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
