"""Tier windows: the guarded statements by message-id range (``window``) and one run of a
tier's window (``run``)."""
