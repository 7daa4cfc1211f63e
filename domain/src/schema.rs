//! Parsing a definition from bytes: limits, JSON, shape (JSON Schema draft
//! 2020-12 with JSONPath errors), then the graph. Shape wins: graph rules
//! are only checked on a payload whose shape is right.

use std::sync::LazyLock;

use jsonschema::{Draft, Validator, paths::LocationSegment};
use serde_json::Value;

use crate::definition::{DefinitionErrors, MAX_BODY_BYTES, MAX_NESTING, WorkflowDefinition, WorkflowDocument, depth};
use crate::{json_path, limits};

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
/// limit, returning every violation; then, on a value whose shape is right,
/// what the schema cannot say: integers written as integers and no NUL
/// character anywhere (docs/design/definitions.md#limits).
pub fn check_shape(value: &Value) -> Vec<ShapeError> {
    if depth(value) > MAX_NESTING {
        return vec![too_deep()];
    }
    let errors: Vec<ShapeError> = VALIDATOR
        .iter_errors(value)
        .map(|e| ShapeError {
            path: json_path(e.instance_path().iter()),
            message: describe(&e),
        })
        .collect();
    if !errors.is_empty() {
        return errors;
    }
    let mut errors = fractional_integers(value);
    errors.extend(limit_keys(value));
    errors.extend(conditions(value));
    errors.extend(maps(value));
    if let Some(path) = limits::find_nul(value) {
        errors.push(ShapeError {
            path,
            message: "holds a NUL character (U+0000), which cannot be stored".into(),
        });
    }
    errors
}

fn too_deep() -> ShapeError {
    ShapeError {
        path: "$".into(),
        message: format!("JSON nests deeper than {MAX_NESTING} levels"),
    }
}

/// The longest schema message that quotes the offending value; a longer
/// one names it instead, so a 10 001-task array is not printed back.
const QUOTED_MESSAGE_MAX: usize = 200;

/// What a schema violation says: an identifier's offending character by
/// name, otherwise the validator's message — without the offending value
/// when quoting it would make the message long.
fn describe(error: &jsonschema::ValidationError<'_>) -> String {
    if let (jsonschema::error::ValidationErrorKind::Pattern { pattern }, Value::String(text)) =
        (error.kind(), error.instance().as_ref())
        && pattern.contains(IDENTIFIER_CLASS_MARK)
    {
        return identifier_problem(text);
    }
    let quoted = error.to_string();
    if quoted.chars().count() <= QUOTED_MESSAGE_MAX {
        return quoted;
    }
    let masked = error.masked_with("the value").to_string();
    if masked.chars().count() <= QUOTED_MESSAGE_MAX {
        return masked;
    }
    let cut: String = masked.chars().take(QUOTED_MESSAGE_MAX).collect();
    format!("{cut}…")
}

/// Characters no name, key or task type may hold (beside whitespace-only
/// text): the C0 and C1 controls and the invisible formatting characters of
/// the Basic Multilingual Plane (zero-width, bidirectional controls, soft
/// hyphen, byte-order mark) and the line and paragraph separators, which
/// would make two different keys look the same or reorder a message. The
/// schema's `identifier` pattern excludes exactly these ranges.
pub const INVISIBLE: &[(char, char)] = &[
    ('\u{0000}', '\u{001f}'),
    ('\u{007f}', '\u{009f}'),
    ('\u{00ad}', '\u{00ad}'),
    ('\u{0600}', '\u{0605}'),
    ('\u{061c}', '\u{061c}'),
    ('\u{06dd}', '\u{06dd}'),
    ('\u{070f}', '\u{070f}'),
    ('\u{180e}', '\u{180e}'),
    ('\u{200b}', '\u{200f}'),
    ('\u{2028}', '\u{202e}'),
    ('\u{2060}', '\u{2064}'),
    ('\u{2066}', '\u{206f}'),
    ('\u{feff}', '\u{feff}'),
    ('\u{fff9}', '\u{fffb}'),
];

/// A piece of the identifier pattern that tells its violations apart.
const IDENTIFIER_CLASS_MARK: &str = "\\u200b-\\u200f";

fn is_invisible(c: char) -> bool {
    INVISIBLE.iter().any(|&(low, high)| (low..=high).contains(&c))
}

/// Why `text` is not a valid identifier (it broke the pattern).
fn identifier_problem(text: &str) -> String {
    match text.chars().enumerate().find(|(_, c)| is_invisible(*c)) {
        Some((at, c)) => format!(
            "holds U+{:04X} at character {}, an invisible control or formatting character; \
             names, keys and task types must be visible text (no control, zero-width or \
             bidirectional characters)",
            u32::from(c),
            at + 1
        ),
        None => "must not be blank".to_owned(),
    }
}

/// Integer settings written with a fraction or an exponent (`1.0`, `1e3`):
/// JSON Schema counts them as integers, but a version is written as one.
fn fractional_integers(value: &Value) -> Vec<ShapeError> {
    let mut found = Vec::new();
    let mut check = |path: String, v: Option<&Value>| {
        if v.is_some_and(|v| v.is_number() && !v.is_u64() && !v.is_i64()) {
            found.push(ShapeError {
                path,
                message: format!(
                    "must be written as an integer (1, not 1.0), found {}",
                    v.map_or_else(String::new, Value::to_string)
                ),
            });
        }
    };
    check("$.version".into(), value.get("version"));
    check(
        "$.defaults.retry.max_attempts".into(),
        value.pointer("/defaults/retry/max_attempts"),
    );
    if let Some(tasks) = value.get("tasks").and_then(Value::as_array) {
        for (i, task) in tasks.iter().enumerate() {
            check(
                format!("$.tasks[{i}].retry.max_attempts"),
                task.pointer("/retry/max_attempts"),
            );
        }
    }
    found
}

/// Concurrency keys that are not JSONPaths, each at its own path: the
/// schema can only say they are strings.
fn limit_keys(value: &Value) -> Vec<ShapeError> {
    let mut keys: Vec<(String, &Value)> = Vec::new();
    if let Some(limits) = value.get("concurrency").and_then(Value::as_array) {
        keys.extend(
            limits
                .iter()
                .enumerate()
                .filter_map(|(i, l)| Some((format!("$.concurrency[{i}].key"), l.get("key")?))),
        );
    }
    if let Some(tasks) = value.get("tasks").and_then(Value::as_array) {
        keys.extend(
            tasks
                .iter()
                .enumerate()
                .filter_map(|(i, t)| Some((format!("$.tasks[{i}].concurrency.key"), t.pointer("/concurrency/key")?))),
        );
    }
    keys.into_iter()
        .filter_map(|(path, key)| {
            let message = crate::concurrency::check_key(key.as_str()?).err()?;
            Some(ShapeError { path, message })
        })
        .collect()
}

/// The string at `pointer` in each task that `check` refuses, at its own
/// path (`$.tasks[i]` and `field`): checks the schema cannot make, as it
/// can only say the field is a string.
fn task_strings(
    value: &Value,
    pointer: &str,
    field: &str,
    check: impl Fn(&str) -> Result<(), String>,
) -> Vec<ShapeError> {
    let Some(tasks) = value.get("tasks").and_then(Value::as_array) else {
        return Vec::new();
    };
    tasks
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let message = check(t.pointer(pointer)?.as_str()?).err()?;
            Some(ShapeError {
                path: format!("$.tasks[{i}].{field}"),
                message,
            })
        })
        .collect()
}

/// `when` expressions that do not parse (docs/design/conditions.md#when).
fn conditions(value: &Value) -> Vec<ShapeError> {
    task_strings(value, "/when", "when", |when| {
        crate::condition::check(when).map_err(|message| format!("not a valid expression: {message}"))
    })
}

/// `map.over` paths the engine cannot read (docs/design/map.md#the-field).
fn maps(value: &Value) -> Vec<ShapeError> {
    task_strings(value, "/map/over", "map.over", |over| {
        crate::map::MapSource::parse(over).map(|_| ())
    })
}

/// Parses and validates a definition: size limit, JSON, shape, graph.
pub fn parse_definition(bytes: &[u8]) -> Result<WorkflowDefinition, ParseError> {
    if bytes.len() > MAX_BODY_BYTES {
        return Err(ParseError::TooLarge { size: bytes.len() });
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        // serde_json stops at 128 levels: valid JSON, but too deep for us.
        if e.to_string().starts_with("recursion limit exceeded") {
            ParseError::Shape(vec![too_deep()])
        } else {
            ParseError::Json(e.to_string())
        }
    })?;
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
            LocationSegment::Index(i) => json_path::push_index(&mut path, i),
            LocationSegment::Property(name) => json_path::push_property(&mut path, &name),
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
    fn a_priority_off_the_scale_is_named_by_its_path() {
        let task =
            |p: Value| json!({"name": "w", "version": 1, "tasks": [{"key": "a", "task_type": "noop", "priority": p}]});
        for bad in [json!(10), json!(-1), json!(2.5), json!("9")] {
            assert_eq!(
                paths(task(bad.clone())),
                [("shape", "$.tasks[0].priority".into())],
                "{bad}"
            );
        }
        let bytes = serde_json::to_vec(&task(json!(9))).unwrap();
        assert!(parse_definition(&bytes).is_ok());
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
    fn a_long_offending_value_is_named_not_printed_back() {
        let tasks: Vec<Value> = (0..10_001)
            .map(|i| json!({"key": format!("t{i}"), "task_type": "noop"}))
            .collect();
        let p = problems(json!({"name": "w", "version": 1, "tasks": tasks}));
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].3, "the value has more than 10000 items");
        // A short value is still quoted: it helps find the typo.
        let p = problems(json!({"name": "w", "version": 0, "tasks": [{"key": "a", "task_type": "noop"}]}));
        assert_eq!(p[0].3, "0 is less than the minimum of 1");
    }

    #[test]
    fn max_attempts_is_at_most_a_thousand_wherever_it_is_set() {
        let task = |n: u32| json!({"key": "a", "task_type": "noop", "retry": {"max_attempts": n}});
        let p = problems(
            json!({"name": "w", "version": 1, "defaults": {"retry": {"max_attempts": 1001}},
                                "tasks": [task(1001)]}),
        );
        let found: Vec<(&str, &str)> = p.iter().map(|p| (p.1.as_str(), p.3.as_str())).collect();
        assert_eq!(
            found,
            [
                (
                    "$.defaults.retry.max_attempts",
                    "1001 is greater than the maximum of 1000"
                ),
                (
                    "$.tasks[0].retry.max_attempts",
                    "1001 is greater than the maximum of 1000"
                )
            ]
        );
        let at_most = serde_json::to_vec(&json!({"name": "w", "version": 1, "tasks": [task(1000)]})).unwrap();
        assert!(parse_definition(&at_most).is_ok());
    }

    #[test]
    fn an_integer_written_with_a_fraction_is_refused_at_its_own_path() {
        let task = json!({"key": "a", "task_type": "noop", "retry": {"max_attempts": 2.0}});
        let p = problems(
            json!({"name": "w", "version": 1.0, "defaults": {"retry": {"max_attempts": 3e0}},
                                "tasks": [task]}),
        );
        let paths: Vec<&str> = p.iter().map(|p| p.1.as_str()).collect();
        assert_eq!(
            paths,
            [
                "$.version",
                "$.defaults.retry.max_attempts",
                "$.tasks[0].retry.max_attempts"
            ]
        );
        assert_eq!(p[0].3, "must be written as an integer (1, not 1.0), found 1.0");
    }

    #[test]
    fn json_deeper_than_the_parser_allows_is_too_deep_not_invalid() {
        let text = format!(
            "{{\"name\": \"w\", \"version\": 1, \"tasks\": [{{\"key\": \"a\", \"task_type\": \"noop\", \"config\": {{\"x\": {}1{}}}}}]}}",
            "[".repeat(200),
            "]".repeat(200)
        );
        let err = parse_definition(text.as_bytes()).unwrap_err();
        let p = err.problems();
        assert_eq!((p[0].kind, p[0].path.as_str()), (ProblemKind::Shape, "$"));
        assert_eq!(p[0].message, "JSON nests deeper than 64 levels");
        assert!(!err.to_string().contains("invalid"), "{err}");
    }

    #[test]
    fn invisible_and_control_characters_in_identifiers_are_named() {
        for (key, code) in [
            ("a\u{200b}b", "U+200B at character 2"),
            ("\u{202e}abc", "U+202E at character 1"),
            ("x\u{85}", "U+0085 at character 2"),
            ("a\u{0}", "U+0000 at character 2"),
            ("a\u{7}", "U+0007 at character 2"),
            ("\u{feff}k", "U+FEFF at character 1"),
        ] {
            let p = problems(json!({"name": "w", "version": 1, "tasks": [{"key": key, "task_type": "noop"}]}));
            assert_eq!(p.len(), 1, "{key:?}: {p:?}");
            assert_eq!(p[0].1, "$.tasks[0].key");
            assert!(
                p[0].3.starts_with(&format!("holds {code}, an invisible")),
                "{key:?}: {}",
                p[0].3
            );
        }
        let p = problems(json!({"name": "   ", "version": 1, "tasks": [{"key": "a", "task_type": "noop"}]}));
        assert_eq!((p[0].1.as_str(), p[0].3.as_str()), ("$.name", "must not be blank"));
        // Visible text of any script, with inner spaces, is fine.
        assert!(
            parse_definition(
                &serde_json::to_vec(&json!({"name": "données ETL", "version": 1,
                "tasks": [{"key": "ключ 1", "task_type": "noop"}]}))
                .unwrap()
            )
            .is_ok()
        );
    }

    #[test]
    fn the_identifier_pattern_excludes_exactly_the_invisible_ranges() {
        let class: String = INVISIBLE
            .iter()
            .map(|&(low, high)| {
                if low == high {
                    format!("\\u{:04x}", u32::from(low))
                } else {
                    format!("\\u{:04x}-\\u{:04x}", u32::from(low), u32::from(high))
                }
            })
            .collect();
        let schema: Value = serde_json::from_str(DEFINITION_SCHEMA).unwrap();
        let pattern = schema["$defs"]["identifier"]["pattern"].as_str().unwrap();
        assert_eq!(pattern, format!("^[^{class}]*[^{class}\\s][^{class}]*$"));
        assert!(pattern.contains(IDENTIFIER_CLASS_MARK));
    }

    #[test]
    fn a_nul_anywhere_in_a_definition_is_a_shape_error_at_its_path() {
        let p = problems(json!({"name": "w", "version": 1, "description": "a\u{0}",
            "tasks": [{"key": "a", "task_type": "noop", "config": {"argv": ["x\u{0}"]}}]}));
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].0, p[0].1.as_str()), ("shape", "$.description"));
        assert_eq!(p[0].3, "holds a NUL character (U+0000), which cannot be stored");
        let p = paths(json!({"name": "w", "version": 1,
            "tasks": [{"key": "a", "task_type": "noop", "config": {"argv": ["x\u{0}"]}}]}));
        assert_eq!(p, [("shape", "$.tasks[0].config.argv[0]".into())]);
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
