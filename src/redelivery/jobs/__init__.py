"""spark-submit entry points, shipped as package resources: ``tier_window`` (one tier window),
``dlq_redrive`` (a large redrive by run key), ``publish`` (a file published to a topic).
Each parses its arguments and calls the library;
``application(name)`` is the file to submit. The checkout's ``spark_jobs/`` holds a thin script
per job for a command line (``spark-submit spark_jobs/publish.py ...``)."""

from importlib.resources import files


def application(name: str) -> str:
    """The path of entry point ``name`` (e.g. ``"tier_window"``) as spark-submit takes it: a file
    of the installed package (setuptools installs packages as plain files, never zipped)."""
    return str(files(__package__) / f"{name}.py")
