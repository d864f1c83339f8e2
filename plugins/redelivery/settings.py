"""Process-wide settings, read from environment variables (prefix ``REDELIVERY_``).

=====================  ================================================================
variable               meaning
=====================  ================================================================
REDELIVERY_DATABASE_URL  PostgreSQL URL (``postgresql://user:pw@host:port/db``). Unset: the
                         embedded PostgreSQL under ``REDELIVERY_HOME`` is used (and started).
REDELIVERY_HOME          project-local state folder (embedded data directory, Airflow home,
                         demo output). Default: ``<repository>/.redelivery``.
REDELIVERY_CONFIG        YAML file with tiers and policies. Default: ``<repository>/config/redelivery.yaml``
                         if it exists, else the defaults of ``redelivery.config.RedeliveryConfig``.
REDELIVERY_PG_PORT       TCP port of the embedded PostgreSQL on 127.0.0.1. Default 54329.
REDELIVERY_JDBC_JAR      PostgreSQL JDBC driver for Spark. Default ``/usr/share/java/postgresql.jar``
                         (Debian's ``libpostgresql-jdbc-java``).
=====================  ================================================================
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parents[2]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="REDELIVERY_", extra="ignore")

    database_url: str | None = None
    home: Path = REPO_ROOT / ".redelivery"
    config: Path | None = None
    pg_port: int = 54329
    jdbc_jar: Path = Path("/usr/share/java/postgresql.jar")

    @property
    def config_path(self) -> Path | None:
        """``REDELIVERY_CONFIG``, else ``config/redelivery.yaml`` of the repository when it exists,
        else None (the defaults of ``redelivery.config.RedeliveryConfig``)."""
        if self.config is not None:
            return self.config
        repo_config = REPO_ROOT / "config" / "redelivery.yaml"
        return repo_config if repo_config.exists() else None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process (read once from the environment)."""
    return Settings()
