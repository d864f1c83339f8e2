"""Airflow plugin: the "Dead letters" page (redelivery.airflow.ui.app) in the Airflow UI's navigation,
and the trigger check of redelivery DAGs (redelivery.airflow.ui.trigger_check). Loaded by Airflow,
it also tells the state store's code that this process is one of Airflow's (``on_load``).

Airflow finds it by the distribution's ``airflow.plugins`` entry point; the checkout's
``plugins/redelivery_plugin.py`` exposes it to a plugins folder only where no entry point does
(``registered_by_entry_point``)."""

from importlib.metadata import distributions

from airflow.plugins_manager import AirflowPlugin

from redelivery.airflow.hooks import airflow_database_url
from redelivery.airflow.ui.app import app
from redelivery.airflow.ui.trigger_check import RefuseBadConf
from redelivery.store import db


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

    @classmethod
    def on_load(cls, *args, **kwargs) -> None:
        """Airflow loaded its plugins in this process (an Airflow server, or a task's process
        before the task runs): from now on the state store of ``redelivery.store.db.database_url``
        (a ``Client()`` made in a task) is the connection ``redelivery_db``, or
        ``REDELIVERY_DATABASE_URL``; without them, an error naming the connection, never an
        embedded PostgreSQL started in the worker."""
        db.inside_airflow(airflow_database_url)


def registered_by_entry_point() -> bool:
    """Whether an installed distribution registers ``RedeliveryPlugin`` by the ``airflow.plugins``
    entry point (pip install of the package: pyproject.toml declares it). Airflow 3 loads the
    plugins folder first, then the entry points, and a second plugin of the same name is skipped
    with a warning and an import error that the UI shows; so the plugins folder's file exposes the
    class only when this is False (the package on the path without its metadata), and the plugin
    is registered exactly once either way. Reads every distribution's metadata as Airflow does
    (``entry_points()`` keeps the first distribution of a name only): raises nothing."""
    wanted = f"{RedeliveryPlugin.__module__}:{RedeliveryPlugin.__qualname__}"
    for distribution in distributions():
        try:
            entries = list(distribution.entry_points)
        except Exception:  # unreadable metadata: Airflow skips it too
            continue
        if any(e.group == "airflow.plugins" and e.value.replace(" ", "") == wanted for e in entries):
            return True
    return False
