"""Deprecated import path, kept for one release:
``redelivery.spark.tier_job`` moved to ``redelivery.tiers.run``."""

import warnings

from redelivery.tiers.run import run_tier_window

__all__ = ["run_tier_window"]

warnings.warn(
    "redelivery.spark.tier_job moved to redelivery.tiers.run (this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
