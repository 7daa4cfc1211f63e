-- FlowForge schema on SQLite (DESIGN §4), mirroring the PostgreSQL one:
-- same tables, columns, named CHECK constraints, unique keys and partial
-- indexes. The CHECK constraints carry the state machines' invariants, so
-- even a manual UPDATE cannot break them; every index names the query it
-- serves.
--
-- Dialect differences, each deliberate:
-- * STRICT tables, so a column holds only values of its declared type.
-- * Times are INTEGER milliseconds since the Unix epoch (store time: SQLite's
--   clock plus the Clock port's offset, computed inside each statement).
-- * JSON is TEXT checked with json_valid (no JSONB column type).
-- * Booleans are INTEGER 0/1, UUIDs are hyphenated TEXT.
-- * SQLite's trim() stands in for btrim(): both strip spaces only.

CREATE TABLE workflow (
    id           INTEGER PRIMARY KEY,
    name         TEXT NOT NULL,
    version      INTEGER NOT NULL,
    description  TEXT NOT NULL,
    fingerprint  TEXT NOT NULL,
    -- The document as written (serde of WorkflowDocument).
    definition   TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    CONSTRAINT uniq_workflow_name_version UNIQUE (name, version),
    CONSTRAINT workflow_version_positive CHECK (version >= 1),
    CONSTRAINT workflow_name_not_blank CHECK (trim(name) <> ''),
    CONSTRAINT workflow_fingerprint_sha256
        CHECK (length(fingerprint) = 64 AND fingerprint NOT GLOB '*[^0-9a-f]*'),
    CONSTRAINT workflow_definition_json CHECK (json_valid(definition) AND json_type(definition) = 'object')
) STRICT;

CREATE TABLE task (
    workflow_id     INTEGER NOT NULL REFERENCES workflow (id),
    key             TEXT NOT NULL,
    position        INTEGER NOT NULL,
    task_type       TEXT NOT NULL,
    depends_on      TEXT NOT NULL,
    -- NULL: not written (kept apart from `{}` so a load returns the very
    -- document that was published).
    config          TEXT,
    timeout_seconds REAL,
    retry           TEXT,
    compensate_for  TEXT,
    -- Effective values (defaults folded in), for the reaper's SQL.
    max_attempts    INTEGER NOT NULL,
    CONSTRAINT task_pkey PRIMARY KEY (workflow_id, key),
    CONSTRAINT uniq_task_position UNIQUE (workflow_id, position),
    CONSTRAINT task_key_not_blank CHECK (trim(key) <> ''),
    CONSTRAINT task_type_not_blank CHECK (trim(task_type) <> ''),
    CONSTRAINT task_max_attempts_positive CHECK (max_attempts >= 1),
    CONSTRAINT task_depends_on_json CHECK (json_valid(depends_on) AND json_type(depends_on) = 'array'),
    CONSTRAINT task_config_json CHECK (config IS NULL OR (json_valid(config) AND json_type(config) = 'object')),
    CONSTRAINT task_retry_json CHECK (retry IS NULL OR (json_valid(retry) AND json_type(retry) = 'object'))
) STRICT;

CREATE TABLE workflow_run (
    id                  TEXT PRIMARY KEY,
    workflow_id         INTEGER NOT NULL REFERENCES workflow (id),
    state               TEXT NOT NULL,
    input               TEXT NOT NULL,
    cancel_requested_at INTEGER,
    -- A cancel request the scheduler has not handled yet.
    needs_pass          INTEGER NOT NULL DEFAULT 0,
    created_at          INTEGER NOT NULL,
    started_at          INTEGER,
    finished_at         INTEGER,
    CONSTRAINT workflowrun_id_uuid CHECK (length(id) = 36),
    CONSTRAINT workflowrun_state_valid CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    CONSTRAINT workflowrun_finished_iff_terminal
        CHECK ((state IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT workflowrun_needs_pass_bool CHECK (needs_pass IN (0, 1)),
    CONSTRAINT workflowrun_input_json CHECK (json_valid(input))
) STRICT;

CREATE TABLE task_run (
    id               INTEGER PRIMARY KEY,
    run_id           TEXT NOT NULL REFERENCES workflow_run (id),
    task_key         TEXT NOT NULL,
    compensate_for   TEXT,
    state            TEXT NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 1,
    fencing_token    INTEGER NOT NULL DEFAULT 0,
    -- Dependencies not yet succeeded; the scheduler lowers it (DESIGN §5).
    pending_deps     INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    retry_at         INTEGER,
    cancel_reason    TEXT,
    -- A change the scheduler has not reacted to yet.
    needs_pass       INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER,
    result           TEXT,
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
    CONSTRAINT taskrun_pending_deps_nonnegative CHECK (pending_deps >= 0),
    CONSTRAINT taskrun_needs_pass_bool CHECK (needs_pass IN (0, 1)),
    CONSTRAINT taskrun_result_json CHECK (result IS NULL OR json_valid(result))
) STRICT;

CREATE TABLE task_run_event (
    id            INTEGER PRIMARY KEY,
    task_run_id   INTEGER NOT NULL REFERENCES task_run (id),
    run_id        TEXT NOT NULL,
    task_key      TEXT NOT NULL,
    transition    TEXT NOT NULL,
    from_state    TEXT,
    to_state      TEXT,
    attempt       INTEGER NOT NULL,
    fencing_token INTEGER NOT NULL,
    worker        TEXT,
    at            INTEGER NOT NULL,
    error         TEXT,
    CONSTRAINT taskrunevent_transition_valid CHECK (transition IN (
        'dependencies_satisfied', 'cancel_pending', 'claim', 'cancel_ready', 'succeed', 'fail',
        'cancel_running', 'reap_lease', 'reap_lease_final', 'schedule_retry', 'retry_ready',
        'cancel_retrying', 'stale_write_rejected')),
    -- An audit event records no state change; a transition records both ends.
    CONSTRAINT taskrunevent_states_iff_transition
        CHECK ((transition = 'stale_write_rejected') = (from_state IS NULL AND to_state IS NULL))
) STRICT;

CREATE TABLE workflow_run_event (
    id         INTEGER PRIMARY KEY,
    run_id     TEXT NOT NULL REFERENCES workflow_run (id),
    transition TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    at         INTEGER NOT NULL,
    CONSTRAINT workflowrunevent_transition_valid
        CHECK (transition IN ('start', 'cancel_before_start', 'succeed', 'fail', 'cancel'))
) STRICT;

CREATE TABLE outbox (
    id            INTEGER PRIMARY KEY,
    task_run_id   INTEGER NOT NULL REFERENCES task_run (id),
    run_id        TEXT NOT NULL,
    task_key      TEXT NOT NULL,
    task_type     TEXT NOT NULL,
    fencing_token INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    published_at  INTEGER,
    -- One dispatch per readiness (decision 9).
    CONSTRAINT uniq_outbox_taskrun_token UNIQUE (task_run_id, fencing_token),
    CONSTRAINT outbox_token_nonnegative CHECK (fencing_token >= 0)
) STRICT;

CREATE TABLE worker (
    id           TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    task_types   TEXT NOT NULL,
    concurrency  INTEGER NOT NULL,
    started_at   INTEGER NOT NULL,
    last_seen_at INTEGER NOT NULL,
    stopped_at   INTEGER,
    CONSTRAINT worker_concurrency_positive CHECK (concurrency >= 1),
    CONSTRAINT worker_task_types_json CHECK (json_valid(task_types) AND json_type(task_types) = 'array')
) STRICT;

-- runs_with_work, take_flagged: task runs flagged for the scheduler.
CREATE INDEX taskrun_needs_pass_idx ON task_run (run_id) WHERE needs_pass;
-- runs_with_work, promote_due_retries, next_deadline: retries by due time.
CREATE INDEX taskrun_retry_due_idx ON task_run (retry_at) WHERE state = 'retrying';
-- reap_expired_leases, next_deadline: the reaper's scan of running leases.
CREATE INDEX taskrun_lease_expiry_idx ON task_run (lease_expires_at) WHERE state = 'running';
-- A pass's per-run queries over waiting rows (promotion, cancellation).
CREATE INDEX taskrun_waiting_idx ON task_run (run_id, state) WHERE state IN ('pending', 'ready', 'retrying');
-- runs_with_work: cancel requests not yet handled.
CREATE INDEX workflowrun_needs_pass_idx ON workflow_run (id) WHERE needs_pass;
-- list_runs: newest first.
CREATE INDEX workflowrun_created_idx ON workflow_run (created_at DESC);
-- get_run: a run's history.
CREATE INDEX taskrunevent_run_idx ON task_run_event (run_id, id);
-- get_run: a run's transitions.
CREATE INDEX workflowrunevent_run_idx ON workflow_run_event (run_id, id);
-- begin_sweep: the publisher's scan of unpublished rows, oldest first.
CREATE INDEX outbox_unpublished_idx ON outbox (id) WHERE published_at IS NULL;
