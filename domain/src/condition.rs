//! Task conditions (docs/design/conditions.md): the `when` expression, in
//! the Common Expression Language, and the trigger rule that says which
//! dependency outcomes let a task run. Evaluating an expression reads only
//! the values handed to it; CEL has no I/O and runs no code.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::definition::WorkflowDefinition;
use crate::state::TaskRunState;

/// Which outcomes of its dependencies let a task run
/// (docs/design/conditions.md#triggers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// Every dependency succeeded; a skipped one skips the task
    /// (`upstream_skipped`), a failed one cancels it (`upstream_failed`).
    #[default]
    AllSucceeded,
    /// No dependency failed and at least one succeeded: a join after a
    /// branch. Only skipped dependencies skip it (`upstream_skipped`).
    NoneFailed,
    /// Runs whatever its dependencies did; its inputs carry each one's
    /// state.
    AllDone,
}

impl Trigger {
    /// Whether a dependency that ended in `state` lets a task with this
    /// trigger run (the dependency has finished).
    pub fn accepts(self, state: TaskRunState) -> bool {
        match self {
            Self::AllSucceeded => state == TaskRunState::Succeeded,
            Self::NoneFailed => matches!(state, TaskRunState::Succeeded | TaskRunState::Skipped),
            Self::AllDone => !state.is_active(),
        }
    }

    /// The name as written in a definition.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AllSucceeded => "all_succeeded",
            Self::NoneFailed => "none_failed",
            Self::AllDone => "all_done",
        }
    }
}

/// Checks that `source` is a CEL expression, returning the parser's
/// message (with the place in the expression) when it is not.
pub fn check(source: &str) -> Result<(), String> {
    // The parser can panic on input it does not expect; a definition is
    // user input, so a panic is a refusal, never a crash.
    match std::panic::catch_unwind(|| cel::Program::compile(source).map(drop)) {
        Ok(Ok(())) => Ok(()),
        // The parser names its input `<input>`; say where in the expression.
        Ok(Err(e)) => Err(e.to_string().replacen("ERROR: <input>:", "at ", 1)),
        Err(_) => Err("the expression could not be parsed".to_owned()),
    }
}

/// Evaluates `source` over `{inputs, run_input}`: true or false, or why it
/// could not be evaluated (a missing key, a type error, a value that is
/// not a boolean).
pub fn evaluate(source: &str, inputs: &Map<String, Value>, run_input: &Value) -> Result<bool, String> {
    let run = || -> Result<bool, String> {
        let program = cel::Program::compile(source).map_err(|e| e.to_string())?;
        let mut context = cel::Context::default();
        context
            .add_variable("inputs", Value::Object(inputs.clone()))
            .map_err(|e| e.to_string())?;
        context
            .add_variable("run_input", run_input)
            .map_err(|e| e.to_string())?;
        match program.execute(&context).map_err(|e| e.to_string())? {
            cel::Value::Bool(b) => Ok(b),
            other => Err(format!("`when` must evaluate to true or false, not {}", kind(&other))),
        }
    };
    std::panic::catch_unwind(run).unwrap_or_else(|_| Err("the expression could not be evaluated".to_owned()))
}

fn kind(value: &cel::Value) -> &'static str {
    match value {
        cel::Value::Null => "null",
        cel::Value::Int(_) | cel::Value::UInt(_) | cel::Value::Float(_) => "a number",
        cel::Value::String(_) => "a string",
        cel::Value::List(_) => "a list",
        cel::Value::Map(_) => "a map",
        _ => "a value of another type",
    }
}

/// A definition that is valid but likely not what its author meant: a
/// join below a `when` that still needs every dependency to succeed, so a
/// branch not taken skips it too (docs/design/conditions.md#triggers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// Declaration index of the task, for `$.tasks[i]`.
    pub index: usize,
    /// The task.
    pub task: String,
    /// What looks wrong, and what to write instead.
    pub message: String,
}

/// The joins (tasks with two or more dependencies) that keep the default
/// trigger although a task above them has a `when`.
pub fn warnings(def: &WorkflowDefinition) -> Vec<Warning> {
    let graph = def.graph();
    def.tasks()
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.is_compensator() && t.depends_on().len() >= 2 && t.trigger() == Trigger::AllSucceeded)
        .filter_map(|(index, t)| {
            let branch = graph
                .transitive_dependencies_of(t.key())
                .into_iter()
                .find(|k| def.task(k).is_some_and(|d| d.when().is_some()))?;
            Some(Warning {
                index,
                task: t.key().to_owned(),
                message: format!(
                    "joins below '{branch}', which has a `when`: with the default trigger all_succeeded it is \
                     skipped whenever that branch is; give it \"trigger\": \"none_failed\" to run after \
                     whichever branch ran"
                ),
            })
        })
        .collect()
}

/// What a dependency looks like to a task with the `all_done` trigger:
/// its state beside its output (null unless it succeeded).
pub fn dependency_view(state: TaskRunState, output: Option<Value>) -> Value {
    let mut view = Map::new();
    view.insert("state".to_owned(), Value::String(state.as_str().to_owned()));
    view.insert("output".to_owned(), output.unwrap_or(Value::Null));
    Value::Object(view)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn inputs(v: Value) -> Map<String, Value> {
        v.as_object().cloned().expect("an object")
    }

    #[test]
    fn an_expression_reads_inputs_and_the_run_input() {
        let i = inputs(json!({"check": {"ok": true, "items": [1, 2]}}));
        let run = json!({"env": "prod", "n": 3});
        assert_eq!(evaluate("inputs.check.ok", &i, &run), Ok(true));
        assert_eq!(evaluate("size(inputs.check.items) > 2", &i, &run), Ok(false));
        assert_eq!(
            evaluate("run_input.env == 'prod' && run_input.n >= 3", &i, &run),
            Ok(true)
        );
    }

    #[test]
    fn a_missing_key_or_a_non_boolean_is_an_error_that_says_why() {
        let i = inputs(json!({"a": 1}));
        let missing = evaluate("inputs.b.ok", &i, &Value::Null).unwrap_err();
        assert!(missing.contains('b'), "{missing}");
        let number = evaluate("inputs.a", &i, &Value::Null).unwrap_err();
        assert!(number.contains("true or false"), "{number}");
    }

    #[test]
    fn a_syntax_error_names_its_place() {
        let e = check("inputs.a ==").unwrap_err();
        assert!(e.starts_with("at 1:"), "{e}");
        assert!(check("inputs.a == 1 || run_input.x").is_ok());
    }

    #[test]
    fn triggers_round_trip_through_their_names() {
        for t in [Trigger::AllSucceeded, Trigger::NoneFailed, Trigger::AllDone] {
            let text = serde_json::to_value(t).unwrap();
            assert_eq!(text, json!(t.as_str()));
            assert_eq!(serde_json::from_value::<Trigger>(text).unwrap(), t);
        }
    }

    #[test]
    fn a_join_below_a_when_with_the_default_trigger_is_warned_about() {
        let def = |trigger: &str| {
            crate::schema::parse_value(json!({"name": "w", "version": 1, "tasks": [
                {"key": "a", "task_type": "noop"},
                {"key": "b", "task_type": "noop", "depends_on": ["a"], "when": "run_input.b"},
                {"key": "c", "task_type": "noop", "depends_on": ["b"]},
                {"key": "j", "task_type": "noop", "depends_on": ["a", "c"], "trigger": trigger}
            ]}))
            .expect("valid")
        };
        let found = warnings(&def("all_succeeded"));
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].index, found[0].task.as_str()), (3, "j"));
        assert!(found[0].message.contains("'b'"), "{}", found[0].message);
        assert!(warnings(&def("none_failed")).is_empty());
    }

    proptest! {
        /// Whatever the text, checking and evaluating answer; neither panics.
        #[test]
        fn any_text_is_answered_never_a_crash(source in ".{0,40}") {
            let _ = check(&source);
            let _ = evaluate(&source, &Map::new(), &json!({"a": [1, "x", null]}));
        }
    }
}
