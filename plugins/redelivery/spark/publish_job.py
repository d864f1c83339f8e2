"""Publish a Spark DataFrame as messages: Spark's JDBC writer lands the rows in
``publish_staging``, then one transaction publishes them (JDBC writes are not atomic across
partitions, so they are only a landing step). A batch id makes the job safe to run twice."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from .. import db
from ..client import JSON, fan_out_sql
from ..errors import MalformedMessageError, UnknownTopicError


def jdbc_options(url: str) -> dict:
    """Spark JDBC options for a libpq URL or DSN (PostgreSQL driver, ``stringtype=unspecified`` so
    text columns land in jsonb and enums)."""
    info = conninfo_to_dict(url)
    options = {
        "url": f"jdbc:postgresql://{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}/{info.get('dbname', 'postgres')}"
               "?stringtype=unspecified",
        "driver": "org.postgresql.Driver",
        "user": info.get("user", "postgres"),
    }
    if info.get("password"):
        options["password"] = info["password"]
    return options


def publish_dataframe(df, topic: str, batch_id: str, *, url: str | None = None, at=None) -> int:
    """Publish every row of ``df`` to ``topic`` once; return the number of messages of the batch.

    ``df`` columns: ``body`` (string: JSON text) and optionally ``key`` (string) and ``properties``
    (string: a JSON object). Rows are published in the DataFrame's order. Running it again with the
    same ``batch_id`` publishes nothing more. Raises ``UnknownTopicError`` and
    ``MalformedMessageError`` (a body that is not JSON) before anything is published."""
    from pyspark.sql import functions as F

    url = url or db.database_url()
    with db.connect(url, autocommit=True) as conn:
        topic_row = conn.execute("SELECT id FROM topics WHERE name = %s", (topic,)).fetchone()
        if topic_row is None:
            raise UnknownTopicError(f"unknown topic {topic!r}")
        done = conn.execute("SELECT message_count FROM publish_batches WHERE batch_id = %s", (batch_id,)).fetchone()
        if done:
            return done[0]
        conn.execute("DELETE FROM publish_staging WHERE batch_id = %s", (batch_id,))  # a failed earlier attempt

        staged = df.select(
            F.lit(batch_id).alias("batch_id"),
            F.monotonically_increasing_id().alias("seq"),
            (F.col("key") if "key" in df.columns else F.lit(None).cast("string")).alias("key"),
            F.encode(F.col("body"), "UTF-8").alias("body"),
            F.lit(JSON).alias("content_type"),
            (F.col("properties") if "properties" in df.columns else F.lit("{}")).alias("properties"),
        )
        (staged.write.format("jdbc").options(**jdbc_options(url), dbtable=f"{db.SCHEMA}.publish_staging",
                                             batchsize="10000").mode("append").save())
        try:
            with conn.transaction():
                fresh = conn.execute(
                    """INSERT INTO publish_batches (batch_id, topic_id, message_count)
                       SELECT %s, %s, count(*) FROM publish_staging WHERE batch_id = %s
                       ON CONFLICT (batch_id) DO NOTHING RETURNING message_count""",
                    (batch_id, topic_row[0], batch_id)).fetchone()
                if fresh is not None:
                    conn.execute(fan_out_sql(
                        "(SELECT key, body, content_type, properties, seq FROM publish_staging"
                        " WHERE batch_id = %(batch)s) AS u"),
                                 {"topic_id": topic_row[0], "batch": batch_id, "at": at})
                conn.execute("DELETE FROM publish_staging WHERE batch_id = %s", (batch_id,))
        except Exception as exc:
            if getattr(exc, "sqlstate", None) in ("22P02", "22021"):  # invalid JSON / bad encoding
                conn.execute("DELETE FROM publish_staging WHERE batch_id = %s", (batch_id,))
                raise MalformedMessageError(f"batch {batch_id!r}: a body is not valid JSON: {exc}") from exc
            raise
        if fresh is None:
            return conn.execute("SELECT message_count FROM publish_batches WHERE batch_id = %s", (batch_id,)).fetchone()[0]
        return fresh[0]
