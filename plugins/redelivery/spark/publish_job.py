"""Publish a Spark DataFrame as messages: Spark's JDBC writer lands the rows in
``publish_staging``, then one transaction publishes them (JDBC writes are not atomic across
partitions, so they are only a landing step). A batch id makes the job safe to run twice."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from .. import catalog, db
from .. import statements as S
from ..codec import JSON
from ..errors import MalformedMessageError


def jdbc_options(url: str) -> dict:
    """Spark JDBC options for a libpq URL or DSN (PostgreSQL driver, ``stringtype=unspecified`` so
    text columns land in jsonb and enums)."""
    info = conninfo_to_dict(url)
    options = {
        "url": f"jdbc:postgresql://{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}/"
        f"{info.get('dbname', 'postgres')}"
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
        topic_id = catalog.topic_id(conn, topic)
        done = conn.execute(S.PUBLISHED_COUNT, {"batch": batch_id}).fetchone()
        if done:
            return done[0]
        conn.execute(S.DELETE_STAGED, {"staging": batch_id})  # a failed earlier attempt

        staged = df.select(
            F.lit(batch_id).alias("batch_id"),
            F.monotonically_increasing_id().alias("seq"),
            (F.col("key") if "key" in df.columns else F.lit(None).cast("string")).alias("key"),
            F.encode(F.col("body"), "UTF-8").alias("body"),
            F.lit(JSON).alias("content_type"),
            (F.col("properties") if "properties" in df.columns else F.lit("{}")).alias("properties"),
        )
        (
            staged.write.format("jdbc")
            .options(**jdbc_options(url), dbtable=f"{db.SCHEMA}.publish_staging", batchsize="10000")
            .mode("append")
            .save()
        )
        try:
            with conn.transaction():
                fresh = conn.execute(
                    S.CLAIM_STAGED_PUBLISH_BATCH,
                    {"batch": batch_id, "topic_id": topic_id, "staging": batch_id},
                ).fetchone()
                if fresh is not None:
                    conn.execute(
                        S.FAN_OUT, {"topic_id": topic_id, "batch": batch_id, "staging": batch_id, "at": at}
                    )
                conn.execute(S.DELETE_STAGED, {"staging": batch_id})
        except Exception as exc:
            if getattr(exc, "sqlstate", None) in ("22P02", "22021"):  # invalid JSON / bad encoding
                conn.execute(S.DELETE_STAGED, {"staging": batch_id})
                raise MalformedMessageError(f"batch {batch_id!r}: a body is not valid JSON: {exc}") from exc
            raise
        if fresh is None:
            return conn.execute(S.PUBLISHED_COUNT, {"batch": batch_id}).fetchone()[0]
        return fresh[0]
