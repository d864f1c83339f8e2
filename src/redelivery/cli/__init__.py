"""The ``redelivery`` command (Typer): ``app`` is its entry point."""
