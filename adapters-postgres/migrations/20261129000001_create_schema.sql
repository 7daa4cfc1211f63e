-- FlowForge schema (DESIGN §4). The CHECK constraints carry the state
-- machines' invariants, so even a manual UPDATE cannot break them; every
-- index names the query it serves.

CREATE TABLE workflow (
    id           BIGSERIAL PRIMARY KEY,
    name         TEXT NOT NULL,
    version      INTEGER NOT NULL,
    description  TEXT NOT NULL,
    fingerprint  TEXT NOT NULL,
    definition   JSONB NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL,
    CONSTRAINT uniq_workflow_name_version UNIQUE (name, version),
    CONSTRAINT workflow_version_positive CHECK (version >= 1),
    CONSTRAINT workflow_name_not_blank CHECK (btrim(name) <> ''),
    CONSTRAINT workflow_fingerprint_sha256 CHECK (fingerprint ~ '^[0-9a-f]{64}$'),
    CONSTRAINT workflow_definition_json CHECK (jsonb_typeof(definition) = 'object')
);

CREATE TABLE task (
    workflow_id     BIGINT NOT NULL REFERENCES workflow (id),
    key             TEXT NOT NULL,
    position        INTEGER NOT NULL,
    task_type       TEXT NOT NULL,
    depends_on      JSONB NOT NULL,
    -- NULL: not written (kept apart from `{}` so a load returns the very
    -- document that was published).
    config          JSONB,
    timeout_seconds DOUBLE PRECISION,
    retry           JSONB,
    compensate_for  TEXT,
    -- Effective values (defaults folded in), for the reaper's SQL.
    max_attempts    INTEGER NOT NULL,
    CONSTRAINT task_pkey PRIMARY KEY (workflow_id, key),
    CONSTRAINT uniq_task_position UNIQUE (workflow_id, position),
    CONSTRAINT task_key_not_blank CHECK (btrim(key) <> ''),
    CONSTRAINT task_type_not_blank CHECK (btrim(task_type) <> ''),
    CONSTRAINT task_max_attempts_positive CHECK (max_attempts >= 1),
    CONSTRAINT task_depends_on_json CHECK (jsonb_typeof(depends_on) = 'array'),
    CONSTRAINT task_config_json CHECK (config IS NULL OR jsonb_typeof(config) = 'object'),
    CONSTRAINT task_retry_json CHECK (retry IS NULL OR jsonb_typeof(retry) = 'object')
);

CREATE TABLE workflow_run (
    id                  UUID PRIMARY KEY,
    workflow_id         BIGINT NOT NULL REFERENCES workflow (id),
    state               TEXT NOT NULL,
    input               JSONB NOT NULL,
    cancel_requested_at TIMESTAMPTZ,
    -- A cancel request the scheduler has not handled yet.
    needs_pass          BOOLEAN NOT NULL DEFAULT FALSE,
    created_at          TIMESTAMPTZ NOT NULL,
    started_at          TIMESTAMPTZ,
    finished_at         TIMESTAMPTZ,
    CONSTRAINT workflowrun_state_valid CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    CONSTRAINT workflowrun_finished_iff_terminal
        CHECK ((state IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL))
);

CREATE TABLE task_run (
    id               BIGSERIAL PRIMARY KEY,
    run_id           UUID NOT NULL REFERENCES workflow_run (id),
    task_key         TEXT NOT NULL,
    compensate_for   TEXT,
    state            TEXT NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 1,
    fencing_token    BIGINT NOT NULL DEFAULT 0,
    -- Dependencies not yet succeeded; the scheduler lowers it (DESIGN §5).
    pending_deps     INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_expires_at TIMESTAMPTZ,
    retry_at         TIMESTAMPTZ,
    cancel_reason    TEXT,
    -- A change the scheduler has not reacted to yet.
    needs_pass       BOOLEAN NOT NULL DEFAULT FALSE,
    created_at       TIMESTAMPTZ NOT NULL,
    started_at       TIMESTAMPTZ,
    finished_at      TIMESTAMPTZ,
    result           JSONB,
    error            TEXT,
    CONSTRAINT uniq_taskrun_run_key UNIQUE (run_id, task_key),
    CONSTRAINT taskrun_state_valid
        CHECK (state IN ('pending', 'ready', 'running', 'succeeded', 'failed', 'retrying', 'cancelled')),
    CONSTRAINT taskrun_lease_iff_running CHECK ((state = 'running') = (lease_expires_at IS NOT NULL)),
    CONSTRAINT taskrun_owner_iff_running CHECK ((state = 'running') = (lease_owner IS NOT NULL)),
    CONSTRAINT taskrun_retry_at_iff_retrying CHECK ((state = 'retrying') = (retry_at IS NOT NULL)),
    CONSTRAINT taskrun_cancel_reason_iff_cancelled CHECK ((state = 'cancelled') = (cancel_reason IS NOT NULL)),
    CONSTRAINT taskrun_cancel_reason_valid CHECK (cancel_reason IN ('user', 'upstream_failed')),
    CONSTRAINT taskrun_finished_iff_finished_state
        CHECK ((state IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT taskrun_result_only_when_succeeded CHECK (result IS NULL OR state = 'succeeded'),
    CONSTRAINT taskrun_attempt_positive CHECK (attempt >= 1),
    CONSTRAINT taskrun_token_nonnegative CHECK (fencing_token >= 0),
    CONSTRAINT taskrun_pending_deps_nonnegative CHECK (pending_deps >= 0)
);

CREATE TABLE task_run_event (
    id            BIGSERIAL PRIMARY KEY,
    task_run_id   BIGINT NOT NULL REFERENCES task_run (id),
    run_id        UUID NOT NULL,
    task_key      TEXT NOT NULL,
    transition    TEXT NOT NULL,
    from_state    TEXT,
    to_state      TEXT,
    attempt       INTEGER NOT NULL,
    fencing_token BIGINT NOT NULL,
    worker        TEXT,
    at            TIMESTAMPTZ NOT NULL,
    error         TEXT,
    CONSTRAINT taskrunevent_transition_valid CHECK (transition IN (
        'dependencies_satisfied', 'cancel_pending', 'claim', 'cancel_ready', 'succeed', 'fail',
        'cancel_running', 'reap_lease', 'reap_lease_final', 'schedule_retry', 'retry_ready',
        'cancel_retrying', 'stale_write_rejected')),
    -- An audit event records no state change; a transition records both ends.
    CONSTRAINT taskrunevent_states_iff_transition
        CHECK ((transition = 'stale_write_rejected') = (from_state IS NULL AND to_state IS NULL))
);

CREATE TABLE workflow_run_event (
    id         BIGSERIAL PRIMARY KEY,
    run_id     UUID NOT NULL REFERENCES workflow_run (id),
    transition TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    at         TIMESTAMPTZ NOT NULL,
    CONSTRAINT workflowrunevent_transition_valid
        CHECK (transition IN ('start', 'cancel_before_start', 'succeed', 'fail', 'cancel'))
);

CREATE TABLE outbox (
    id            BIGSERIAL PRIMARY KEY,
    task_run_id   BIGINT NOT NULL REFERENCES task_run (id),
    run_id        UUID NOT NULL,
    task_key      TEXT NOT NULL,
    task_type     TEXT NOT NULL,
    fencing_token BIGINT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL,
    published_at  TIMESTAMPTZ,
    -- One dispatch per readiness (decision 9).
    CONSTRAINT uniq_outbox_taskrun_token UNIQUE (task_run_id, fencing_token),
    CONSTRAINT outbox_token_nonnegative CHECK (fencing_token >= 0)
);

CREATE TABLE worker (
    id           TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    task_types   JSONB NOT NULL,
    concurrency  INTEGER NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL,
    last_seen_at TIMESTAMPTZ NOT NULL,
    stopped_at   TIMESTAMPTZ,
    CONSTRAINT worker_concurrency_positive CHECK (concurrency >= 1)
);

-- Every index serves named queries (see src/queries.rs); the partial ones
-- hold only active work, so a scheduler pass costs in proportion to active
-- work, never to history. Unique constraints double as indexes:
-- uniq_workflow_name_version (find_definition, publish_definition),
-- uniq_task_position (load_definition), task_pkey (start_run, the reaper's and
-- the promotions' task_type lookups), uniq_taskrun_run_key (get_run,
-- task_inputs, tally, succeeded_keys, compensator_states, cancel_pending,
-- satisfy_dependencies' count update), uniq_outbox_taskrun_token (the
-- outbox's ON CONFLICT).

-- runs_with_work, take_flagged: task runs flagged for the scheduler.
CREATE INDEX taskrun_needs_pass_idx ON task_run (run_id) WHERE needs_pass;
-- runs_with_work, promote_due_retries, next_deadline: retries by due time.
CREATE INDEX taskrun_retry_due_idx ON task_run (retry_at) WHERE state = 'retrying';
-- reap_expired_leases, next_deadline: the reaper's scan of running leases.
CREATE INDEX taskrun_lease_expiry_idx ON task_run (lease_expires_at) WHERE state = 'running';
-- satisfy_dependencies (promotion), promote_due_retries, cancel_waiting,
-- activity: a pass's per-run queries over active rows, so a pass never walks
-- finished ones.
CREATE INDEX taskrun_active_idx ON task_run (run_id, state) WHERE state IN ('pending', 'ready', 'running', 'retrying');
-- runs_with_work: cancel requests not yet handled.
CREATE INDEX workflowrun_needs_pass_idx ON workflow_run (id) WHERE needs_pass;
-- runs_with_work: the runs not yet terminal, so finished history is never scanned.
CREATE INDEX workflowrun_active_idx ON workflow_run (id) WHERE state IN ('pending', 'running');
-- list_runs: newest first.
CREATE INDEX workflowrun_created_idx ON workflow_run (created_at DESC);
-- get_run: a run's history.
CREATE INDEX taskrunevent_run_idx ON task_run_event (run_id, id);
-- get_run: a run's transitions.
CREATE INDEX workflowrunevent_run_idx ON workflow_run_event (run_id, id);
-- begin_sweep: the publisher's scan of unpublished rows, oldest first.
CREATE INDEX outbox_unpublished_idx ON outbox (id) WHERE published_at IS NULL;
