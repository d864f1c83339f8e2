"""redelivery: a batch retry and dead-letter system for data pipelines (Airflow schedules, Spark
moves, PostgreSQL keeps the state).

What a user imports: ``redelivery.client`` (``Client``, ``Message``, ``Outcome``),
``redelivery.errors``, ``redelivery.config``, ``redelivery.redrive`` (``RedriveRequest``,
``redrive``), ``redelivery.dead_letters`` (``DlqFilter``), ``redelivery.spark.dataframes``
(``publish_dataframe``, ``lease``, ``settle``), ``redelivery.tiers.run`` (``TierRunRequest``,
``run_tier_window``), ``redelivery.airflow`` (the provider: hooks, operators, triggers, DAG
factories). The layers, bottom to top, are in docs/ARCHITECTURE.md ("Map").
"""

__version__ = "0.1.0"
