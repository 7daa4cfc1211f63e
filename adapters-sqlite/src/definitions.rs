//! Publishing and loading definitions (docs/design/definitions.md#publishing
//! and docs/design/definitions.md#loading).
//!
//! The task rows are the authority on load: they are re-validated through
//! the domain constructors, and the result must fingerprint to the stored
//! fingerprint. The `definition` column (the document as written) supplies
//! only what has no column of its own: the workflow defaults.

use std::sync::Arc;

use flowforge_domain::concurrency::stored_limits;
use flowforge_domain::condition::Trigger;
use flowforge_domain::map::stored_maps;
use flowforge_domain::{Defaults, Priority, RetrySpec, TaskDocument, WorkflowDefinition, WorkflowDocument};
use flowforge_ports::store::DefinitionSummary;
use flowforge_ports::{DefinitionStore, LoadError, PublishError, Published, WorkflowId, store};
use serde_json::{Map, Value, json};

use crate::error::is_unique_violation;
use crate::queries;
use crate::rows::DefinitionRow;
use crate::rows::time;
use crate::rows::{col, decode};
use crate::store::{Failure, SqliteStore, padded, sql, tagged};

#[derive(Debug, sqlx::FromRow)]
struct WorkflowRow {
    id: i64,
    name: String,
    version: i64,
    description: String,
    fingerprint: String,
    definition: String,
    created_at: i64,
}

#[derive(Debug, sqlx::FromRow)]
struct TaskRow {
    key: String,
    task_type: String,
    depends_on: String,
    config: Option<String>,
    timeout_seconds: Option<f64>,
    retry: Option<String>,
    compensate_for: Option<String>,
    max_attempts: i64,
    priority: Option<i64>,
    when_expr: Option<String>,
    trigger_rule: Option<String>,
}

/// The task rows of `def`, as one JSON array for a `json_each` insert.
fn task_rows(def: &WorkflowDefinition) -> Result<String, store::Error> {
    let rows: Vec<Value> = def
        .tasks()
        .iter()
        .map(|t| {
            let mut row = Map::new();
            row.insert("key".into(), json!(t.key()));
            row.insert("task_type".into(), json!(t.task_type()));
            row.insert("depends_on".into(), json!(t.depends_on()));
            if let Some(c) = &t.document().config {
                row.insert("config".into(), c.clone());
            }
            if let Some(s) = t.timeout_seconds() {
                row.insert("timeout_seconds".into(), json!(s));
            }
            if let Some(r) = t.retry() {
                row.insert("retry".into(), json!(r));
            }
            if let Some(c) = t.compensate_for() {
                row.insert("compensate_for".into(), json!(c));
            }
            if let Some(p) = t.priority() {
                row.insert("priority".into(), json!(p.get()));
            }
            if let Some(w) = t.when() {
                row.insert("when_expr".into(), json!(w));
            }
            if let Some(trigger) = t.document().trigger {
                row.insert("trigger_rule".into(), json!(trigger.as_str()));
            }
            row.insert("conditional".into(), json!(t.holds()));
            row.insert("max_attempts".into(), json!(def.retry_policy(t).max_attempts));
            Value::Object(row)
        })
        .collect();
    serde_json::to_string(&rows).map_err(|e| store::Error::Other(format!("cannot encode task rows: {e}")))
}

/// Rebuilds and re-validates a definition from its rows.
fn assemble(w: WorkflowRow, rows: Vec<TaskRow>) -> Result<Published, LoadError> {
    let workflow = format!("'{}' version {} (id {})", w.name, w.version, w.id);
    let invalid = |problem: String| LoadError::Invalid {
        workflow: workflow.clone(),
        problem,
    };
    let written: Value =
        serde_json::from_str(&w.definition).map_err(|e| invalid(format!("the stored document does not parse: {e}")))?;
    let defaults: Option<Defaults> = match written.get("defaults") {
        None | Some(Value::Null) => None,
        Some(d) => Some(
            serde_json::from_value(d.clone())
                .map_err(|e| invalid(format!("the stored defaults are not valid: {e}")))?,
        ),
    };
    let version = u32::try_from(w.version).map_err(|_| invalid(format!("version {} is out of range", w.version)))?;
    let (concurrency, mut task_limits) = stored_limits(&written).map_err(invalid)?;
    let mut maps = stored_maps(&written).map_err(invalid)?;
    let mut tasks = Vec::with_capacity(rows.len());
    let mut max_attempts = Vec::with_capacity(rows.len());
    for row in rows {
        let depends_on: Vec<String> = serde_json::from_str(&row.depends_on)
            .map_err(|e| invalid(format!("task '{}': depends_on is not a list of keys: {e}", row.key)))?;
        let config: Option<Value> = row
            .config
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| invalid(format!("task '{}': config is not JSON: {e}", row.key)))?;
        let retry: Option<RetrySpec> = row
            .retry
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| invalid(format!("task '{}': retry is not a retry policy: {e}", row.key)))?;
        let priority = row
            .priority
            .map(Priority::new)
            .transpose()
            .map_err(|e| invalid(format!("task '{}': {e}", row.key)))?;
        let trigger: Option<Trigger> = row
            .trigger_rule
            .map(|r| serde_json::from_value(Value::String(r)))
            .transpose()
            .map_err(|e| invalid(format!("task '{}': the stored trigger is not valid: {e}", row.key)))?;
        max_attempts.push((row.key.clone(), row.max_attempts));
        tasks.push(TaskDocument {
            concurrency: task_limits.remove(&row.key),
            map: maps.remove(&row.key),
            key: row.key,
            task_type: row.task_type,
            depends_on,
            config,
            timeout_seconds: row.timeout_seconds,
            retry,
            compensate_for: row.compensate_for,
            priority,
            when: row.when_expr,
            trigger,
        });
    }
    let document = WorkflowDocument {
        name: w.name.clone(),
        version,
        description: (!w.description.is_empty()).then(|| w.description.clone()),
        defaults,
        concurrency,
        tasks,
    };
    let definition =
        WorkflowDefinition::from_stored(document, &max_attempts, &w.fingerprint).map_err(|e| invalid(e.to_string()))?;
    let created_at = time("workflow.created_at", w.created_at).map_err(store::Error::from)?;
    Ok(Published {
        id: WorkflowId(w.id),
        definition: Arc::new(definition),
        fingerprint: w.fingerprint,
        created_at,
        created: false,
    })
}

impl SqliteStore {
    async fn load(&self, id: WorkflowId) -> Result<Option<Published>, LoadError> {
        let rows = self
            .inner
            .read()
            .await?
            .call(padded(sql(queries::LOAD_DEFINITION).bind(id.0)))
            .await?;
        let Some(w) = tagged(&rows, 0).next() else {
            return Ok(None);
        };
        let w: WorkflowRow = decode(w)?;
        let tasks = tagged(&rows, 1)
            .map(decode::<TaskRow>)
            .collect::<Result<Vec<_>, store::Error>>()?;
        assemble(w, tasks).map(Some)
    }
}

impl DefinitionStore for SqliteStore {
    async fn publish_definition(&self, def: &WorkflowDefinition) -> Result<Published, PublishError> {
        let fingerprint = def.fingerprint();
        let document = serde_json::to_string(&def.document())
            .map_err(|e| store::Error::Other(format!("cannot encode the definition: {e}")))?;
        let tasks = task_rows(def)?;
        let offset = self.inner.offset();
        let called = self
            .inner
            .write()
            .await?
            .call_sqlx(padded(
                sql(queries::PUBLISH_DEFINITION)
                    .bind(offset)
                    .bind(def.name().to_owned())
                    .bind(i64::from(def.version()))
                    .bind(def.description().to_owned())
                    .bind(fingerprint.clone())
                    .bind(document)
                    .bind(tasks),
            ))
            .await;
        let rows = match called {
            Ok(rows) => rows,
            // Only reachable with another process writing the same file.
            Err(Failure::Sqlx(e)) if is_unique_violation(&e) => {
                return Err(PublishError::LostRace {
                    name: def.name().to_owned(),
                    version: def.version(),
                });
            }
            Err(e) => return Err(e.into_store().into()),
        };
        if let Some(row) = tagged(&rows, 0).next() {
            let id: i64 = col(row, 1)?;
            let stored: String = col(row, 2)?;
            if stored != fingerprint {
                return Err(PublishError::Conflict {
                    name: def.name().to_owned(),
                    version: def.version(),
                    existing: stored,
                    new: fingerprint,
                });
            }
            // Same content: answer with the stored row (its declaration
            // order and creation time), re-validated like any load.
            return match self.load(WorkflowId(id)).await {
                Ok(Some(published)) => Ok(published),
                Ok(None) => Err(store::Error::Corrupt(format!("workflow {id} vanished while publishing")).into()),
                Err(LoadError::Store(e)) => Err(e.into()),
                Err(e) => Err(store::Error::Corrupt(e.to_string()).into()),
            };
        }
        let Some(row) = tagged(&rows, 1).next() else {
            return Err(store::Error::Other("publishing inserted no workflow row".into()).into());
        };
        let id: i64 = col(row, 1)?;
        let created_at: i64 = col(row, 2)?;
        Ok(Published {
            id: WorkflowId(id),
            definition: Arc::new(def.clone()),
            fingerprint,
            created_at: time("workflow.created_at", created_at).map_err(store::Error::from)?,
            created: true,
        })
    }

    async fn load_definition(&self, id: WorkflowId) -> Result<Published, LoadError> {
        self.load(id)
            .await?
            .ok_or_else(|| LoadError::NotFound(format!("id {id}")))
    }

    async fn find_definition(&self, name: &str, version: u32) -> Result<Option<Published>, LoadError> {
        let rows = self
            .inner
            .read()
            .await?
            .call(
                sql(queries::FIND_WORKFLOW)
                    .bind(name.to_owned())
                    .bind(i64::from(version)),
            )
            .await?;
        match rows.first() {
            Some(row) => self.load(WorkflowId(col(row, 0)?)).await,
            None => Ok(None),
        }
    }

    async fn list_definitions(&self, name: Option<&str>) -> Result<Vec<DefinitionSummary>, store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(sql(queries::LIST_DEFINITIONS).bind(name.map(str::to_owned)))
            .await?;
        rows.iter()
            .map(|r| decode::<DefinitionRow>(r)?.into_summary())
            .collect()
    }
}
