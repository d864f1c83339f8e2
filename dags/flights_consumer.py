"""The demo's HTTP delivery of the flights as an event-driven consumer: group ``flights-http`` of
topic ``flights``, scheduled on the asset ``redelivery://flights/flights-http`` (see
redelivery.airflow.dags.consumer). The receiver is the Airflow connection
``redelivery_flights_receiver`` (http type)."""

from redelivery.airflow.dags.consumer import http_consumer_dag

dag = http_consumer_dag(
    topic="flights",
    group="flights-http",
    conn_id="redelivery_flights_receiver",
    dag_id="redelivery_flights_consumer",
    endpoint="/flights",
    body_field="flight",
)
