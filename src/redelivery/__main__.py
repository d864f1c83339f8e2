"""``python -m redelivery``: the ``redelivery`` command."""

from redelivery.cli.app import main

main()
