"""The message-queue provider of ``apache-airflow-providers-common-messaging``: an asset watcher
written the way the SQS and Kafka providers allow,

    AssetWatcher(name="orders_billing", trigger=MessageQueueTrigger(
        scheme="redelivery", topic="orders", group="billing"))

runs ``ReadyMessagesTrigger(topic="orders", group="billing")`` (its other arguments too:
``poll_interval``, ``settle_timeout``, ``conn_id``). The deprecated ``queue=`` form takes the
subscription's asset URI, ``redelivery://<topic>/<group>``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider

from redelivery.airflow.triggers import ReadyMessagesTrigger

SCHEME = "redelivery"


class RedeliveryMessageQueueProvider(BaseMessageQueueProvider):
    """Scheme ``redelivery``: new READY messages of one consumer group on one topic."""

    scheme = SCHEME

    def trigger_class(self) -> type[ReadyMessagesTrigger]:
        return ReadyMessagesTrigger

    def queue_matches(self, queue: str) -> bool:
        return queue.startswith(f"{SCHEME}://")

    def trigger_kwargs(self, queue: str, **kwargs) -> dict:
        """``{"topic", "group"}`` of ``redelivery://<topic>/<group>``; the names are checked by
        the trigger (``InvalidNameError``). Raises ValueError for another shape."""
        parts = urlsplit(queue)
        group = parts.path.strip("/")
        if not parts.netloc or not group or "/" in group:
            raise ValueError(f"queue must be redelivery://<topic>/<group>, got {queue!r}")
        return {"topic": parts.netloc, "group": group}
