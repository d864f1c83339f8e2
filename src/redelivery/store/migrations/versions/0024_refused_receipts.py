"""An answer refuses a receipt of another topic inside its own statement (issue 42).

An ack whose receipt matched no delivery row asked, in a statement of its own, whether the
receipt named another topic than its message's, and raised ``ForeignReceiptError`` before its
transaction committed: BEGIN, ACK, the check when needed, COMMIT, three round trips at least for
every ack. ``refuse_foreign_receipt`` raises that refusal from inside the ACK statement (SQLSTATE
``RD001``; its DETAIL the message id, then the topic named, tab-separated), so that the statement,
and nothing else, is undone: an ack is one statement, committed on its own, and a refused one
still changes nothing.

Revision ID: 0024
Revises: 0023
"""

from alembic import op

revision = "0024"
down_revision = "0023"

REFUSE_FOREIGN_RECEIPT = """
CREATE FUNCTION redelivery.refuse_foreign_receipt(message_id bigint, topic text) RETURNS int
LANGUAGE plpgsql VOLATILE SET search_path = redelivery AS $$
BEGIN
  RAISE EXCEPTION USING ERRCODE = 'RD001',
    MESSAGE = format('message %s is not a message of topic %L: a receipt naming another topic '
                     'cannot answer for it', message_id, topic),
    DETAIL = message_id::text || E'\\t' || topic;
END $$;
"""


def upgrade() -> None:
    op.execute(REFUSE_FOREIGN_RECEIPT)


def downgrade() -> None:
    op.execute("DROP FUNCTION redelivery.refuse_foreign_receipt(bigint, text)")
