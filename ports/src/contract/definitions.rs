//! Contract cases: publishing and loading definitions.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::json;
use tokio::sync::Barrier;

use crate::ids::WorkflowId;
use crate::store::{DefinitionStore, LoadError, PublishError};

use super::*;

/// Publishing is idempotent by content: the same content returns the stored
/// row (its id, creation time and declaration order) with `created = false`.
pub async fn publish_creates_then_returns_the_stored_row<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let def = definition(chain());
    let first = s.publish_definition(&def).await.expect("publish");
    assert!(first.created);
    assert_eq!(first.fingerprint, def.fingerprint());
    assert_eq!(*first.definition, def);

    let again = s.publish_definition(&def).await.expect("republish");
    assert!(!again.created, "identical content is not created twice");
    assert_eq!((again.id, &again.fingerprint), (first.id, &first.fingerprint));
    assert_eq!(again.created_at, first.created_at);

    // Same content declared in another order: same fingerprint, the stored row.
    let mut reordered = chain();
    reordered["tasks"].as_array_mut().expect("tasks is an array").reverse();
    let reordered = definition(reordered);
    assert_eq!(reordered.fingerprint(), def.fingerprint());
    let stored = s.publish_definition(&reordered).await.expect("republish reordered");
    assert!(!stored.created);
    assert_eq!(stored.id, first.id);
    assert_eq!(
        stored.definition.document(),
        def.document(),
        "the stored declaration order"
    );
}

/// Different content under a published (name, version) is a conflict that
/// names both fingerprints; the stored definition is untouched.
pub async fn publish_refuses_different_content_naming_both_fingerprints<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let original = publish(&s, chain()).await;
    for change in [
        json!({"name": "chain", "version": 1, "tasks": [{"key": "a", "task_type": "noop"}]}),
        {
            let mut described = chain();
            described["description"] = json!("only the description changed");
            described
        },
    ] {
        let other = definition(change);
        match s.publish_definition(&other).await {
            Err(PublishError::Conflict {
                name,
                version,
                existing,
                new,
            }) => {
                assert_eq!((name.as_str(), version), ("chain", 1));
                assert_eq!(existing, original.fingerprint);
                assert_eq!(new, other.fingerprint());
                assert_ne!(existing, new);
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
    }
    let loaded = s.load_definition(original.id).await.expect("load");
    assert_eq!(*loaded.definition, *original.definition);
}

/// Loading rebuilds exactly what was published (every field, declaration
/// order, float settings), re-validated, with the published fingerprint.
pub async fn load_round_trips_definitions<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let doc = json!({
        "name": "rich", "version": 7, "description": "every field",
        "defaults": {"timeout_seconds": 12.5, "retry": {"max_attempts": 3, "delay_seconds": 0.3}},
        "tasks": [
            {"key": "load", "task_type": "noop", "depends_on": ["transform", "extract"],
             "timeout_seconds": 0.1, "retry": {"max_attempts": 5, "delay_seconds": 0.7, "backoff": 1.7,
             "max_delay_seconds": 12.345}},
            {"key": "extract", "task_type": "command", "config": {"argv": ["./x.sh", "--fast"], "env": {"A": "1"}}},
            {"key": "transform", "task_type": "echo", "depends_on": ["extract"], "config": {}},
            {"key": "undo_extract", "task_type": "command", "compensate_for": "extract",
             "config": {"argv": ["./undo.sh"]}, "retry": {"max_attempts": 2}}
        ]
    });
    let def = definition(doc);
    let published = s.publish_definition(&def).await.expect("publish");
    let loaded = s.load_definition(published.id).await.expect("load");
    assert_eq!(loaded.id, published.id);
    assert!(!loaded.created);
    assert_eq!(*loaded.definition, def, "a load returns the published document");
    assert_eq!(loaded.fingerprint, def.fingerprint());
    assert_eq!(loaded.definition.fingerprint(), published.fingerprint);
    assert_eq!(loaded.created_at, published.created_at);

    let found = s
        .find_definition("rich", 7)
        .await
        .expect("find")
        .expect("found by name and version");
    assert_eq!(found.id, published.id);
    assert_eq!(*found.definition, def);
    assert!(s.find_definition("rich", 8).await.expect("find").is_none());
    assert!(s.find_definition("poor", 7).await.expect("find").is_none());
    assert!(matches!(
        s.load_definition(WorkflowId(i64::MAX)).await,
        Err(LoadError::NotFound(_))
    ));
}

/// Two concurrent first publishes of one (name, version) end with one
/// definition; the loser gets the winner's row, a conflict or `LostRace`.
pub async fn concurrent_first_publishes_end_with_one_definition<F: StoreFactory>(factory: &F) {
    let (s, _) = fresh(factory).await;
    let contents = [
        json!({"name": "race", "version": 1, "tasks": [{"key": "a", "task_type": "noop"}]}),
        json!({"name": "race", "version": 1, "tasks": [{"key": "b", "task_type": "noop"}]}),
    ];
    let barrier = Arc::new(Barrier::new(contents.len()));
    let handles: Vec<_> = contents
        .iter()
        .map(|c| {
            let (s, barrier, def) = (s.clone(), barrier.clone(), definition(c.clone()));
            tokio::spawn(async move {
                barrier.wait().await;
                (s.publish_definition(&def).await, def)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for h in handles {
        match h.await.expect("publisher task") {
            (Ok(p), def) => {
                assert!(p.created, "different content can only be created, not found");
                winners.push(def);
            }
            (Err(PublishError::Conflict { .. } | PublishError::LostRace { .. }), _) => {}
            (Err(e), _) => panic!("a lost publish race must be a conflict or LostRace, not {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one definition is created");
    let stored = s.find_definition("race", 1).await.expect("find").expect("stored");
    assert_eq!(*stored.definition, winners[0]);

    // Identical content: both get the same row (or the loser is told to retry).
    let def = definition(json!({"name": "same", "version": 1, "tasks": [{"key": "a", "task_type": "noop"}]}));
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let (s, barrier, def) = (s.clone(), barrier.clone(), def.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                s.publish_definition(&def).await
            })
        })
        .collect();
    let mut ids = BTreeSet::new();
    let mut created = 0;
    for h in handles {
        match h.await.expect("publisher task") {
            Ok(p) => {
                ids.insert(p.id);
                created += usize::from(p.created);
            }
            Err(PublishError::LostRace { .. }) => {}
            Err(e) => panic!("identical content must not conflict: {e}"),
        }
    }
    assert_eq!(ids.len(), 1, "one row for identical content");
    assert_eq!(created, 1);
}
