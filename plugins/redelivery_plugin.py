"""Airflow plugin: the "Dead letters" page (redelivery.airflow.ui) in the Airflow UI's navigation."""

from airflow.plugins_manager import AirflowPlugin

from redelivery.airflow.ui import app


class RedeliveryPlugin(AirflowPlugin):
    name = "redelivery"
    fastapi_apps = [{"app": app, "url_prefix": "/redelivery", "name": "redelivery"}]
    external_views = [
        {
            "name": "Dead letters",
            "href": "/redelivery/dlq",
            "url_route": "dead-letters",
            "destination": "nav",
            "category": "browse",
        }
    ]
