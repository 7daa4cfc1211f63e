//! The definition store's statements: publishing, loading, listing.

/// load: the workflow row (tag 0) and its task rows (tag 1) from one read
/// transaction, in one call. `?1` the workflow.
pub(crate) const LOAD_DEFINITION: &str = "BEGIN; \
     SELECT 0 AS tag, id, name, version, description, fingerprint, definition, created_at FROM workflow \
     WHERE id = ?1; \
     SELECT 1 AS tag, key, task_type, depends_on, config, timeout_seconds, retry, compensate_for, max_attempts, \
     priority, when_expr, trigger_rule FROM task WHERE workflow_id = ?1 ORDER BY position; COMMIT";

/// publish_definition in one call: the row already under (name, version),
/// if any (tag 0); otherwise the new workflow (tag 1) and its tasks, which
/// follow it only when it was inserted (`changes() = 1`). `?2` name, `?3`
/// version, `?4` description, `?5` fingerprint, `?6` document, `?7` tasks.
pub(crate) const PUBLISH_DEFINITION: &str = concat!(
    "BEGIN IMMEDIATE; \
     SELECT 0 AS tag, id, fingerprint FROM workflow WHERE name = ?2 AND version = ?3; \
     INSERT INTO workflow (name, version, description, fingerprint, definition, created_at) \
     SELECT ?2, ?3, ?4, ?5, ?6, ",
    now!(),
    " WHERE NOT EXISTS (SELECT 1 FROM workflow WHERE name = ?2 AND version = ?3) \
     RETURNING 1 AS tag, id, created_at; \
     INSERT INTO task (workflow_id, key, position, task_type, depends_on, config, timeout_seconds, retry, \
     compensate_for, max_attempts, priority, when_expr, trigger_rule, conditional) \
     SELECT (SELECT id FROM workflow WHERE name = ?2 AND version = ?3), j.value ->> 'key', j.key, \
     j.value ->> 'task_type', j.value -> 'depends_on', j.value -> 'config', j.value ->> 'timeout_seconds', \
     j.value -> 'retry', j.value ->> 'compensate_for', j.value ->> 'max_attempts', \
     j.value ->> 'priority', j.value ->> 'when_expr', j.value ->> 'trigger_rule', j.value ->> 'conditional' \
     FROM json_each(?7) AS j WHERE changes() = 1 ORDER BY j.key; \
     COMMIT"
);

/// list_definitions: every definition, or the versions of `?1`, by name
/// then version, highest first (`uniq_workflow_name_version`), each with
/// its task count (`task_pkey`).
pub(crate) const LIST_DEFINITIONS: &str = "SELECT w.id, w.name, w.version, w.fingerprint, w.created_at, \
     (SELECT count(*) FROM task t WHERE t.workflow_id = w.id) AS tasks \
     FROM workflow w WHERE ?1 IS NULL OR w.name = ?1 ORDER BY w.name, w.version DESC";

/// find_definition: a definition by (name, version)
/// (`uniq_workflow_name_version`). `?1` name, `?2` version.
pub(crate) const FIND_WORKFLOW: &str = "SELECT id FROM workflow WHERE name = ?1 AND version = ?2";
