"""Messages as stored and as received: encode, decode, retry properties. Pure (no server), but for
one publish and receive through the real client."""

from datetime import UTC
from decimal import Decimal

import pytest

from redelivery.errors import MalformedMessageError
from redelivery.messaging.codec import BINARY, JSON, TEXT, Message, decode, encode, retry_properties


@pytest.mark.parametrize(
    "message,ctype,body",
    [
        ({"a": [1, 2]}, JSON, {"a": [1, 2]}),
        (b"\x00\xff", BINARY, b"\x00\xff"),
        (Message("plain", content_type=TEXT), TEXT, "plain"),
        (Message('{"raw": true}', content_type=JSON), JSON, {"raw": True}),
        (Message({"s": "héllo ✓"}), JSON, {"s": "héllo ✓"}),
    ],
)
def test_round_trip_by_content_type(message, ctype, body):
    key, raw, stored_type, props = encode(message)
    assert stored_type == ctype and isinstance(raw, bytes) and props == {}
    assert decode(raw, stored_type) == body


def test_json_text_is_taken_as_it_is():
    """A JSON text passes ``encode`` as it is: a publish checks a chunk's texts at once for what
    only jsonb refuses (tests/messaging/test_copy_rows.py), PostgreSQL that they are JSON."""
    assert encode(Message("{not json", content_type=JSON)) == (None, b"{not json", JSON, {})
    assert encode(Message('"a\\u0000b"', content_type=JSON))[1] == b'"a\\u0000b"'
    with pytest.raises(MalformedMessageError, match="message 0: body is not valid application/json"):
        encode(Message(b"\xff", content_type=JSON))  # not UTF-8


def test_a_message_is_frozen_and_shares_no_properties():
    import dataclasses

    message = Message({"a": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        message.key = "k"
    with pytest.raises(TypeError):
        message.properties["p"] = "v"  # the empty properties every such message shares
    assert Message({"a": 1}) == message and Message({"a": 1}, properties={"p": "v"}).properties == {"p": "v"}


def test_key_and_properties_are_kept():
    assert encode(Message({}, key="k", properties={"tenant": "a"})) == ("k", b"{}", JSON, {"tenant": "a"})


@pytest.mark.parametrize(
    "message,needle",
    [
        ({"bad": float("nan")}, "message 3: body is not valid application/json"),
        (Message(b"x", content_type=TEXT), "must be str"),
        (Message("x", content_type="image/png"), "unknown content type"),
        (Message({}, properties={"RECONSUMETIMES": "3"}), "reserved"),
        (Message({}, properties={"n": 3}), "str to str"),
        (Message({}, key=5), "key must be a str"),
    ],
)
def test_malformed_messages_name_their_index(message, needle):
    with pytest.raises(MalformedMessageError, match=needle):
        encode(message, 3)


@pytest.mark.parametrize(
    "message,needle",
    [
        (Message({}, key="a\x00b"), r"message 3: key has a \\u0000 character"),
        (Message({}, key="a\ud800"), r"message 3: key has a lone surrogate \('\\ud800'\) at character 1"),
        (Message({}, key="\udfffb"), r"message 3: key has a lone surrogate \('\\udfff'\) at character 0"),
        (
            Message({}, properties={"p\udc00": "v"}),
            r"message 3: property name 'p\\udc00' has a lone surrogate",
        ),
        (Message({}, properties={"p": "x\ud800"}), r"message 3: property 'p' has a lone surrogate"),
        (Message({}, properties={"p\x00": "v"}), r"message 3: property 'p\\x00' has a \\u0000"),
    ],
)
def test_a_key_or_property_postgresql_cannot_store_is_malformed(message, needle):
    """PostgreSQL's text holds neither NUL nor a lone surrogate (not UTF-8): the message is refused
    naming its index and the field, not by psycopg or orjson on the way in. The error text itself
    is printable (the surrogate escaped), so the CLI can print it."""
    with pytest.raises(MalformedMessageError, match=needle) as refused:
        encode(message, 3)
    str(refused.value).encode()  # printable as UTF-8


def test_keys_and_properties_outside_ascii_are_kept():
    message = Message({}, key="clé-✓-😀", properties={"région": "Île-de-France 😀"})
    assert encode(message) == ("clé-✓-😀", b"{}", JSON, {"région": "Île-de-France 😀"})


def test_retry_properties_only_on_redeliveries():
    assert retry_properties(
        {"a": "1"}, topic="t", origin_message_id=7, retry_topic="%RETRY%g", reconsume_times=0
    ) == {"a": "1"}
    assert retry_properties(
        {}, topic="t", origin_message_id=7, retry_topic="%RETRY%g", reconsume_times=2
    ) == {
        "REAL_TOPIC": "t",
        "ORIGIN_MESSAGE_ID": "7",
        "RETRY_TOPIC": "%RETRY%g",
        "RECONSUMETIMES": "2",
    }


def test_a_received_message_made_from_its_fields_is_the_constructors():
    import dataclasses
    from datetime import datetime

    from redelivery.messaging.codec import ReceivedMessage

    now = datetime(2026, 11, 26, tzinfo=UTC)
    fields = dict(message_id=7, group="g", topic="t", key="k", body={"a": 1}, content_type=JSON,
                  properties={"p": "1"}, published_at=now, delivery_count=2, reconsume_times=1,
                  delay_level=1, invisible_until=now, origin_message_id=7, last_error="boom",
                  redrive_count=3)  # fmt: skip
    made = ReceivedMessage.of(dict(fields))
    assert made == ReceivedMessage(**fields) and repr(made) == repr(ReceivedMessage(**fields))
    assert set(fields) == {f.name for f in dataclasses.fields(ReceivedMessage)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.delivery_count = 1


def test_a_message_pickles_and_copies_as_it_was_made():
    import copy
    import pickle

    for message in (Message({"a": 1}), Message(b"x", key="k", properties={"p": "v"})):
        assert pickle.loads(pickle.dumps(message)) == message == copy.deepcopy(message)


#: Numbers orjson reads wrongly (as floats: integers outside [-2**63, 2**64 - 1]) or not at all (past
#: float's range), which PostgreSQL's JSON takes.
EXACT_TEXT = '{"id": 123456789012345678901234567891, "x": 1e400, "n": -9223372036854775809}'
EXACT = {"id": 123456789012345678901234567891, "x": Decimal("1e400"), "n": -9223372036854775809}


def exactly(value) -> list:
    """``value`` with the type of every number, so ``1.0 == 1`` or ``Decimal(1) == 1`` cannot pass."""
    if isinstance(value, dict):
        return [(k, exactly(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [exactly(v) for v in value]
    return [type(value).__name__, value]


@pytest.mark.parametrize(
    "text,value",
    [
        (EXACT_TEXT, EXACT),
        (
            '{"id": 123456789012345678901234567891, "n": -9223372036854775809}',  # orjson: two floats
            {"id": 123456789012345678901234567891, "n": -9223372036854775809},
        ),
        ("[18446744073709551616, -1e400, 1.5]", [2**64, Decimal("-1e400"), 1.5]),
        ("[18446744073709551615, -9223372036854775808, 0.1]", [2**64 - 1, -(2**63), 0.1]),  # orjson's
        (
            '{"s": "12345678901234567890123", "f": 0.1, "e": 1E+308}',
            {"s": "12345678901234567890123", "f": 0.1, "e": 1e308},
        ),
        ("[3.14159265358979323846264, -0.0, 10.10]", [3.141592653589793, -0.0, 10.1]),
        ("[-9223372036854775809,9999999999999999999]", [-(2**63) - 1, 9999999999999999999]),
        ('{"a":-12345678901234567890123,"b":"x-1"}', {"a": -12345678901234567890123, "b": "x-1"}),
        ("[1700000000000000000, 1.7976931348623157e308]", [1700000000000000000, 1.7976931348623157e308]),
        ("[1.8e308, 1e-5]", [Decimal("1.8e308"), 1e-5]),  # 1.8e308 is inf as a float
    ],
)
def test_json_numbers_decode_value_for_value(text, value):
    """Every integer exactly, whatever its size; a number past float's range as a ``Decimal``
    (exact; ``inf`` is no JSON value); every other number a float, as always."""
    assert exactly(decode(text.encode(), JSON)) == exactly(value)


def test_a_consumer_receives_what_was_published_value_for_value(client, topic_group):
    """Through the real client and database: a JSON text, and a value (its integers written in
    full by ``encode``)."""
    big = {"id": EXACT["id"], "n": EXACT["n"], "u": 2**64}
    client.publish("orders", [Message(EXACT_TEXT, content_type=JSON), Message(big)])
    received = client.receive("billing", "orders", 2, 30)
    assert [exactly(m.body) for m in received] == [exactly(EXACT), exactly(big)]
