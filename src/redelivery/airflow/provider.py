"""The provider's description for Airflow's ``ProvidersManager`` (entry point
``apache_airflow_provider`` in pyproject.toml): ``airflow providers list`` shows it, the connection
form offers type ``redelivery`` with its fields, and ``apache-airflow-providers-common-messaging``
finds the message-queue provider of ``MessageQueueTrigger(scheme="redelivery", ...)``.

The plugin (the "Dead letters" page, the trigger check) is registered through the
``airflow.plugins`` entry point, not listed here: Airflow loads a provider's ``plugins`` only when
``[core] lazy_discover_providers`` is off, and then would register the plugin twice.
This module imports nothing heavy: Airflow calls it in every process that lists providers.
"""

from __future__ import annotations

from redelivery import __version__

PACKAGE = "redelivery"


def get_provider_info() -> dict:
    """The provider's metadata, in the shape of Airflow's ``provider_info.schema.json``: the
    ``package-name`` is the distribution's name (Airflow matches the two)."""
    return {
        "package-name": PACKAGE,
        "name": "redelivery",
        "description": "Batch retry and dead-letter queues for data pipelines: tiered retry delays, "
        "a delivery count that survives crashes, dead-letter queues per consumer group, redrive.",
        "versions": [__version__],
        # no "external-doc-url": the package is not published anywhere a link could point to;
        # its documentation is README, the distribution's long description
        # (importlib.metadata.metadata("redelivery")["Description"], `pip show`), which sends an
        # existing Airflow to the checkout's docs/airflow.md, "Into an existing Airflow"
        "integrations": [{"integration-name": "redelivery", "tags": ["software"]}],
        "hooks": [{"integration-name": "redelivery", "python-modules": ["redelivery.airflow.hooks"]}],
        "triggers": [{"integration-name": "redelivery", "python-modules": ["redelivery.airflow.triggers"]}],
        "connection-types": [
            {
                "connection-type": "redelivery",
                "hook-class-name": "redelivery.airflow.hooks.RedeliveryHook",
                "hook-name": "redelivery (PostgreSQL state store)",
                "ui-field-behaviour": {
                    "relabeling": {"schema": "Database"},
                    "placeholders": {
                        "host": "PostgreSQL host of the state store",
                        "port": "5432",
                        "schema": "redelivery",
                        "extra": '{"sslmode": "verify-full", "sslrootcert": "/path/to/ca.pem"}',
                    },
                },
            }
        ],
        "queues": ["redelivery.airflow.queues.RedeliveryMessageQueueProvider"],
    }
