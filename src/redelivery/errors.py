"""Errors raised by redelivery. Every one of them is raised before anything is changed."""


class RedeliveryError(Exception):
    """Base class of every error redelivery raises on bad input or state."""


class UnknownTopicError(RedeliveryError, LookupError):
    """The topic does not exist."""


class UnknownGroupError(RedeliveryError, LookupError):
    """The consumer group does not exist."""


class NotSubscribedError(RedeliveryError, LookupError):
    """The consumer group is not subscribed to the topic."""


class InvalidNameError(RedeliveryError, ValueError):
    """A topic or group name has characters or a length that cannot name a table."""


class InvalidDelayError(RedeliveryError, ValueError):
    """A retry delay outside 1 s to 864000 s, Pulsar's reconsumeLater range (TDMQ Pulsar,
    "Message retry and dead-letter mechanism")."""


class InvalidLevelError(RedeliveryError, ValueError):
    """A delay level outside the level table."""


class MalformedMessageError(RedeliveryError, ValueError):
    """A message body or properties that cannot be stored (not JSON, reserved property names...)."""


class ConfigError(RedeliveryError, ValueError):
    """The configuration file is missing, unreadable or invalid; the message names the bad key."""


class DatabaseUnavailableError(RedeliveryError, RuntimeError):
    """The state store cannot be had: the embedded PostgreSQL could not be started (or its port
    is held by another server), or, inside Airflow, the connection naming it is missing."""


class SchemaNotMigratedError(RedeliveryError, RuntimeError):
    """The database has no redelivery schema, or one at an older migration than this version
    needs: run ``redelivery db upgrade`` (``redelivery.store.db.migrate``) against it first."""


class TooManyRequestsError(RedeliveryError):
    """Flow control: the topic's ready backlog is at its cap, RocketMQ reply code 530
    TOO_MANY_REQUESTS (RocketMQ cloud, "Send retry and flow control"). Transient: a retrying
    publisher backs off and tries again."""

    code = 530


class ForeignReceiptError(RedeliveryError, ValueError):
    """A receipt answered for another consumer group than the one that received the message."""


class InvalidBatchIdError(RedeliveryError, ValueError):
    """A publish batch id that is not a non-empty str of at most 200 characters."""


class BatchConflictError(RedeliveryError, ValueError):
    """A batch id already published to another topic or with other content: a batch id means one batch."""


class BatchExpiredError(RedeliveryError, LookupError):
    """A batch id published before whose messages retention has since dropped from the log: it is
    not published again, and its ids (returned by the first publish) cannot be given again."""


class BatchTooLargeError(RedeliveryError, ValueError):
    """A publish batch larger than a subscribed group's ready-backlog cap: it can never fit, so it
    is refused at once rather than retried as flow control."""


class PublishError(RedeliveryError):
    """A publish from Spark whose staged rows do not add up to what the DataFrame's tasks wrote;
    nothing of the batch was published."""


class InvalidWindowError(RedeliveryError, ValueError):
    """A tier window that ends after the database's clock (it would promote retries early)."""
