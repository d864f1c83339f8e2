"""The Spark driver's JVM start: a JDK class-data sharing archive of the classes a driver loads.

Spark's start is most of a small job's time (about 11 s here, 6 s of it the driver JVM loading
classes). ``build_cds_archive`` records the classes a driver loads into an archive under
REDELIVERY_HOME once (``make`` set-up does it); drivers and the Spark Connect server started with
``driver_java_options()`` map it instead of loading classes one by one (about 3-4 s less).
``-Xshare:auto``: a missing or stale archive is ignored, never an error.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

from redelivery.settings import get_settings


def cds_archive() -> Path:
    """Where the archive of this Spark and Java version lives."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.split('"')
    version = java[1] if len(java) > 1 else "unknown"
    return (
        get_settings().home.resolve() / f"spark-{pyspark.__version__}-java-{version}-{platform.machine()}.jsa"
    )


def driver_java_options() -> str:
    """JVM options for a Spark driver: the class-data sharing archive when it exists."""
    archive = cds_archive()
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto" if archive.exists() else ""


def build_cds_archive(force: bool = False) -> Path:
    """Run a small Spark job that exercises what the jobs use and save the driver's loaded classes.
    Returns the archive path. Raises ``subprocess.CalledProcessError`` if spark-submit fails."""
    archive = cds_archive()
    if archive.exists() and not force:
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    }
    done = subprocess.run(
        [
            "spark-submit",
            "--master",
            "local[2]",
            "--driver-java-options",
            f"-XX:ArchiveClassesAtExit={archive}",
            str(files(__package__) / "cds_warmup.py"),  # a file of the package, never zipped
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        archive.unlink(missing_ok=True)
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return archive
