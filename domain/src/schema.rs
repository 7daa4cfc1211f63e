//! Parsing a definition from bytes: limits, JSON, shape (JSON Schema draft
//! 2020-12 with JSONPath errors), then the graph. Shape wins: graph rules
//! are only checked on a payload whose shape is right.

use std::sync::LazyLock;

use jsonschema::{Draft, Validator, paths::LocationSegment};
use serde_json::Value;

use crate::definition::{DefinitionErrors, MAX_BODY_BYTES, MAX_NESTING, WorkflowDefinition, WorkflowDocument, depth};

/// The embedded JSON Schema every definition must satisfy.
pub const DEFINITION_SCHEMA: &str = include_str!("../schema/workflow-definition.schema.json");

static VALIDATOR: LazyLock<Validator> = LazyLock::new(|| {
    let schema: Value = serde_json::from_str(DEFINITION_SCHEMA).expect("the embedded schema is JSON (unit-tested)");
    jsonschema::options()
        .with_draft(Draft::Draft202012)
        .build(&schema)
        .expect("the embedded schema compiles (unit-tested)")
});

/// One shape problem, located by JSONPath.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError {
    /// Where: `$`, `$.tasks[0].key`, … (a missing property: its parent).
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

/// Why bytes are not a valid definition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The body exceeds [`MAX_BODY_BYTES`].
    #[error("definition is {size} bytes; the limit is {MAX_BODY_BYTES}")]
    TooLarge {
        /// Size of the body, in bytes.
        size: usize,
    },
    /// The body is not JSON.
    #[error("invalid JSON: {0}")]
    Json(String),
    /// The JSON does not have the shape of a definition.
    #[error("{} shape error(s), first at {}: {}", .0.len(), .0[0].path, .0[0].message)]
    Shape(Vec<ShapeError>),
    /// The shape is right but a graph or value rule is broken.
    #[error(transparent)]
    Definition(#[from] DefinitionErrors),
}

/// Which stage found a problem; reports show it as `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// Not JSON, or too large.
    Json,
    /// JSON Schema violation.
    Shape,
    /// Graph or value rule.
    Graph,
}

impl ProblemKind {
    /// The lower-case name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Shape => "shape",
            Self::Graph => "graph",
        }
    }
}

/// One problem, flattened for a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Which stage found it.
    pub kind: ProblemKind,
    /// JSONPath of the offending element.
    pub path: String,
    /// The task named, if any.
    pub task: Option<String>,
    /// Human-readable explanation.
    pub message: String,
}

impl ParseError {
    /// Every problem, in the order found.
    pub fn problems(&self) -> Vec<Problem> {
        match self {
            // The size limit is part of the shape
            // (docs/design/definitions.md#limits).
            Self::TooLarge { .. } => vec![Problem {
                kind: ProblemKind::Shape,
                path: "$".into(),
                task: None,
                message: self.to_string(),
            }],
            Self::Json(_) => vec![Problem {
                kind: ProblemKind::Json,
                path: "$".into(),
                task: None,
                message: self.to_string(),
            }],
            Self::Shape(errors) => errors
                .iter()
                .map(|e| Problem {
                    kind: ProblemKind::Shape,
                    path: e.path.clone(),
                    task: None,
                    message: e.message.clone(),
                })
                .collect(),
            Self::Definition(errors) => errors
                .0
                .iter()
                .map(|e| Problem {
                    kind: ProblemKind::Graph,
                    path: e.path(),
                    task: e.error.task().map(str::to_owned),
                    message: e.error.to_string(),
                })
                .collect(),
        }
    }
}

/// Checks a JSON value against the definition schema and the nesting
/// limit, returning every violation.
pub fn check_shape(value: &Value) -> Vec<ShapeError> {
    if depth(value) > MAX_NESTING {
        return vec![ShapeError {
            path: "$".into(),
            message: format!("JSON nests deeper than {MAX_NESTING} levels"),
        }];
    }
    VALIDATOR
        .iter_errors(value)
        .map(|e| ShapeError {
            path: json_path(e.instance_path().iter()),
            message: e.to_string(),
        })
        .collect()
}

/// Parses and validates a definition: size limit, JSON, shape, graph.
pub fn parse_definition(bytes: &[u8]) -> Result<WorkflowDefinition, ParseError> {
    if bytes.len() > MAX_BODY_BYTES {
        return Err(ParseError::TooLarge { size: bytes.len() });
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|e| ParseError::Json(e.to_string()))?;
    parse_value(value)
}

/// Validates an already-parsed JSON value: shape, then graph.
pub fn parse_value(value: Value) -> Result<WorkflowDefinition, ParseError> {
    let shape = check_shape(&value);
    if !shape.is_empty() {
        return Err(ParseError::Shape(shape));
    }
    let doc: WorkflowDocument = serde_json::from_value(value).map_err(|e| {
        // The schema and the serde types describe the same shape; a gap
        // between them is reported, not unwrapped.
        ParseError::Shape(vec![ShapeError {
            path: "$".into(),
            message: e.to_string(),
        }])
    })?;
    Ok(WorkflowDefinition::from_document(doc)?)
}

/// Renders location segments as a JSONPath: `$.tasks[0].key`, with
/// bracket notation for names that are not plain identifiers.
fn json_path<'a>(segments: impl Iterator<Item = LocationSegment<'a>>) -> String {
    let mut path = String::from("$");
    for segment in segments {
        match segment {
            LocationSegment::Index(i) => path.push_str(&format!("[{i}]")),
            LocationSegment::Property(name) => {
                let plain = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if plain {
                    path.push('.');
                    path.push_str(&name);
                } else {
                    path.push_str("['");
                    path.push_str(&name.replace('\\', "\\\\").replace('\'', "\\'"));
                    path.push_str("']");
                }
            }
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn problems(v: Value) -> Vec<(&'static str, String, Option<String>, String)> {
        let bytes = serde_json::to_vec(&v).unwrap();
        parse_definition(&bytes)
            .unwrap_err()
            .problems()
            .into_iter()
            .map(|p| (p.kind.as_str(), p.path, p.task, p.message))
            .collect()
    }

    fn paths(v: Value) -> Vec<(&'static str, String)> {
        problems(v).into_iter().map(|(k, p, _, _)| (k, p)).collect()
    }

    #[test]
    fn the_embedded_schema_compiles() {
        assert!(VALIDATOR.is_valid(&json!({"name": "a", "version": 1, "tasks": [{"key": "a", "task_type": "noop"}]})));
    }

    // Spec 001's boundary table, row by row.

    #[test]
    fn empty_tasks_is_a_shape_error_at_tasks() {
        assert_eq!(
            paths(json!({"name": "w", "version": 1, "tasks": []})),
            [("shape", "$.tasks".into())]
        );
    }

    #[test]
    fn a_missing_name_is_reported_at_the_root_not_at_name() {
        let p = problems(json!({"version": 1, "tasks": [{"key": "a", "task_type": "noop"}]}));
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].0, p[0].1.as_str()), ("shape", "$"));
        assert!(p[0].3.contains("\"name\""), "{}", p[0].3);
    }

    #[test]
    fn duplicate_task_keys_are_a_graph_error_the_schema_cannot_see() {
        let p = problems(json!({"name": "w", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop"}, {"key": "a", "task_type": "noop"}]}));
        assert_eq!(
            p,
            [(
                "graph",
                "$.tasks[1]".into(),
                Some("a".into()),
                "duplicate task key 'a'".into()
            )]
        );
    }

    #[test]
    fn an_unknown_dependency_names_the_missing_task() {
        let p = problems(json!({"name": "w", "version": 1, "tasks": [
            {"key": "load", "task_type": "noop", "depends_on": ["ghost"]}]}));
        assert_eq!(
            p,
            [(
                "graph",
                "$.tasks[0]".into(),
                Some("load".into()),
                "task 'load' depends on unknown task 'ghost'".into()
            )]
        );
    }

    #[test]
    fn a_cycle_is_reported_as_its_path() {
        let p = problems(json!({"name": "w", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop", "depends_on": ["b"]},
            {"key": "b", "task_type": "noop", "depends_on": ["a"]}]}));
        assert_eq!(
            p,
            [(
                "graph",
                "$.tasks[0]".into(),
                Some("a".into()),
                "dependency cycle detected: a -> b -> a".into()
            )]
        );
    }

    #[test]
    fn a_payload_both_malformed_and_cyclic_gets_the_shape_error() {
        let p = paths(json!({"name": "w", "version": 1, "extra": true, "tasks": [
            {"key": "a", "task_type": "noop", "depends_on": ["b"]},
            {"key": "b", "task_type": "noop", "depends_on": ["a"]}]}));
        assert_eq!(p, [("shape", "$".into())]);
    }

    #[test]
    fn every_shape_error_is_reported_with_its_path() {
        let p = paths(json!({"name": " ", "version": 0, "tasks": [
            {"key": "", "task_type": "noop", "timeout": 3},
            {"task_type": 7, "retry": {"max_attempts": 0}}]}));
        let expected: Vec<(&str, String)> = vec![
            ("shape", "$.name".into()),
            ("shape", "$.tasks[0]".into()),
            // Both `minLength` and `pattern` reject the empty key.
            ("shape", "$.tasks[0].key".into()),
            ("shape", "$.tasks[0].key".into()),
            ("shape", "$.tasks[1]".into()),
            ("shape", "$.tasks[1].retry.max_attempts".into()),
            ("shape", "$.tasks[1].task_type".into()),
            ("shape", "$.version".into()),
        ];
        let mut sorted = p.clone();
        sorted.sort();
        assert_eq!(sorted, expected);
    }

    #[test]
    fn odd_property_names_use_bracket_notation() {
        let p = paths(json!({"name": "w", "version": 1, "tasks": [{"key": "a", "task_type": "noop", "my key": 1}]}));
        assert_eq!(p, [("shape", "$.tasks[0]".into())]);
        assert_eq!(
            json_path([LocationSegment::Property("my key".into()), LocationSegment::Index(2)].into_iter()),
            "$['my key'][2]"
        );
    }

    #[test]
    fn limits_are_shape_errors() {
        let tasks: Vec<Value> = (0..10_001)
            .map(|i| json!({"key": format!("t{i}"), "task_type": "noop"}))
            .collect();
        assert_eq!(
            paths(json!({"name": "w", "version": 1, "tasks": tasks})),
            [("shape", "$.tasks".into())]
        );

        let mut deep = json!(1);
        for _ in 0..70 {
            deep = json!([deep]);
        }
        let p = problems(
            json!({"name": "w", "version": 1, "tasks": [{"key": "a", "task_type": "noop", "config": {"x": deep}}]}),
        );
        assert_eq!((p[0].0, p[0].1.as_str()), ("shape", "$"));
        assert!(p[0].3.contains("deeper than 64"));

        let big = vec![b' '; MAX_BODY_BYTES + 1];
        let err = parse_definition(&big).unwrap_err();
        assert!(matches!(err, ParseError::TooLarge { .. }));
        assert_eq!(err.problems()[0].kind, ProblemKind::Shape);
    }

    #[test]
    fn invalid_json_is_reported_as_such() {
        let err = parse_definition(b"{\"name\": ").unwrap_err();
        assert_eq!(err.problems()[0].kind, ProblemKind::Json);
        assert!(err.to_string().contains("line 1"), "{err}");
    }

    #[test]
    fn a_9000_task_chain_parses() {
        let tasks: Vec<Value> = (0..9_000)
            .map(|i| {
                let deps = if i == 0 { vec![] } else { vec![format!("t{}", i - 1)] };
                json!({"key": format!("t{i}"), "task_type": "noop", "depends_on": deps})
            })
            .collect();
        let bytes = serde_json::to_vec(&json!({"name": "chain", "version": 1, "tasks": tasks})).unwrap();
        let def = parse_definition(&bytes).unwrap();
        assert_eq!(def.graph().levels().len(), 9_000);
    }
}
