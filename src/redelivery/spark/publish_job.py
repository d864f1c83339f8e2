"""Deprecated import path, kept for one release:
``redelivery.spark.publish_job`` moved to ``redelivery.spark.publishing``."""

import warnings

from redelivery.spark.publishing import publish_dataframe

__all__ = ["publish_dataframe"]

warnings.warn(
    "redelivery.spark.publish_job moved to redelivery.spark.publishing (this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
