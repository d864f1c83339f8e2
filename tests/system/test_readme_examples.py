"""README's Python examples, run as written. Each example names a few things it leaves to the
reader (``ok``, ``some``, ``poison``, ``spark``, ``customers``): the test provides those, runs the
block's text unchanged, and checks what it did. README's public-API table names modules that
exist and export what it says."""

from __future__ import annotations

import importlib
import re

import pytest

from helpers import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def python_block(after: str) -> str:
    """The first ```python block after the text ``after``."""
    start = README.index(after)
    return re.search(r"```python\n(.*?)```", README[start:], re.S).group(1)


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

    block = python_block("## Using it")
    # what the example leaves to the reader: which messages are fine, later ones, a poison one
    names = {"ok": lambda message: message.body["id"] == 1, "some": [], "poison": []}
    exec(compile(block, "README.md", "exec"), names)
    with Client(clean_db) as client:
        assert client.stats()["orders"]["billing"]["COMMITTED"] == 1
        again = [Message({"id": 1}, key="order-1", properties={"tenant": "a"})]
        assert client.publish("orders", again, batch_id="orders-2026-11-22") == [1]  # published once


@pytest.mark.spark
def test_the_spark_example(client, spark):
    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders")
    client.publish("orders", [{"customer": 1}, {"customer": 2}, {"customer": 9}])
    customers = spark.createDataFrame([(1,), (2,)], "id int")
    names = {"spark": spark, "customers": customers}
    exec(compile(python_block("### In Spark: lease, transform, settle"), "README.md", "exec"), names)
    assert client.stats()["orders"]["billing"] == {
        "READY": 0,
        "INFLIGHT": 0,
        "WAITING_RETRY": 0,
        "COMMITTED": 2,
        "DLQ": 1,
    }


@pytest.mark.airflow
def test_the_message_queue_trigger_example():
    names: dict = {}
    exec(compile(python_block("A consumer DAG of your own"), "README.md", "exec"), names)
    watcher = names["orders"].watchers[0]
    assert type(watcher.trigger).__name__ == "MessageQueueTrigger"
    assert type(watcher.trigger.trigger).__name__ == "ReadyMessagesTrigger"  # the provider's
    assert (watcher.trigger.trigger.topic, watcher.trigger.trigger.group) == ("orders", "billing")
