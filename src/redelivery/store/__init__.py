"""The PostgreSQL state store: statements, connections and migrations, the catalog of ids and
policies, the embedded server, retention."""
