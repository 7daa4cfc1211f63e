//! The definition store's statements: publishing, loading, listing.

/// find_definition / publish_definition: a definition by (name, version).
/// `$1` name, `$2` version. Served by `uniq_workflow_name_version`.
pub const FIND_WORKFLOW: &str = "SELECT id, fingerprint FROM workflow WHERE name = $1 AND version = $2";

/// publish_definition: the workflow row. `$1` offset, `$2` name, `$3`
/// version, `$4` description, `$5` fingerprint, `$6` document.
pub const INSERT_WORKFLOW: &str = concat!(
    "INSERT INTO workflow (name, version, description, fingerprint, definition, created_at) \
     VALUES ($2, $3, $4, $5, $6, ",
    now!(),
    ") RETURNING id, created_at"
);

/// publish_definition: every task row in one statement. `$1` workflow id,
/// `$2` a JSON array of task records.
pub const INSERT_TASKS: &str = "\
INSERT INTO task (workflow_id, key, position, task_type, depends_on, config, timeout_seconds, retry,
                  compensate_for, max_attempts, priority, when_expr, trigger_rule, conditional)
SELECT $1, x.key, x.position, x.task_type, x.depends_on, x.config, x.timeout_seconds, x.retry,
       x.compensate_for, x.max_attempts, x.priority, x.when_expr, x.trigger_rule, x.conditional
FROM jsonb_to_recordset($2) AS x(key text, position int4, task_type text, depends_on jsonb, config jsonb,
                                 timeout_seconds float8, retry jsonb, compensate_for text, max_attempts int4,
                                 priority int2, when_expr text, trigger_rule text, conditional bool)";

/// load_definition: the workflow row. `$1` id.
pub const LOAD_WORKFLOW: &str =
    "SELECT id, name, version, description, fingerprint, definition, created_at FROM workflow WHERE id = $1";

/// load_definition: its task rows in declaration order. `$1` workflow id.
/// Served by `uniq_task_position`.
pub const LOAD_TASKS: &str = "\
SELECT key, position, task_type, depends_on, config, timeout_seconds, retry, compensate_for, max_attempts, priority,
       when_expr, trigger_rule
FROM task WHERE workflow_id = $1 ORDER BY position";

/// list_definitions: every definition, or the versions of `$1`, by name
/// then version, highest first (`uniq_workflow_name_version`), with task
/// counts (`task_pkey`).
pub const LIST_DEFINITIONS: &str = "\
SELECT w.id, w.name, w.version, w.fingerprint, w.created_at,
       (SELECT count(*) FROM task AS t WHERE t.workflow_id = w.id) AS tasks
FROM workflow AS w
WHERE $1::text IS NULL OR w.name = $1
ORDER BY w.name, w.version DESC";

/// publish_definition, after a wide definition went in: the planner's
/// statistics of `task` (see `PgStore::analyze_tasks`).
pub const ANALYZE_TASKS: &str = "ANALYZE task";
