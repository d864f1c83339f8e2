"""The redelivery plugin (redelivery.airflow.plugin.RedeliveryPlugin: the "Dead letters" page, the
trigger check) for a deployment that mounts this folder as Airflow's plugins folder
(``AIRFLOW__CORE__PLUGINS_FOLDER``: docker-compose, Astro, MWAA, Composer). The package must be
importable where Airflow runs. Installed with pip, it registers the plugin by its entry point and
this file exposes nothing (Airflow would otherwise skip the second one and show an import error);
without an entry point (the package on the path only), this file registers it."""

from redelivery.airflow import plugin

if not plugin.registered_by_entry_point():
    RedeliveryPlugin = plugin.RedeliveryPlugin
