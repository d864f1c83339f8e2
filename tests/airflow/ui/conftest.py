"""The real Airflow and Chromium of the browser tests: one Airflow for the package's modules
(starting one costs about a minute), a browser per test."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from airflow_browser import CHROMIUM, FLAGS, ROLES, USERS, api, pause_tier_dags, signed_in
from helpers import page_state


@pytest.fixture(scope="package")
def local_airflow(database_url, tmp_path_factory):
    """A running Airflow with its own metadata database (named after the test database) and
    AIRFLOW_HOME, the FAB auth manager, ``USERS`` and ``admin``; ``api`` calls it as the admin."""
    from harness.local_airflow import LocalAirflow

    env = {
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "REDELIVERY_DATABASE_URL": database_url,
    }
    metadata_db = "airflow_e2e_" + urlsplit(database_url).path.strip("/")
    home = tmp_path_factory.mktemp("airflow-home")
    with LocalAirflow(home, metadata_db, env, users=USERS, roles=ROLES) as running:
        api.headers.update(running.session().headers)
        running.unpause("dlq_redrive")  # runs triggered through the API run (the form unpauses by itself)
        # The tier DAGs are active from the start, and their runs would move these tests' state
        # (its times are in the past): paused here, as an operator would, which the page and the
        # metrics then show (test_a_paused_tier_is_shown_at_the_top_and_measured).
        pause_tier_dags(running.url)
        # the standing redrives' ticks write the checkout's config into this state store: none here
        api.patch(
            f"{running.url}/api/v2/dags/redelivery_standing_redrives", json={"is_paused": True}, timeout=30
        )
        yield running
    api.headers.pop("Authorization", None)


@pytest.fixture(scope="package")
def airflow(local_airflow) -> str:
    """The running Airflow's base URL."""
    return local_airflow.url


@pytest.fixture()
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield launched
        launched.close()


@pytest.fixture()
def browser(chromium, airflow):
    """A page signed in as the admin."""
    return signed_in(chromium, airflow, "admin")


@pytest.fixture()
def charted(client, topic_group, database_url):
    """helpers.page_state: billing has 10 dead letters (REJECTED, "schema violation"), retries at
    levels 1 (6) and 3 (4), 5 READY and 7 in flight; audit 4 READY; the seconds tier's runs were
    2 s and 5 s late."""
    page_state(client, database_url)
    return client
