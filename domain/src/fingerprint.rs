//! A definition's identity: SHA-256 (lower-case hex) of the RFC 8785
//! canonical JSON of its normalised form
//! (docs/design/definitions.md#fingerprint).
//!
//! Normalised means every field present, as written or as its empty value
//! (`""`, `[]`, `{}`, or `null` where there is no empty value), tasks sorted
//! by key and `depends_on` sorted; defaults are not folded into tasks. So
//! declaration order and object-key order do not change the fingerprint,
//! and every written field — the description included — does.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::condition::Trigger;
use crate::definition::{Defaults, RetrySpec, TaskDefinition, WorkflowDefinition};

fn retry(spec: Option<&RetrySpec>) -> Value {
    spec.map_or(Value::Null, |r| {
        json!({
            "max_attempts": r.max_attempts,
            "delay_seconds": r.delay_seconds,
            "backoff": r.backoff,
            "max_delay_seconds": r.max_delay_seconds,
        })
    })
}

fn task(t: &TaskDefinition) -> Value {
    let mut depends_on: Vec<&str> = t.depends_on().iter().map(String::as_str).collect();
    depends_on.sort_unstable();
    let mut task = json!({
        "key": t.key(),
        "task_type": t.task_type(),
        "depends_on": depends_on,
        "config": t.config(),
        "timeout_seconds": t.timeout_seconds(),
        "retry": retry(t.retry()),
        "compensate_for": t.compensate_for(),
    });
    // Only when given: the fingerprints published before priorities
    // existed must stay what they were.
    if let Some(p) = t.priority() {
        task["priority"] = json!(p.get());
    }
    if let Some(limit) = t.concurrency() {
        task["concurrency"] = json!({"key": limit.key, "max": limit.max});
    }
    // Absent unless set, so the fingerprints of definitions without them
    // stay as they were; the default trigger written out means the same as
    // none (docs/design/conditions.md).
    if let Some(when) = t.when() {
        task["when"] = json!(when);
    }
    if t.trigger() != Trigger::AllSucceeded {
        task["trigger"] = json!(t.trigger().as_str());
    }
    // Absent unless set, as `when`; the default limit written out means
    // the same as none (docs/design/map.md).
    if let Some(map) = t.map() {
        task["map"] = json!({"over": map.over, "max_items": map.max_items(), "concurrency": map.concurrency});
    }
    task
}

fn defaults(d: &Defaults) -> Value {
    json!({ "timeout_seconds": d.timeout_seconds, "retry": retry(d.retry.as_ref()) })
}

/// The normalised form that the fingerprint hashes.
pub fn normalised(def: &WorkflowDefinition) -> Value {
    let mut tasks: Vec<&TaskDefinition> = def.tasks().iter().collect();
    tasks.sort_by(|a, b| a.key().cmp(b.key()));
    let mut normalised = json!({
        "name": def.name(),
        "version": def.version(),
        "description": def.description(),
        "defaults": defaults(def.defaults()),
        "tasks": tasks.into_iter().map(task).collect::<Vec<_>>(),
    });
    // Only when given, as a task's priority: earlier fingerprints stand.
    if !def.concurrency().is_empty() {
        normalised["concurrency"] = def
            .concurrency()
            .iter()
            .map(|l| json!({"key": l.key, "max": l.max, "strategy": l.strategy.as_str()}))
            .collect();
    }
    normalised
}

/// The canonical bytes of the normalised form (RFC 8785).
pub fn canonical_bytes(def: &WorkflowDefinition) -> Vec<u8> {
    // Serialising a `serde_json::Value` cannot fail: its map keys are
    // strings and its numbers are finite by construction.
    serde_json_canonicalizer::to_vec(&normalised(def)).unwrap_or_default()
}

/// SHA-256 of the canonical normalised form, as 64 lower-case hex digits.
pub fn fingerprint(def: &WorkflowDefinition) -> String {
    let digest = Sha256::digest(canonical_bytes(def));
    let mut hex = String::with_capacity(64);
    for byte in digest.iter() {
        hex.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
        hex.push(char::from(b"0123456789abcdef"[usize::from(byte & 0xf)]));
    }
    hex
}

impl WorkflowDefinition {
    /// See [`fingerprint`].
    pub fn fingerprint(&self) -> String {
        fingerprint(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::parse_value;
    use proptest::prelude::*;

    fn def(v: Value) -> WorkflowDefinition {
        parse_value(v).unwrap()
    }

    fn base() -> Value {
        json!({
            "name": "etl", "version": 3, "description": "nightly load",
            "defaults": {"retry": {"max_attempts": 2}},
            "tasks": [
                {"key": "extract", "task_type": "command", "config": {"argv": ["x"], "env": {"A": "1", "B": "2"}}},
                {"key": "transform", "task_type": "echo", "depends_on": ["extract", "clean"]},
                {"key": "clean", "task_type": "noop"},
                {"key": "undo", "task_type": "noop", "compensate_for": "extract"}
            ]
        })
    }

    #[test]
    fn is_64_lower_case_hex_digits() {
        let fp = def(base()).fingerprint();
        assert_eq!(fp.len(), 64);
        assert!(fp.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));
    }

    #[test]
    fn empty_values_and_absent_fields_fingerprint_alike() {
        let mut explicit = base();
        explicit["tasks"][2]["depends_on"] = json!([]);
        explicit["tasks"][2]["config"] = json!({});
        assert_eq!(def(explicit).fingerprint(), def(base()).fingerprint());
        let mut no_desc = base();
        no_desc["description"] = json!("");
        let mut absent = base();
        absent.as_object_mut().unwrap().remove("description");
        assert_eq!(def(no_desc).fingerprint(), def(absent).fingerprint());
    }

    #[test]
    fn every_written_field_changes_it() {
        let original = def(base()).fingerprint();
        for (pointer, value) in [
            ("/description", json!("daily load")),
            ("/version", json!(4)),
            ("/defaults/retry/max_attempts", json!(3)),
            ("/tasks/0/config/env/A", json!("9")),
            ("/tasks/1/task_type", json!("noop")),
            ("/tasks/3/compensate_for", json!("clean")),
        ] {
            let mut changed = base();
            *changed.pointer_mut(pointer).unwrap() = value;
            assert_ne!(def(changed).fingerprint(), original, "{pointer}");
        }
        let mut with_timeout = base();
        with_timeout["tasks"][0]["timeout_seconds"] = json!(5);
        assert_ne!(def(with_timeout).fingerprint(), original);
        let mut with_priority = base();
        with_priority["tasks"][0]["priority"] = json!(9);
        assert_ne!(def(with_priority).fingerprint(), original);
        let mut with_when = base();
        with_when["tasks"][1]["when"] = json!("run_input.go");
        let when = def(with_when.clone()).fingerprint();
        assert_ne!(when, original);
        with_when["tasks"][1]["when"] = json!("!run_input.go");
        assert_ne!(def(with_when).fingerprint(), when, "another condition");
        let mut with_trigger = base();
        with_trigger["tasks"][1]["trigger"] = json!("all_done");
        let all_done = def(with_trigger.clone()).fingerprint();
        assert_ne!(all_done, original);
        with_trigger["tasks"][1]["trigger"] = json!("none_failed");
        assert_ne!(def(with_trigger.clone()).fingerprint(), all_done);
        with_trigger["tasks"][1]["trigger"] = json!("all_succeeded");
        assert_eq!(
            def(with_trigger).fingerprint(),
            original,
            "all_succeeded is the default"
        );
        let mut limited = base();
        limited["concurrency"] = json!([{"key": "$.k", "max": 1}]);
        let with_run_limit = def(limited.clone()).fingerprint();
        assert_ne!(with_run_limit, original);
        limited["concurrency"][0]["strategy"] = json!("queue");
        assert_eq!(
            def(limited.clone()).fingerprint(),
            with_run_limit,
            "queue is the default"
        );
        limited["tasks"][0]["concurrency"] = json!({"key": "$.k", "max": 1});
        assert_ne!(def(limited).fingerprint(), with_run_limit);
    }

    #[test]
    fn integer_and_float_spellings_of_one_number_agree() {
        let mut a = base();
        a["tasks"][0]["timeout_seconds"] = json!(5);
        let mut b = base();
        b["tasks"][0]["timeout_seconds"] = json!(5.0);
        assert_eq!(def(a).fingerprint(), def(b).fingerprint());
    }

    /// Rebuilds `v` with every object's keys inserted in a shuffled order.
    fn reorder_keys(v: &Value, seed: &mut u64) -> Value {
        match v {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                for i in (1..entries.len()).rev() {
                    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    entries.swap(i, (*seed >> 33) as usize % (i + 1));
                }
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.clone(), reorder_keys(v, seed)))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(|i| reorder_keys(i, seed)).collect()),
            other => other.clone(),
        }
    }

    proptest! {
        #[test]
        fn task_order_dependency_order_and_key_order_do_not_matter(seed in any::<u64>()) {
            let mut s = seed;
            let mut v = reorder_keys(&base(), &mut s);
            let tasks = v["tasks"].as_array_mut().unwrap();
            for i in (1..tasks.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
                tasks.swap(i, (s >> 33) as usize % (i + 1));
            }
            for t in tasks.iter_mut() {
                if let Some(deps) = t.get_mut("depends_on").and_then(Value::as_array_mut) {
                    deps.reverse();
                }
            }
            prop_assert_eq!(def(v).fingerprint(), def(base()).fingerprint());
        }
    }
}
