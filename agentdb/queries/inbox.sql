-- Inbox (G11): a consumer records each message it processed, in the same
-- transaction as its own effect, so a redelivery is recognised.

-- name: inbox_record :execrows
-- Record that consumer $2 processed message $3, in the consumer's own
-- transaction. One row: first delivery, go ahead. Zero rows: a redelivery,
-- already processed - skip the effect.
-- guarantee: G11
-- zero rows: the message was already processed by this consumer.
-- params: $1 tenant_id uuid, $2 consumer text, $3 message_id uuid
INSERT INTO agent_inbox (tenant_id, consumer, message_id)
VALUES ($1, $2, $3)
ON CONFLICT (tenant_id, consumer, message_id) DO NOTHING;
