"""An answer refuses a receipt of another topic inside its own statement (issue 42).

An ack whose receipt matched no delivery row asked, in a statement of its own, whether the
receipt named another topic than its message's, and raised ``ForeignReceiptError`` before its
transaction committed: BEGIN, ACK, the check when needed, COMMIT, three round trips at least for
every ack. ``refuse_foreign_receipts`` makes that check and raises the refusal (SQLSTATE
``RD001``; its DETAIL the message id, then the topic named, tab-separated) from inside the ACK
and EXTEND_LEASE statements, which call it only when a receipt matched nothing: the statement, and
nothing else, is undone, so an ack is one statement committed on its own, and a refused one still
changes nothing. A function, not a subquery of the statement: those statements are planned on
every call (their arrays), and the check is planned only in a session that needs it. VOLATILE:
its query takes a snapshot of its own, after the calling statement's changes, as the separate
check statement did (a receipt whose row the ACK just deleted is found in its topic's log).

The check (the rule ``RECEIPT_OF_ANOTHER_TOPIC`` had): a receipt with a delivery row of the topic
it names is the topic's; only the others (stale ones) are looked up in the topic's log and dead
letters. A message that is nowhere (retention dropped it from the log once the group was done with
it) at or below the group's offset on the named topic was handed to the group: the topic's too,
its receipt stale. Only a message in another topic's log (ids are unique across topics), or past
the offset (or on a topic the group does not subscribe), is another topic's; each other topic's log
probed by its primary key (OFFSET 0 keeps it a probe: as a join, a log never analyzed was read
whole). A message's topic never changes and an offset only grows, so the read needs no lock.

Revision ID: 0024
Revises: 0023
"""

from alembic import op

revision = "0024"
down_revision = "0023"

REFUSE_FOREIGN_RECEIPTS = """
CREATE FUNCTION redelivery.refuse_foreign_receipts(p_ids bigint[], p_topic_ids int[], p_group_id int)
RETURNS int LANGUAGE plpgsql VOLATILE SET search_path = redelivery AS $$
DECLARE
  refused record;
BEGIN
  SELECT i.message_id, t.name INTO refused
  FROM unnest(p_ids, p_topic_ids) AS i(message_id, topic_id)
  JOIN topics t ON t.id = i.topic_id
  WHERE CASE WHEN EXISTS (SELECT 1 FROM deliveries d WHERE d.topic_id = i.topic_id
                            AND d.group_id = p_group_id AND d.message_id = i.message_id) THEN false
             WHEN EXISTS (SELECT 1 FROM messages m WHERE m.topic_id = i.topic_id AND m.id = i.message_id)
             THEN false
             WHEN EXISTS (SELECT 1 FROM dlq_messages q WHERE q.message_id = i.message_id
                            AND q.group_id = p_group_id AND q.topic_id = i.topic_id) THEN false
             WHEN i.message_id > coalesce((SELECT s.consume_offset FROM subscriptions s
                                           WHERE s.topic_id = i.topic_id AND s.group_id = p_group_id), 0)
             THEN true
             ELSE EXISTS (SELECT 1 FROM topics o
                          WHERE o.id <> i.topic_id
                            AND EXISTS (SELECT 1 FROM messages m WHERE m.topic_id = o.id
                                          AND m.id = i.message_id OFFSET 0)) END
  LIMIT 1;
  IF refused.message_id IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'RD001',
      MESSAGE = format('message %s is not a message of topic %L: a receipt naming another topic '
                       'cannot answer for it', refused.message_id, refused.name),
      DETAIL = refused.message_id::text || E'\\t' || refused.name;
  END IF;
  RETURN 0;
END $$;
"""


def upgrade() -> None:
    op.execute(REFUSE_FOREIGN_RECEIPTS)


def downgrade() -> None:
    op.execute("DROP FUNCTION redelivery.refuse_foreign_receipts(bigint[], int[], int)")
