"""README's Python examples, and those of the pages its sections moved to (docs/), run as written.
The client example defines everything it uses (issue 28.4: it used ``ok``, ``some`` and ``poison``
without defining them); the Spark one leaves the session and a table to the reader (``spark``,
``customers``), which the test provides. Each block's text runs unchanged, and the test checks what
it did; every ```python block of README and the pages is one of them. README's public-API table
names modules that exist and export what it says; its install lines, and the Airflow page's,
install from what exists (not PyPI)."""

from __future__ import annotations

import importlib
import re
import time

import pytest

from helpers import REPO_ROOT, docs_page

README = (REPO_ROOT / "README.md").read_text()
#: Where each example is: the page, and a text its block follows.
EXAMPLES = {
    "client": ("README.md", "## Using it"),
    "ordered": ("docs/using.md", "## Ordered subscriptions"),
    "waiting": ("docs/using.md", "## Waiting for a message"),
    "failures": ("docs/using.md", "## Failures, grouped by signature"),
    "spark": ("docs/using.md", "## In Spark: lease, transform, settle"),
    "message queue trigger": ("docs/airflow.md", "A consumer DAG of your own"),
}


#: The pages README's sections moved to (issue 39.6).
MOVED_FROM_README = ("using.md", "airflow.md", "spark-clusters.md", "operating.md", "crash-suite.md",
                     "configuration.md", "performance.md", "layout.md")  # fmt: skip


def page_text(page: str) -> str:
    return README if page == "README.md" else docs_page(page.removeprefix("docs/"))


def python_block(example: str) -> str:
    """The first ```python block after the text that names ``example`` on its page."""
    page, after = EXAMPLES[example]
    text = page_text(page)
    return re.search(r"```python\n(.*?)```", text[text.index(after) :], re.S).group(1)


def test_every_python_example_is_run():
    """A ```python block added to README or a page is one of the examples these tests run."""
    pages = ["README.md", *(f"docs/{p.name}" for p in sorted((REPO_ROOT / "docs").glob("*.md")))]
    found = {
        (page, block) for page in pages for block in re.findall(r"```python\n(.*?)```", page_text(page), re.S)
    }
    run = {(EXAMPLES[name][0], python_block(name)) for name in EXAMPLES}
    assert found == run


def test_the_public_api_table_names_what_exists():
    table = README[README.index("| module | what |") :].split("\n\n")[0]
    rows = re.findall(r"^\| `(redelivery\.[a-z_.]+)` \| (.*) \|$", table, re.M)
    assert len(rows) >= 7
    for module, names in rows:
        if module.endswith(".*"):
            continue
        loaded = importlib.import_module(module)
        for name in re.findall(r"`([A-Za-z_]+)`", names):
            assert hasattr(loaded, name), f"{module} has no {name}"


def test_the_client_example(clean_db):
    from redelivery.client import Client, Message

    block = python_block("client")
    exec(compile(block, "README.md", "exec"), {})  # nothing provided: it defines what it uses
    with Client(clean_db) as client:
        assert client.stats()["orders"]["billing"]["COMMITTED"] == 1
        again = [Message({"id": 1}, key="order-1", properties={"tenant": "a"})]
        assert client.publish("orders", again, batch_id="orders-2026-11-22") == [1]  # published once


def test_the_failures_example(clean_db):
    """Two rejects of one bug with different customers: one failure signature, its class and the
    example's own frame."""
    from redelivery.client import Client
    from redelivery.dead_letters import DlqFilter, groups

    exec(compile(python_block("failures"), "using.md", "exec"), {"__name__": "payments_consumer"})
    with Client(clean_db) as client:
        [failure] = groups(client.conn, DlqFilter(group="ledger"))
    assert (failure["count"], failure["error_class"]) == (2, "KeyError")
    assert failure["error_frame"] == "payments_consumer:charge"


def test_the_ordered_example(clean_db):
    from redelivery.client import Client, Message

    with Client(clean_db) as client:
        client.create_topic("orders")
        block = python_block("ordered")
        exec(compile(block, "docs/using.md", "exec"), {"Client": Client, "Message": Message})
        states = client.stats()["orders"]["shipping"]
        assert (states["WAITING_RETRY"], states["BLOCKED"], states["INFLIGHT"]) == (1, 1, 0)


def test_the_waiting_example(clean_db):
    from redelivery.client import Client, Message

    with Client(clean_db) as client:
        client.create_topic("orders")
        block = python_block("waiting")
        started = time.monotonic()
        exec(compile(block, "docs/using.md", "exec"), {"Client": Client, "Message": Message})
        assert 0.5 <= time.monotonic() - started < 15  # the first receive did not wait its 20 s
        assert client.stats()["orders"]["invoicing"]["COMMITTED"] == 1


@pytest.mark.parametrize(
    ("page", "heading"), [("README.md", "## Install"), ("docs/airflow.md", "## Into an existing Airflow")]
)
def test_the_install_lines_install_what_exists(page, heading):
    """redelivery is not on PyPI: README and the Airflow page install it from the checkout or a wheel
    built from it, and no page that was README's says otherwise."""
    text = page_text(page)
    section = text[text.index(heading) :].split("\n## ")[0]
    installs = re.findall(r"^pip install (.+?)\s*(?:#.*)?$", section, re.M)
    checkout, wheel = (
        re.compile(r"'?\.(\[[a-z,]+\])?'?"),
        re.compile(r'"?\$\(ls (\./)?dist/redelivery-\*\.whl\)'),
    )
    assert len(installs) >= 2 and checkout.fullmatch(installs[0]) and wheel.match(installs[1]), installs
    assert all(checkout.fullmatch(target) or "dist/redelivery-" in target for target in installs)
    assert "uv build --wheel" in section
    for other in ["README.md", *(f"docs/{name}" for name in MOVED_FROM_README)]:
        every = page_text(other)
        assert "redelivery[embedded]" not in every and not re.search(r"pip install '?redelivery\b", every)


@pytest.mark.spark
def test_the_spark_example(client, spark):
    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders")
    client.publish("orders", [{"customer": 1}, {"customer": 2}, {"customer": 9}])
    customers = spark.createDataFrame([(1,), (2,)], "id int")
    names = {"spark": spark, "customers": customers}
    exec(compile(python_block("spark"), "docs/using.md", "exec"), names)
    assert client.stats()["orders"]["billing"] == {
        "READY": 0,
        "INFLIGHT": 0,
        "WAITING_RETRY": 0,
        "COMMITTED": 2,
        "DLQ": 1,
        "BLOCKED": 0,
    }


@pytest.mark.airflow
def test_the_message_queue_trigger_example():
    names: dict = {}
    exec(compile(python_block("message queue trigger"), "docs/airflow.md", "exec"), names)
    watcher = names["orders"].watchers[0]
    assert type(watcher.trigger).__name__ == "MessageQueueTrigger"
    assert type(watcher.trigger.trigger).__name__ == "ReadyMessagesTrigger"  # the provider's
    assert (watcher.trigger.trigger.topic, watcher.trigger.trigger.group) == ("orders", "billing")
