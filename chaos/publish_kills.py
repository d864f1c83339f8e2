"""The kill points of an API publish, inside the transaction that writes its messages into the log:
a small batch's one statement (``publishing.SMALL_BATCH_MESSAGES``; in two round trips, or in one
when its publisher knows the log's partition of now) or a larger batch's COPY, held
at the log's partition, killed there, and sometimes published again with the same batch id. A part
of the controller (chaos/run.py), through ``KillPoints``, with its plumbing (``spawn``,
``holding``, ``freeze_and_kill``, ``run_to_end``)."""

from __future__ import annotations

import uuid


class PublishKillPoints:
    """The kill points of an API publish."""

    #: {way: (messages, where they go into the log, its statement)}: a batch of 20 is one statement
    #: (its ids taken and its batch id claimed in it), a batch of 150 a COPY (its batch claimed and
    #: its ids taken before it).
    WAYS = {
        "small": (20, "its one statement", "PUBLISH_SMALL_BATCH"),
        "copy": (150, "its transaction", "COPY_MESSAGES"),
    }

    #: A small batch whose publisher knows the log's partition of now (a publish before went into
    #: it): its locks, statement and commit in one round trip (``Publisher._publish_in_one_trip``).
    ONE_TRIP = (20, "its one round trip", "PUBLISH_SMALL_BATCH")

    def publish_size(self) -> tuple[int, str, str]:
        """One of ``WAYS``, at random."""
        return self.WAYS[self.rng.choice(sorted(self.WAYS))]

    def current_partition(self) -> str:
        """The log's partition of now (made if missing), whose lock a COPY into the log waits for."""
        from redelivery.store import statements as S
        from redelivery.store.log import ensure_partition

        now = self.conn.execute("SELECT now()").fetchone()[0]
        ensure_partition(self.conn, now, self.client.client.config.retention.seconds("partition"))
        return self.conn.execute(S.LOG_PARTITION_AT, {"at": now}).fetchone()[0]

    def publish_inside_transaction(self, way: str) -> None:
        batch = f"api-{uuid.uuid4().hex[:8]}"
        count, kind, statement = self.ONE_TRIP if way == "one_trip" else self.WAYS[way]
        publish = (
            "publish",
            "--batch",
            batch,
            "--count",
            str(count),
            *(("--one-trip",) if way == "one_trip" else ()),
        )
        # its write into the log waits for this lock
        with self.holding(f"LOCK TABLE redelivery_log.{self.current_partition()} IN SHARE MODE"):
            worker = self.spawn(*publish)
            self.freeze_and_kill(worker, f"API publish: inside {kind}", f"%redelivery:{statement}%")
        if self.rng.random() < 0.5:  # the producer tries again with the same batch id
            self.run_to_end(self.spawn(*publish))
