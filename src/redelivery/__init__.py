"""redelivery: a batch retry and dead-letter system for data pipelines (Airflow schedules, Spark
moves, PostgreSQL keeps the state).

What a user imports: ``from redelivery import Client, Message`` (``redelivery.client``: ``Client``,
``Message``, ``ReceivedMessage``, ``Receipt``, ``Outcome``), ``redelivery.errors``,
``redelivery.config``, ``redelivery.redrive`` (``RedriveRequest``, ``redrive``),
``redelivery.dead_letters`` (``DlqFilter``), ``redelivery.spark.dataframes`` (``publish_dataframe``,
``lease``, ``settle``), ``redelivery.tiers.run`` (``TierRunRequest``, ``run_tier``),
``redelivery.airflow`` (the provider: hooks, operators, triggers, DAG factories). The layers,
bottom to top, are in docs/ARCHITECTURE.md ("Map").
"""

__version__ = "0.1.0"

#: What ``from redelivery import ...`` gives, from ``redelivery.client``: loaded on first use, so
#: that ``import redelivery`` (a Spark executor's, the CLI's) stays light.
_CLIENT_NAMES = ("Client", "Message", "ReceivedMessage", "Receipt", "Outcome")


def __getattr__(name: str):
    if name in _CLIENT_NAMES:
        from redelivery import client

        return getattr(client, name)
    raise AttributeError(f"module 'redelivery' has no attribute {name!r}")


__all__ = ["__version__", *_CLIENT_NAMES]
