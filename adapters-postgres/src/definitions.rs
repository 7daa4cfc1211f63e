//! Publishing and loading definitions (docs/design/definitions.md#publishing
//! and docs/design/definitions.md#loading): atomic, idempotent by fingerprint,
//! exclusive by (name, version), and re-validated through the domain on the way
//! out.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use flowforge_domain::concurrency::stored_limits;
use flowforge_domain::condition::Trigger;
use flowforge_domain::map::stored_maps;
use flowforge_domain::{Defaults, Priority, RetrySpec, TaskDocument, WorkflowDefinition, WorkflowDocument};
use flowforge_ports::store::DefinitionSummary;
use flowforge_ports::{DefinitionStore, LoadError, PublishError, Published, WorkflowId, store};
use serde_json::{Value, json};

use crate::error::{store_error, violated_constraint};
use crate::queries;
use crate::rows::{DefinitionRow, to_i32};
use crate::store::PgStore;

#[derive(Debug, sqlx::FromRow)]
struct WorkflowRow {
    id: i64,
    name: String,
    version: i32,
    description: String,
    fingerprint: String,
    definition: Value,
    created_at: DateTime<Utc>,
}

#[derive(Debug, sqlx::FromRow)]
struct TaskRow {
    key: String,
    position: i32,
    task_type: String,
    depends_on: Value,
    config: Option<Value>,
    timeout_seconds: Option<f64>,
    retry: Option<Value>,
    compensate_for: Option<String>,
    max_attempts: i32,
    priority: Option<i16>,
    when_expr: Option<String>,
    trigger_rule: Option<String>,
}

/// One record per task for `jsonb_to_recordset`: the task as written plus
/// its declaration index and effective `max_attempts` (for the reaper).
fn task_records(def: &WorkflowDefinition) -> Result<Value, store::Error> {
    let mut records = Vec::with_capacity(def.tasks().len());
    for (position, task) in def.tasks().iter().enumerate() {
        let doc = task.document();
        records.push(json!({
            "key": doc.key,
            "position": position,
            "task_type": doc.task_type,
            "depends_on": doc.depends_on,
            // NULL keeps "config absent" apart from "config: {}", so a
            // load gives back the very document that was published.
            "config": doc.config,
            "timeout_seconds": doc.timeout_seconds,
            "retry": doc.retry.as_ref().map(serde_json::to_value).transpose()
                .map_err(|e| store::Error::Other(format!("cannot encode task '{}': {e}", doc.key)))?,
            "compensate_for": doc.compensate_for,
            "max_attempts": def.retry_policy(task).max_attempts,
            "priority": doc.priority,
            "when_expr": doc.when,
            "trigger_rule": doc.trigger.map(Trigger::as_str),
            "conditional": task.holds(),
        }));
    }
    Ok(Value::Array(records))
}

/// Why a stored definition is not valid, for [`LoadError::Invalid`].
fn invalid(row: &WorkflowRow, problem: impl Into<String>) -> LoadError {
    LoadError::Invalid {
        workflow: format!("'{}' version {} (id {})", row.name, row.version, row.id),
        problem: problem.into(),
    }
}

/// Rebuilds the definition from its rows through the domain constructors,
/// then checks it is what was published: same fingerprint, same effective
/// attempt limits.
fn rebuild(row: &WorkflowRow, tasks: Vec<TaskRow>) -> Result<WorkflowDefinition, LoadError> {
    let version =
        u32::try_from(row.version).map_err(|_| invalid(row, format!("version {} is negative", row.version)))?;
    let defaults: Option<Defaults> = match row.definition.get("defaults") {
        None | Some(Value::Null) => None,
        Some(d) => Some(
            serde_json::from_value(d.clone())
                .map_err(|e| invalid(row, format!("the stored defaults are not valid: {e}")))?,
        ),
    };
    let (concurrency, mut task_limits) = stored_limits(&row.definition).map_err(|e| invalid(row, e))?;
    let mut maps = stored_maps(&row.definition).map_err(|e| invalid(row, e))?;
    let mut documents = Vec::with_capacity(tasks.len());
    let mut limits = Vec::with_capacity(tasks.len());
    for (index, t) in tasks.into_iter().enumerate() {
        if usize::try_from(t.position).ok() != Some(index) {
            return Err(invalid(
                row,
                format!(
                    "task '{}' is at position {}, expected {index}: a task row is missing or duplicated",
                    t.key, t.position
                ),
            ));
        }
        let depends_on: Vec<String> = serde_json::from_value(t.depends_on).map_err(|e| {
            invalid(
                row,
                format!("task '{}': depends_on is not a list of task keys: {e}", t.key),
            )
        })?;
        let retry: Option<RetrySpec> = t.retry.map(serde_json::from_value).transpose().map_err(|e| {
            invalid(
                row,
                format!("task '{}': the stored retry policy is not valid: {e}", t.key),
            )
        })?;
        let priority = t
            .priority
            .map(|p| Priority::new(p.into()))
            .transpose()
            .map_err(|e| invalid(row, format!("task '{}': {e}", t.key)))?;
        let trigger: Option<Trigger> = t
            .trigger_rule
            .map(|r| serde_json::from_value(Value::String(r)))
            .transpose()
            .map_err(|e| invalid(row, format!("task '{}': the stored trigger is not valid: {e}", t.key)))?;
        limits.push((t.key.clone(), i64::from(t.max_attempts)));
        documents.push(TaskDocument {
            concurrency: task_limits.remove(&t.key),
            map: maps.remove(&t.key),
            key: t.key,
            task_type: t.task_type,
            depends_on,
            config: t.config,
            timeout_seconds: t.timeout_seconds,
            retry,
            compensate_for: t.compensate_for,
            priority,
            when: t.when_expr,
            trigger,
        });
    }
    let doc = WorkflowDocument {
        name: row.name.clone(),
        version,
        description: (!row.description.is_empty()).then(|| row.description.clone()),
        defaults,
        concurrency,
        tasks: documents,
    };
    WorkflowDefinition::from_stored(doc, &limits, &row.fingerprint).map_err(|e| invalid(row, e.to_string()))
}

impl PgStore {
    /// Refreshes the planner's statistics of `task` after a wide definition
    /// went in, best effort. Until ANALYZE sees a workflow's rows the planner
    /// estimates it at one row, and the per-row task-type lookups of a wide
    /// run's dispatches may then take the `(workflow_id, position)` index and
    /// filter the key, one pass over the workflow's tasks per row: quadratic.
    /// Publishing is rare; the sample is bounded.
    async fn analyze_tasks(&self) {
        if let Err(e) = sqlx::query(queries::ANALYZE_TASKS).execute(&self.inner.pool).await {
            tracing::warn!(error = %e, "could not refresh the statistics of table task after publishing");
        }
    }

    async fn load(&self, id: WorkflowId) -> Result<Option<Published>, LoadError> {
        let pool = &self.inner.pool;
        let Some(row) = sqlx::query_as::<_, WorkflowRow>(queries::LOAD_WORKFLOW)
            .bind(id.0)
            .fetch_optional(pool)
            .await
            .map_err(store_error)?
        else {
            return Ok(None);
        };
        let tasks = sqlx::query_as::<_, TaskRow>(queries::LOAD_TASKS)
            .bind(id.0)
            .fetch_all(pool)
            .await
            .map_err(store_error)?;
        let def = rebuild(&row, tasks)?;
        Ok(Some(Published {
            id,
            definition: Arc::new(def),
            fingerprint: row.fingerprint,
            created_at: row.created_at,
            created: false,
        }))
    }

    /// The stored (name, version), if any: its id and fingerprint.
    async fn find(&self, name: &str, version: i32) -> Result<Option<(i64, String)>, store::Error> {
        sqlx::query_as(queries::FIND_WORKFLOW)
            .bind(name)
            .bind(version)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(store_error)
    }

    /// The answer for a (name, version) that exists: the stored definition
    /// when the content is the same, else a conflict naming both
    /// fingerprints.
    async fn existing(&self, def: &WorkflowDefinition, id: i64, stored: String) -> Result<Published, PublishError> {
        let fingerprint = def.fingerprint();
        if stored != fingerprint {
            return Err(PublishError::Conflict {
                name: def.name().to_owned(),
                version: def.version(),
                existing: stored,
                new: fingerprint,
            });
        }
        match self.load(WorkflowId(id)).await {
            Ok(Some(published)) => Ok(published),
            Ok(None) => Err(PublishError::LostRace {
                name: def.name().to_owned(),
                version: def.version(),
            }),
            Err(LoadError::Store(e)) => Err(PublishError::Store(e)),
            Err(e) => Err(PublishError::Store(store::Error::Corrupt(e.to_string()))),
        }
    }

    /// Inserts workflow and tasks in one transaction. `Ok(None)`: the
    /// unique constraint says a concurrent publish won; this transaction
    /// was rolled back.
    async fn insert(&self, def: &WorkflowDefinition, fingerprint: &str) -> Result<Option<Published>, store::Error> {
        let document = serde_json::to_value(def.document())
            .map_err(|e| store::Error::Other(format!("cannot encode the definition: {e}")))?;
        let records = task_records(def)?;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        let inserted: Result<(i64, DateTime<Utc>), sqlx::Error> = sqlx::query_as(queries::INSERT_WORKFLOW)
            .bind(self.offset())
            .bind(def.name())
            .bind(to_i32(def.version(), "version")?)
            .bind(def.description())
            .bind(fingerprint)
            .bind(&document)
            .fetch_one(&mut *tx)
            .await;
        let (id, created_at) = match inserted {
            Ok(row) => row,
            Err(e) => {
                if violated_constraint(&e).is_some_and(|(code, c)| code == "23505" && c == "uniq_workflow_name_version")
                {
                    // Dropping `tx` rolls back: nothing of this publish remains.
                    return Ok(None);
                }
                return Err(store_error(e));
            }
        };
        sqlx::query(queries::INSERT_TASKS)
            .bind(id)
            .bind(&records)
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;
        Ok(Some(Published {
            id: WorkflowId(id),
            definition: Arc::new(def.clone()),
            fingerprint: fingerprint.to_owned(),
            created_at,
            created: true,
        }))
    }
}

/// From this many tasks a new definition refreshes the planner's statistics
/// of `task`.
const WIDE_DEFINITION: usize = 100;

impl DefinitionStore for PgStore {
    async fn publish_definition(&self, def: &WorkflowDefinition) -> Result<Published, PublishError> {
        // The graph was validated when `def` was built: a
        // WorkflowDefinition cannot exist otherwise.
        let version = to_i32(def.version(), "version")?;
        if let Some((id, stored)) = self.find(def.name(), version).await? {
            return self.existing(def, id, stored).await;
        }
        let fingerprint = def.fingerprint();
        if let Some(published) = self.insert(def, &fingerprint).await? {
            if def.tasks().len() >= WIDE_DEFINITION {
                self.analyze_tasks().await;
            }
            return Ok(published);
        }
        // A concurrent first publish committed the same (name, version):
        // its row decides (docs/design/definitions.md#the-publish-race).
        match self.find(def.name(), version).await? {
            Some((id, stored)) => self.existing(def, id, stored).await,
            None => Err(PublishError::LostRace {
                name: def.name().to_owned(),
                version: def.version(),
            }),
        }
    }

    async fn load_definition(&self, id: WorkflowId) -> Result<Published, LoadError> {
        self.load(id)
            .await?
            .ok_or_else(|| LoadError::NotFound(format!("id {id}")))
    }

    async fn find_definition(&self, name: &str, version: u32) -> Result<Option<Published>, LoadError> {
        let Ok(version) = i32::try_from(version) else {
            return Ok(None);
        };
        match self.find(name, version).await? {
            Some((id, _)) => self.load(WorkflowId(id)).await,
            None => Ok(None),
        }
    }

    async fn list_definitions(&self, name: Option<&str>) -> Result<Vec<DefinitionSummary>, store::Error> {
        let rows: Vec<DefinitionRow> = sqlx::query_as(queries::LIST_DEFINITIONS)
            .bind(name)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(store_error)?;
        rows.into_iter().map(DefinitionRow::into_summary).collect()
    }
}
