"""Pure rules: delay levels, topic and group names, retry and dead-letter policies (no I/O)."""
