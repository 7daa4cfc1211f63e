//! What a run's data may be (docs/design/data-flow.md#limits): the size
//! limits a run input, a task output and a task's assembled inputs are held
//! to, and the one character no store keeps — U+0000, which PostgreSQL
//! refuses in `jsonb` and `text` alike. Checked before anything is written,
//! the same way in both stores, so a value is refused with an error that
//! names it instead of failing as an infrastructure error.

use std::borrow::Cow;

use serde_json::Value;

use crate::json_path;

/// The default of [`Limits::run_input_bytes`].
pub const DEFAULT_RUN_INPUT_BYTES: usize = 1024 * 1024;
/// The default of [`Limits::task_output_bytes`].
pub const DEFAULT_TASK_OUTPUT_BYTES: usize = 1024 * 1024;
/// The default of [`Limits::task_inputs_bytes`].
pub const DEFAULT_TASK_INPUTS_BYTES: usize = 16 * 1024 * 1024;
/// The most `stale_write_rejected` audit events kept for one task run: a
/// stale write is still refused past it, only no longer recorded, so a
/// worker that keeps presenting an old token cannot grow the history
/// without bound (docs/design/data-flow.md#limits).
pub const MAX_STALE_AUDITS_PER_TASK_RUN: i64 = 100;

/// The largest progress report an attempt may store (its compact JSON
/// text): progress is a small status shown with the task, not an output.
pub const MAX_PROGRESS_BYTES: usize = 64 * 1024;

/// The size limits a run's data is held to; each is a setting of its own
/// (`max_run_input_bytes`, `max_task_output_bytes`,
/// `max_task_inputs_bytes`). Sizes are of the value's compact JSON text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest run input.
    pub run_input_bytes: usize,
    /// The largest output one task may store.
    pub task_output_bytes: usize,
    /// The largest sum of the dependencies' outputs one task may be given
    /// (for a compensator: the output of the task it undoes).
    pub task_inputs_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            run_input_bytes: DEFAULT_RUN_INPUT_BYTES,
            task_output_bytes: DEFAULT_TASK_OUTPUT_BYTES,
            task_inputs_bytes: DEFAULT_TASK_INPUTS_BYTES,
        }
    }
}

/// Which value a [`Refusal`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// A run's input.
    RunInput,
    /// A task's output.
    TaskOutput,
    /// The outputs assembled as one task's inputs.
    TaskInputs,
    /// What a running attempt reports of its progress.
    TaskProgress,
}

impl ValueKind {
    /// How messages name the value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RunInput => "the run input",
            Self::TaskOutput => "the task's output",
            Self::TaskInputs => "the task's inputs (its dependencies' outputs)",
            Self::TaskProgress => "the task's progress",
        }
    }

    /// The verb that agrees with [`Self::as_str`].
    fn is(self) -> &'static str {
        match self {
            Self::RunInput | Self::TaskOutput | Self::TaskProgress => "is",
            Self::TaskInputs => "are",
        }
    }

    /// The setting that bounds this value's size.
    pub fn setting(self) -> &'static str {
        match self {
            Self::RunInput => "max_run_input_bytes",
            Self::TaskOutput => "max_task_output_bytes",
            Self::TaskInputs => "max_task_inputs_bytes",
            Self::TaskProgress => "fixed",
        }
    }
}

/// Why a value cannot be stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A string or a key holds U+0000.
    #[error("{} holds a NUL character (U+0000) at {path}, which cannot be stored", .kind.as_str())]
    Nul {
        /// Which value.
        kind: ValueKind,
        /// JSONPath of the string or key (`$.a`, `$['a b'][0]`).
        path: String,
    },
    /// The value is larger than its limit.
    #[error("{} {} {bytes} bytes of JSON; the limit ({}) is {limit} bytes", .kind.as_str(), .kind.is(), .kind.setting())]
    TooLarge {
        /// Which value.
        kind: ValueKind,
        /// Its size, or as much of it as was counted before the limit was passed.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
}

impl Refusal {
    /// Which value was refused.
    pub fn kind(&self) -> ValueKind {
        match self {
            Self::Nul { kind, .. } | Self::TooLarge { kind, .. } => *kind,
        }
    }
}

/// Checks that `value` can be stored as `kind` within `limit` bytes,
/// returning its size.
pub fn check_value(kind: ValueKind, value: &Value, limit: usize) -> Result<usize, Refusal> {
    refuse_nul(kind, value)?;
    let bytes = json_len(value);
    if bytes > limit {
        return Err(Refusal::TooLarge { kind, bytes, limit });
    }
    Ok(bytes)
}

/// Refuses `value` as `kind` when a string or key in it holds U+0000
/// (sizes aside: a store checks only this, sizes being the caller's policy).
pub fn refuse_nul(kind: ValueKind, value: &Value) -> Result<(), Refusal> {
    match find_nul(value) {
        Some(path) => Err(Refusal::Nul { kind, path }),
        None => Ok(()),
    }
}

/// The JSONPath of the first string or object key (in document order)
/// holding U+0000, if any.
pub fn find_nul(value: &Value) -> Option<String> {
    // The common answer, "none", is found without building any path.
    if !holds_nul(value) {
        return None;
    }
    // Depth-first with explicit stacks: a value nested deeper than the
    // call stack allows is still walked, and the trail of segments to the
    // current node is kept once rather than as a path per node.
    let mut stack: Vec<(&Value, usize, Option<Segment<'_>>)> = vec![(value, 0, None)];
    let mut trail: Vec<Segment<'_>> = Vec::new();
    while let Some((v, depth, segment)) = stack.pop() {
        trail.truncate(depth.saturating_sub(1));
        if let Some(segment) = segment {
            if matches!(segment, Segment::Key(key) if key.contains('\0')) {
                trail.push(segment);
                return Some(render(&trail));
            }
            trail.push(segment);
        }
        match v {
            Value::String(s) if s.contains('\0') => return Some(render(&trail)),
            Value::Array(items) => stack.extend(
                items
                    .iter()
                    .enumerate()
                    .rev()
                    .map(|(i, item)| (item, depth + 1, Some(Segment::Index(i)))),
            ),
            Value::Object(map) => {
                let children: Vec<_> = map
                    .iter()
                    .map(|(key, item)| (item, depth + 1, Some(Segment::Key(key))))
                    .collect();
                stack.extend(children.into_iter().rev());
            }
            _ => {}
        }
    }
    None
}

/// Whether any string or key in `value` holds U+0000.
fn holds_nul(value: &Value) -> bool {
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) if s.contains('\0') => return true,
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => {
                for (key, item) in map {
                    if key.contains('\0') {
                        return true;
                    }
                    stack.push(item);
                }
            }
            _ => {}
        }
    }
    false
}

/// One step of a JSONPath.
#[derive(Debug, Clone, Copy)]
enum Segment<'a> {
    Index(usize),
    Key(&'a str),
}

fn render(trail: &[Segment<'_>]) -> String {
    let mut path = String::from("$");
    for segment in trail {
        match segment {
            Segment::Index(i) => json_path::push_index(&mut path, *i),
            Segment::Key(key) => json_path::push_property(&mut path, key),
        }
    }
    path
}

/// `text` as a store can keep it: each U+0000 replaced by U+FFFD (the
/// replacement character), everything else unchanged. For free text —
/// an error message, a command's stderr — where refusing would lose the
/// whole message for one byte.
pub fn storable_text(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(text)
    }
}

/// The length of `value`'s compact JSON text, counted without building it.
pub fn json_len(value: &Value) -> usize {
    let mut counter = Counter(0);
    // Writing into a counter cannot fail, and a `Value` always serialises.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

/// Counts the bytes written into it.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn a_nul_is_found_in_strings_and_keys_with_its_path() {
        assert_eq!(find_nul(&json!({"a": "x\u{0}y"})), Some("$.a".into()));
        assert_eq!(
            find_nul(&json!({"a": [1, {"b c": "\u{0}"}]})),
            Some("$.a[1]['b c']".into())
        );
        assert_eq!(find_nul(&json!({"k\u{0}": 1})), Some("$['k\\u0000']".into()));
        assert_eq!(find_nul(&json!("\u{0}")), Some("$".into()));
        assert_eq!(find_nul(&json!({"a": "fine", "b": [null, 1.5, true]})), None);
    }

    #[test]
    fn the_first_nul_in_document_order_is_named() {
        assert_eq!(find_nul(&json!(["ok", "\u{0}", "\u{0}"])), Some("$[1]".into()));
    }

    #[test]
    fn a_value_deeper_than_the_call_stack_is_still_walked() {
        let mut deep = json!("\u{0}");
        for _ in 0..5_000 {
            deep = Value::Array(vec![deep]);
        }
        let path = find_nul(&deep).unwrap();
        assert!(path.starts_with("$[0][0]"));
        // Dropping a value this deep recursively would overflow the stack.
        let mut v = deep;
        while let Value::Array(mut items) = v {
            v = items.pop().unwrap_or(Value::Null);
        }
    }

    #[test]
    fn sizes_are_of_compact_json_and_name_the_setting() {
        let v = json!({"a": "xyz"});
        assert_eq!(json_len(&v), serde_json::to_vec(&v).unwrap().len());
        assert_eq!(check_value(ValueKind::RunInput, &v, 11), Ok(11));
        let err = check_value(ValueKind::RunInput, &v, 10).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the run input is 11 bytes of JSON; the limit (max_run_input_bytes) is 10 bytes"
        );
        let inputs = check_value(ValueKind::TaskInputs, &v, 10).unwrap_err();
        assert_eq!(
            inputs.to_string(),
            "the task's inputs (its dependencies' outputs) are 11 bytes of JSON; the limit (max_task_inputs_bytes) is 10 bytes"
        );
        let nul = check_value(ValueKind::TaskOutput, &json!({"a": "\u{0}"}), 100).unwrap_err();
        assert_eq!(
            nul.to_string(),
            "the task's output holds a NUL character (U+0000) at $.a, which cannot be stored"
        );
    }

    #[test]
    fn storable_text_replaces_only_nul() {
        assert_eq!(storable_text("a\u{0}b\u{0}"), "a\u{FFFD}b\u{FFFD}");
        assert!(matches!(storable_text("plain é"), Cow::Borrowed("plain é")));
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[a\u{0}é\"\\\\]{0,4}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a\u{0} ]{0,3}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn a_nul_is_found_iff_the_json_text_escapes_one(v in json_value()) {
            let text = serde_json::to_string(&v).unwrap();
            prop_assert_eq!(find_nul(&v).is_some(), text.contains("\\u0000"));
            prop_assert_eq!(json_len(&v), text.len());
        }
    }
}
