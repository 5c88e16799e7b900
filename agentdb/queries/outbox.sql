-- Outbox (G10). Rows are enqueued in the caller's own transaction; the relay
-- claims them under a lease, publishes outside any transaction, then marks
-- them - fenced by the lease token, because a relay that stalled past its
-- visibility timeout may have lost the row to another.

-- name: outbox_claim :many
-- Lease up to $2 due pending messages to relay $1 for $3: each gets a new
-- lease token, counts a delivery attempt and becomes invisible to other
-- relays until $3 passes. SKIP LOCKED keeps concurrent relays disjoint.
-- A due message that already used its attempts - its last claim never came
-- back as delivered or failed: the relay stopped mid-publish, again and
-- again (a poison message) - is not claimed again but buried as 'dead', as
-- outbox_mark_failed buries the last failure: the same UPDATE, by its CASEs
-- (one write per row, and the form Citus routes: routed_outbox_claim). Rows
-- with buried = true are those (only id, tenant_id, topic, attempts and
-- max_attempts are set); the others are the claimed messages.
-- guarantee: G10
-- zero rows: nothing is due.
-- params: $1 lease_owner text, $2 batch int8, $3 visibility interval
WITH due AS MATERIALIZED (
    -- The instant here, as the routed form must (Citus refuses now() inside a CASE).
    SELECT tenant_id, id, attempts >= max_attempts AS exhausted, now() + $3 AS visible_until
    FROM agent_outbox
    WHERE state = 'pending' AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE agent_outbox o
SET state = CASE WHEN d.exhausted THEN 'dead' ELSE o.state END,
    last_error = CASE WHEN d.exhausted
                      THEN 'no outcome recorded for attempt ' || o.attempts || ' of '
                           || o.max_attempts || ': its relay stopped or lost the claim mid-publish'
                      ELSE o.last_error END,
    lease_owner = CASE WHEN d.exhausted THEN o.lease_owner ELSE $1 END,
    lease_token = CASE WHEN d.exhausted THEN o.lease_token ELSE o.lease_token + 1 END,
    attempts = CASE WHEN d.exhausted THEN o.attempts ELSE o.attempts + 1 END,
    next_attempt_at = CASE WHEN d.exhausted THEN o.next_attempt_at ELSE d.visible_until END
FROM due d
WHERE o.tenant_id = d.tenant_id AND o.id = d.id
RETURNING d.exhausted AS buried, o.id, o.tenant_id,
          CASE WHEN d.exhausted THEN NULL ELSE o.task_id END AS task_id, o.topic,
          CASE WHEN d.exhausted THEN NULL ELSE o.payload END AS payload,
          o.attempts, o.max_attempts,
          CASE WHEN d.exhausted THEN NULL ELSE o.lease_owner END AS lease_owner,
          CASE WHEN d.exhausted THEN NULL ELSE o.lease_token END AS lease_token,
          CASE WHEN d.exhausted THEN NULL ELSE o.trace_id END AS trace_id,
          CASE WHEN d.exhausted THEN NULL ELSE o.span_id END AS span_id,
          CASE WHEN d.exhausted THEN NULL ELSE o.created_at END AS created_at;

-- name: outbox_deliver_and_claim :many
-- outbox_mark_delivered and outbox_claim in one statement (one round trip,
-- one commit): mark the messages this relay published ($4-$6, each fenced
-- by its lease token) delivered, and lease up to $2 due pending messages to
-- relay $1 for $3, as outbox_claim does. A relay under load pays one
-- statement per batch instead of two. Rows with delivered = true are the
-- marked messages (only tenant_id and id are set; one missing was no longer
-- held by this relay); the others are the claimed messages. The claim never takes a message this statement marks: those are
-- invisible until their visibility ends, and named apart as well for a
-- relay that stalled past it.
-- guarantee: G10, G11
-- params: $1 lease_owner text, $2 batch int8, $3 visibility interval, $4 tenant_ids uuid[], $5 ids uuid[], $6 lease_tokens int8[]
WITH marked AS (
    UPDATE agent_outbox o
    SET state = 'delivered', delivered_at = now(), last_error = NULL
    FROM unnest($4::uuid[], $5::uuid[], $6::int8[]) AS m (tenant_id, id, lease_token)
    WHERE o.tenant_id = m.tenant_id AND o.id = m.id
      -- pending, said so that only the primary key can find the rows: see
      -- "Held snapshots" in leases.sql
      AND o.lease_token = m.lease_token AND o.state NOT IN ('delivered', 'dead')
    RETURNING o.tenant_id, o.id
), due AS MATERIALIZED (
    SELECT q.tenant_id, q.id, q.attempts >= q.max_attempts AS exhausted,
           now() + $3 AS visible_until
    FROM agent_outbox q
    WHERE q.state = 'pending' AND q.next_attempt_at <= now()
      -- NOT IN, not NOT EXISTS: a hashed subplan, built once (the arrays hold no NULLs).
      AND (q.tenant_id, q.id) NOT IN (SELECT x.tenant_id, x.id
                                      FROM unnest($4::uuid[], $5::uuid[]) AS x (tenant_id, id))
    ORDER BY q.next_attempt_at
    LIMIT $2
    FOR UPDATE OF q SKIP LOCKED
), claimed AS (
    -- As in outbox_claim: the claim, or the bury of an exhausted message.
    UPDATE agent_outbox o
    SET state = CASE WHEN d.exhausted THEN 'dead' ELSE o.state END,
        last_error = CASE WHEN d.exhausted
                          THEN 'no outcome recorded for attempt ' || o.attempts || ' of '
                               || o.max_attempts
                               || ': its relay stopped or lost the claim mid-publish'
                          ELSE o.last_error END,
        lease_owner = CASE WHEN d.exhausted THEN o.lease_owner ELSE $1 END,
        lease_token = CASE WHEN d.exhausted THEN o.lease_token ELSE o.lease_token + 1 END,
        attempts = CASE WHEN d.exhausted THEN o.attempts ELSE o.attempts + 1 END,
        next_attempt_at = CASE WHEN d.exhausted THEN o.next_attempt_at ELSE d.visible_until END
    FROM due d
    WHERE o.tenant_id = d.tenant_id AND o.id = d.id
    RETURNING d.exhausted AS buried, o.id, o.tenant_id, o.task_id, o.topic, o.payload,
              o.attempts, o.max_attempts, o.lease_owner, o.lease_token, o.trace_id, o.span_id,
              o.created_at
)
SELECT false AS delivered, buried, id, tenant_id,
       CASE WHEN buried THEN NULL ELSE task_id END AS task_id, topic,
       CASE WHEN buried THEN NULL ELSE payload END AS payload, attempts, max_attempts,
       CASE WHEN buried THEN NULL ELSE lease_owner END AS lease_owner,
       CASE WHEN buried THEN NULL ELSE lease_token END AS lease_token,
       CASE WHEN buried THEN NULL ELSE trace_id END AS trace_id,
       CASE WHEN buried THEN NULL ELSE span_id END AS span_id,
       CASE WHEN buried THEN NULL ELSE created_at END AS created_at
FROM claimed
UNION ALL
SELECT true, false, id, tenant_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM marked;

-- name: outbox_enqueue :one
-- Add a message in the caller's transaction, so it commits (or not) with the
-- business rows it announces.
-- guarantee: G10
-- zero rows: never (an INSERT without ON CONFLICT returns its row or raises).
-- params: $1 tenant_id uuid, $2 id uuid, $3 task_id uuid, $4 topic text, $5 payload jsonb, $6 max_attempts int4, $7 trace_id text, $8 span_id text
INSERT INTO agent_outbox (id, tenant_id, task_id, topic, payload, max_attempts, trace_id, span_id)
VALUES ($2, $1, $3, $4, $5, $6, $7, $8)
RETURNING id, created_at;

-- name: outbox_get :one
-- Read one message's delivery state.
-- guarantee: G10
-- zero rows: no such message in this tenant.
-- params: $1 tenant_id uuid, $2 id uuid
SELECT id, tenant_id, task_id, topic, payload, state, attempts, max_attempts,
       next_attempt_at, lease_owner, lease_token, delivered_at, last_error, trace_id,
       span_id, created_at
FROM agent_outbox
WHERE tenant_id = $1 AND id = $2;

-- name: outbox_mark_delivered :many
-- Mark a batch of claimed messages delivered. Each element is fenced by its
-- lease token; the rows returned are the ones this relay still held.
-- guarantee: G10, G11
-- params: $1 tenant_ids uuid[], $2 ids uuid[], $3 lease_tokens int8[]
UPDATE agent_outbox o
SET state = 'delivered', delivered_at = now(), last_error = NULL
FROM unnest($1::uuid[], $2::uuid[], $3::int8[]) AS m (tenant_id, id, lease_token)
WHERE o.tenant_id = m.tenant_id AND o.id = m.id AND o.lease_token = m.lease_token
  AND o.state NOT IN ('delivered', 'dead')  -- pending: see "Held snapshots" in leases.sql
RETURNING o.tenant_id, o.id;

-- name: outbox_mark_failed :one
-- Record a failed publish: back to pending, due again after $4, or 'dead'
-- once the message used its attempts.
-- guarantee: G10
-- zero rows: this relay no longer holds the message (its lease token moved on, or it was already marked).
-- params: $1 tenant_id uuid, $2 id uuid, $3 lease_token int8, $4 backoff interval, $5 last_error text
UPDATE agent_outbox o
SET state = CASE WHEN o.attempts >= o.max_attempts THEN 'dead' ELSE 'pending' END,
    next_attempt_at = now() + $4,
    last_error = $5
WHERE o.tenant_id = $1 AND o.id = $2 AND o.lease_token = $3
  AND o.state NOT IN ('delivered', 'dead')  -- pending: see "Held snapshots" in leases.sql
RETURNING o.state, o.attempts, o.next_attempt_at;

-- name: outbox_retry :one
-- An operator's retry of a dead message: back to pending, due now, with its
-- attempts given back (agent_transitions: dead -> pending). A message that
-- names a task gets an event on it (outbox.retried: the actor, the message,
-- the attempts it had used); one without a task has no audit trail to write to.
-- guarantee: G10, G8
-- zero rows: no such message in this tenant, or it is not dead (already retried, delivered or pending).
-- params: $1 tenant_id uuid, $2 id uuid, $3 actor_id text
WITH prior AS (
    SELECT attempts FROM agent_outbox WHERE tenant_id = $1 AND id = $2
), upd AS (
    UPDATE agent_outbox o
    SET state = 'pending', attempts = 0, next_attempt_at = now(), last_error = NULL
    FROM prior
    WHERE o.tenant_id = $1 AND o.id = $2 AND o.state = 'dead'
    RETURNING o.id, o.tenant_id, o.task_id, o.topic, o.state, o.attempts, o.max_attempts,
              o.next_attempt_at, o.delivered_at, o.last_error, o.trace_id, o.span_id,
              prior.attempts AS prior_attempts
), ev AS (
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version, payload,
                              trace_id, span_id)
    SELECT u.tenant_id, u.task_id, 'outbox.retried', $3, t.workflow_version,
           jsonb_build_object('message_id', u.id, 'topic', u.topic,
                              'attempts', u.prior_attempts),
           u.trace_id, u.span_id
    FROM upd u
    JOIN agent_tasks t ON t.tenant_id = u.tenant_id AND t.id = u.task_id
)
SELECT id, tenant_id, topic, state, attempts, max_attempts, next_attempt_at, delivered_at,
       last_error
FROM upd;
