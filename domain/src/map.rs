//! Mapped tasks (docs/design/map.md): a task that runs once per item of an
//! array another task produced. This module reads the `map` field, names
//! the children (`task[0]`, `task[1]`, …), expands a source output into a
//! count of children or the reason it cannot, picks a child's item, and
//! judges the children's progress. The scheduler's pass applies what it
//! answers.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use serde_json_path::JsonPath;

use crate::state::SkipReason;

/// `max_items` when a definition does not give it.
pub const DEFAULT_MAX_ITEMS: u32 = 1024;
/// The largest `max_items` (and `concurrency`) a definition may ask for.
pub const MAX_ITEMS: u32 = 10_000;

/// A task's `map` field as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MapSpec {
    /// `$.tasks.<key>.output<path>`: the array to map over, in the output
    /// of the dependency `<key>`.
    pub over: String,
    /// The most items it runs; a longer array fails the task
    /// (`map_too_large`). [`DEFAULT_MAX_ITEMS`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_items: Option<u32>,
    /// The most children ready or running at once; all of them when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
}

impl MapSpec {
    /// The effective item limit.
    pub fn max_items(&self) -> u32 {
        self.max_items.unwrap_or(DEFAULT_MAX_ITEMS)
    }

    /// The task whose output `over` reads, and the parsed path; or why
    /// `over` cannot be used.
    pub fn source(&self) -> Result<MapSource, String> {
        MapSource::parse(&self.over)
    }

    /// Why the spec cannot work, on its own: a bad `over`, a limit off
    /// 1..=[`MAX_ITEMS`].
    pub fn check(&self) -> Result<MapSource, String> {
        for (name, value) in [("max_items", self.max_items), ("concurrency", self.concurrency)] {
            if let Some(n) = value
                && !(1..=MAX_ITEMS).contains(&n)
            {
                return Err(format!("map.{name} must be 1 to {MAX_ITEMS}, not {n}"));
            }
        }
        self.source()
    }
}

/// Where a mapped task's items come from.
#[derive(Debug, Clone)]
pub struct MapSource {
    /// The dependency whose output holds the array.
    pub task: String,
    path: JsonPath,
}

impl MapSource {
    /// Parses `$.tasks.<key>.output…` (the key plain, `.key`, or quoted,
    /// `['key']`).
    pub fn parse(over: &str) -> Result<Self, String> {
        let shape = || format!("map.over must read `$.tasks.<key>.output…`, not '{over}'");
        let rest = over.strip_prefix("$.tasks").ok_or_else(shape)?;
        let (task, rest) = if let Some(quoted) = rest.strip_prefix("['") {
            let end = quoted.find("']").ok_or_else(shape)?;
            (quoted[..end].to_owned(), &quoted[end + 2..])
        } else if let Some(plain) = rest.strip_prefix('.') {
            let end = plain.find(['.', '[']).unwrap_or(plain.len());
            (plain[..end].to_owned(), &plain[end..])
        } else {
            return Err(shape());
        };
        let after = rest.strip_prefix(".output").ok_or_else(shape)?;
        if task.is_empty() || after.starts_with(|c: char| c.is_alphanumeric() || c == '_') {
            return Err(shape());
        }
        let path = JsonPath::parse(over).map_err(|e| format!("map.over is not a JSONPath: {e}"))?;
        Ok(Self { task, path })
    }

    /// The one value the path selects in `output`, the source's output.
    fn select<'v>(&self, document: &'v Value) -> Result<&'v Value, String> {
        let nodes = self.path.query(document);
        match nodes.len() {
            0 => Err("the source output has no value there".to_owned()),
            1 => nodes.exactly_one().map_err(|e| e.to_string()),
            n => Err(format!("the path selects {n} values, not one array")),
        }
    }
}

/// The `map` fields a stored definition document declares, by task key (a
/// store keeps the document as written beside its task rows; the rebuilt
/// definition's fingerprint then tells whether they are the ones
/// published).
pub fn stored_maps(document: &Value) -> Result<std::collections::BTreeMap<String, MapSpec>, String> {
    let mut maps = std::collections::BTreeMap::new();
    for task in document.get("tasks").and_then(Value::as_array).into_iter().flatten() {
        if let (Some(key), Some(map)) = (task.get("key").and_then(Value::as_str), task.get("map")) {
            let spec: MapSpec = serde_json::from_value(map.clone())
                .map_err(|e| format!("task '{key}': the stored map is not valid: {e}"))?;
            maps.insert(key.to_owned(), spec);
        }
    }
    Ok(maps)
}

/// What a mapped task does once its dependencies let it run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expansion {
    /// Run this many children, `task[0]` to `task[n - 1]`.
    Children(u32),
    /// Nothing to run: skipped for this reason.
    Skip(SkipReason),
    /// It fails for good with this error.
    Fail(String),
}

/// The error prefix of a source that is not an array.
pub const NOT_AN_ARRAY: &str = "map_source_not_array";
/// The error prefix of an array longer than `max_items`.
pub const TOO_LARGE: &str = "map_too_large";
/// The error prefix of children's outputs too large to collect.
pub const OUTPUT_TOO_LARGE: &str = "map_output_too_large";

fn document(source: &MapSource, output: &Value) -> Value {
    json!({ "tasks": { source.task.as_str(): { "output": output } } })
}

/// Expands `spec` over its source task's `output`
/// (docs/design/map.md#expanding).
pub fn expand(spec: &MapSpec, output: &Value) -> Expansion {
    let source = match spec.source() {
        Ok(s) => s,
        Err(e) => return Expansion::Fail(format!("{NOT_AN_ARRAY}: {e}")),
    };
    let doc = document(&source, output);
    match source.select(&doc) {
        Ok(Value::Array(items)) if items.is_empty() => Expansion::Skip(SkipReason::EmptyMap),
        Ok(Value::Array(items)) if items.len() > spec.max_items() as usize => Expansion::Fail(format!(
            "{TOO_LARGE}: {} holds {} items, more than max_items {}",
            spec.over,
            items.len(),
            spec.max_items()
        )),
        Ok(Value::Array(items)) => Expansion::Children(items.len() as u32),
        Ok(other) => Expansion::Fail(format!(
            "{NOT_AN_ARRAY}: {} is {}, not an array",
            spec.over,
            crate::definition::json_kind(other)
        )),
        Err(e) => Expansion::Fail(format!("{NOT_AN_ARRAY}: {}: {e}", spec.over)),
    }
}

/// The item child `index` gets, from its source task's `output`; `None`
/// when the output no longer holds it.
pub fn item(spec: &MapSpec, output: &Value, index: u32) -> Option<Value> {
    let source = spec.source().ok()?;
    let doc = document(&source, output);
    source.select(&doc).ok()?.as_array()?.get(index as usize).cloned()
}

/// The key of child `index` of `task`.
pub fn child_key(task: &str, index: u32) -> String {
    format!("{task}[{index}]")
}

/// The mapped task and index a child key names, if it has a child's shape
/// (`key[n]`). Whether `key` is mapped is the definition's to say; it
/// refuses other task keys of that shape (docs/design/map.md#children).
pub fn child_of(key: &str) -> Option<(&str, u32)> {
    let open = key.strip_suffix(']')?.rfind('[')?;
    let digits = &key[open + 1..key.len() - 1];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    Some((&key[..open], digits.parse().ok()?))
}

/// How a mapped task's children stand, as the store counts them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Children {
    /// How many it expanded into (`None`: not expanded yet).
    pub size: Option<u32>,
    /// Children succeeded.
    pub succeeded: u32,
    /// Children ready, running or waiting for a retry.
    pub active: u32,
    /// The lowest-index child that failed for good, with its error.
    pub failed: Option<(u32, Option<String>)>,
    /// Children held back by the concurrency limit, lowest index first
    /// (at most as many as could be released).
    pub waiting: Vec<u32>,
}

/// What the pass does next with an expanded mapped task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Every child succeeded: collect their outputs.
    Collect,
    /// A child failed for good: the task fails with this error.
    Fail(String),
    /// Release these held-back children (lowest index first).
    Release(Vec<u32>),
    /// Nothing to do until a child finishes.
    Wait,
}

/// Judges an expanded mapped task from its children
/// (docs/design/map.md#collecting).
pub fn progress(task: &str, spec: &MapSpec, children: &Children) -> Progress {
    let Some(size) = children.size else {
        return Progress::Wait;
    };
    if let Some((index, error)) = &children.failed {
        return Progress::Fail(format!(
            "child {} failed: {}",
            child_key(task, *index),
            error.as_deref().unwrap_or("no error recorded")
        ));
    }
    if children.succeeded >= size {
        return Progress::Collect;
    }
    let room = spec.concurrency.map_or(u32::MAX, |c| c.saturating_sub(children.active)) as usize;
    let release: Vec<u32> = children.waiting.iter().copied().take(room).collect();
    if release.is_empty() {
        Progress::Wait
    } else {
        Progress::Release(release)
    }
}

/// How many of `size` children start ready under `spec`'s concurrency.
pub fn first_wave(spec: &MapSpec, size: u32) -> u32 {
    spec.concurrency.map_or(size, |c| c.min(size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(over: &str) -> MapSpec {
        MapSpec {
            over: over.to_owned(),
            max_items: None,
            concurrency: None,
        }
    }

    #[test]
    fn over_names_its_source_task_plain_or_quoted() {
        assert_eq!(spec("$.tasks.list.output").source().expect("plain").task, "list");
        assert_eq!(spec("$.tasks.list.output.items").source().expect("path").task, "list");
        assert_eq!(
            spec("$.tasks['my list'].output[0]").source().expect("quoted").task,
            "my list"
        );
        for bad in [
            "$.list.output",
            "$.tasks.list",
            "$.tasks.list.outputs",
            "tasks.a.output",
            "$.tasks..output",
        ] {
            assert!(spec(bad).source().is_err(), "{bad} is refused");
        }
        let limits = MapSpec {
            max_items: Some(0),
            ..spec("$.tasks.a.output")
        };
        assert_eq!(
            limits.check().expect_err("zero"),
            "map.max_items must be 1 to 10000, not 0"
        );
    }

    #[test]
    fn expansion_counts_items_or_says_why_not() {
        let s = spec("$.tasks.src.output.items");
        assert_eq!(expand(&s, &json!({"items": [1, 2, 3]})), Expansion::Children(3));
        assert_eq!(expand(&s, &json!({"items": []})), Expansion::Skip(SkipReason::EmptyMap));
        let Expansion::Fail(e) = expand(&s, &json!({"items": {"a": 1}})) else {
            panic!("an object is not an array")
        };
        assert_eq!(
            e,
            "map_source_not_array: $.tasks.src.output.items is an object, not an array"
        );
        let Expansion::Fail(e) = expand(&s, &json!({})) else {
            panic!("a missing field is not an array")
        };
        assert!(e.starts_with("map_source_not_array: "), "{e}");
        let small = MapSpec {
            max_items: Some(2),
            ..s.clone()
        };
        let Expansion::Fail(e) = expand(&small, &json!({"items": [1, 2, 3]})) else {
            panic!("too many")
        };
        assert_eq!(
            e,
            "map_too_large: $.tasks.src.output.items holds 3 items, more than max_items 2"
        );
        assert_eq!(
            expand(&spec("$.tasks.src.output"), &json!(["x"])),
            Expansion::Children(1)
        );
        assert_eq!(item(&s, &json!({"items": [1, {"b": 2}]}), 1), Some(json!({"b": 2})));
        assert_eq!(item(&s, &json!({"items": [1]}), 1), None);
    }

    #[test]
    fn progress_fails_on_the_first_failed_child_then_collects_then_releases() {
        let s = MapSpec {
            concurrency: Some(2),
            ..spec("$.tasks.a.output")
        };
        let at = |succeeded, active, failed, waiting: &[u32]| Children {
            size: Some(5),
            succeeded,
            active,
            failed,
            waiting: waiting.to_vec(),
        };
        assert_eq!(
            progress("m", &s, &at(1, 1, Some((3, Some("boom".into()))), &[4])),
            Progress::Fail("child m[3] failed: boom".into())
        );
        assert_eq!(progress("m", &s, &at(5, 0, None, &[])), Progress::Collect);
        assert_eq!(progress("m", &s, &at(1, 1, None, &[2, 3])), Progress::Release(vec![2]));
        assert_eq!(progress("m", &s, &at(1, 2, None, &[3, 4])), Progress::Wait);
        assert_eq!(progress("m", &s, &Children::default()), Progress::Wait);
        assert_eq!(first_wave(&s, 5), 2);
        assert_eq!(first_wave(&spec("$.tasks.a.output"), 5), 5);
    }

    proptest! {
        /// A child key gives back its task and index, whatever the task's
        /// key holds (brackets included).
        #[test]
        fn child_keys_round_trip(task in "[a-z\\[\\]0-9 ]{1,12}", index in any::<u32>()) {
            let key = child_key(&task, index);
            prop_assert_eq!(child_of(&key), Some((task.as_str(), index)));
        }

        /// Released children never push the active ones past the limit,
        /// and come lowest index first.
        #[test]
        fn release_respects_the_limit(limit in 1u32..8, active in 0u32..10, waiting in 0u32..12) {
            let s = MapSpec { concurrency: Some(limit), ..spec("$.tasks.a.output") };
            let children = Children {
                size: Some(100),
                succeeded: 0,
                active,
                failed: None,
                waiting: (10..10 + waiting).collect(),
            };
            match progress("m", &s, &children) {
                Progress::Release(r) => {
                    prop_assert!(active + r.len() as u32 <= limit);
                    prop_assert!(r.windows(2).all(|w| w[0] < w[1]));
                    prop_assert_eq!(r.first().copied(), Some(10));
                }
                Progress::Wait => prop_assert!(active >= limit || waiting == 0),
                other => prop_assert!(false, "unexpected {:?}", other),
            }
        }
    }

    #[test]
    fn other_keys_are_not_children() {
        for key in ["a", "a[]", "a[x]", "a[01]", "[3", "a]", "a[99999999999]"] {
            assert_eq!(child_of(key), None, "{key}");
        }
        assert_eq!(child_of("a[0]"), Some(("a", 0)));
    }
}
