"""The consumer DAG's Params are a model (issue 39.4): ``ConsumerRun``'s fields give the trigger
form its bounds (the lease's the client's own), the lease is ``visibility_timeout`` at the Airflow
surface, and the old name ``invisible_duration`` is taken for one release with a hint."""

from __future__ import annotations

from redelivery.airflow.dags.consumer import ConsumerRun, consumer_params, lease_seconds
from redelivery.airflow.params import conf_problems
from redelivery.messaging.leasing import MAX_INVISIBLE_SECONDS
from redelivery.messaging.waiting import MAX_WAIT_SECONDS


def test_the_params_are_the_models_fields_with_the_clients_bounds():
    from airflow.sdk.definitions.param import ParamsDict

    params = ParamsDict(consumer_params())
    assert list(params) == [
        "batch_size",
        "max_messages",
        "visibility_timeout",
        "wait_seconds",
        "invisible_duration",
    ]
    lease = params.get_param("visibility_timeout")
    assert (lease.schema["minimum"], lease.schema["maximum"], lease.value) == (1, MAX_INVISIBLE_SECONDS, 60)
    assert conf_problems(params, {"visibility_timeout": 30, "batch_size": 10}) == []
    [problem] = conf_problems(params, {"visibility_timeout": MAX_INVISIBLE_SECONDS + 1})
    assert problem.startswith("visibility_timeout:")
    [problem] = conf_problems(params, {"visibility_timout": 30})
    assert "did you mean 'visibility_timeout'" in problem
    wait = params.get_param("wait_seconds")  # the long poll's bound: SQS's 20 s, the client's
    assert (wait.schema["minimum"], wait.schema["maximum"], wait.value) == (0, MAX_WAIT_SECONDS, 0)
    [problem] = conf_problems(params, {"wait_seconds": 21})
    assert problem.startswith("wait_seconds:")


def test_the_old_name_is_taken_with_a_hint():
    said = []
    assert lease_seconds(ConsumerRun(visibility_timeout=30), said.append) == 30 and said == []
    assert lease_seconds(ConsumerRun(invisible_duration=90), said.append) == 90
    assert said == [
        "the Param invisible_duration is now visibility_timeout: it is taken in this release, rename it"
    ]
