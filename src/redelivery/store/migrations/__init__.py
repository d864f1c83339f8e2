"""Alembic migrations of the state store (``db.migrate`` runs them)."""
