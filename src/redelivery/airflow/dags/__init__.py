"""DAG factories: one DAG per tier, dlq_redrive, maintenance, HTTP consumers. The DAG files of
``dags/`` call them."""
