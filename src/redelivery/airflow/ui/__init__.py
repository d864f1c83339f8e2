"""The operator's page in the Airflow UI (``app``, ``page``, ``charts``) and the check of a
trigger's conf (``trigger_check``)."""
