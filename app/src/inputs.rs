//! The `inputs` an attempt gets when its trigger lets it run after
//! dependencies that did not succeed (docs/design/conditions.md#inputs):
//! every dependency is named, null for one without an output, and with
//! `all_done` each carries its state beside its output.

use std::collections::BTreeMap;

use flowforge_domain::TaskDefinition;
use flowforge_domain::condition::Trigger;
use flowforge_domain::plan::condition_inputs;
use flowforge_ports::{MapItem, RunId, RunStore, store};
use serde_json::{Map, Value};

/// The item child `index` of `task` runs for, picked from its source
/// task's output among `outputs` (docs/design/map.md#children); `None`
/// for a task run that is not a child. A source that no longer holds the
/// item (its task ran again since) is an error the attempt fails with for
/// good.
pub(crate) fn map_item(
    task: &TaskDefinition,
    index: Option<u32>,
    outputs: &Map<String, Value>,
) -> Result<Option<MapItem>, String> {
    let (Some(index), Some(spec)) = (index, task.map()) else {
        return Ok(None);
    };
    let source = spec.source()?;
    let output = outputs.get(&source.task).unwrap_or(&Value::Null);
    flowforge_domain::map::item(spec, output, index)
        .map(|item| Some(MapItem { index, item }))
        .ok_or_else(|| format!("{} holds no item {index} any more", spec.over))
}

/// `outputs` (the succeeded dependencies' outputs, as `task_inputs` read
/// them) as `task`'s trigger shows them. Only `all_done` reads the store
/// again, for the states of the dependencies.
pub(crate) async fn for_trigger<S: RunStore>(
    store: &S,
    run: RunId,
    task: &TaskDefinition,
    mut outputs: Map<String, Value>,
) -> Result<Map<String, Value>, store::Error> {
    let trigger = task.trigger();
    if trigger == Trigger::AllSucceeded || task.compensate_for().is_some() {
        return Ok(outputs);
    }
    let states: BTreeMap<String, flowforge_domain::TaskRunState> = if trigger == Trigger::AllDone {
        let detail = store
            .get_run(run)
            .await?
            .ok_or_else(|| store::Error::Other(format!("run {run} not found")))?;
        detail
            .tasks
            .into_iter()
            .filter(|t| t.compensate_for.is_none())
            .map(|t| (t.key, t.state))
            .collect()
    } else {
        BTreeMap::new()
    };
    let dependencies = task
        .depends_on()
        .iter()
        .map(|d| {
            let output = outputs.remove(d);
            let state = states.get(d).copied().unwrap_or(if output.is_some() {
                flowforge_domain::TaskRunState::Succeeded
            } else {
                flowforge_domain::TaskRunState::Skipped
            });
            (d.clone(), (state, output))
        })
        .collect();
    Ok(condition_inputs(trigger, &dependencies))
}
