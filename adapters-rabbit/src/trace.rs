//! The trace context a dispatch carries as an AMQP header, so a worker's
//! spans join the run's trace and so do those of workers written in other
//! languages, which read the standard W3C `traceparent`
//! (docs/design/server.md#traces).

use flowforge_ports::Dispatch;
use lapin::types::{AMQPValue, FieldTable, LongString};

/// The header's name, as W3C Trace Context spells it.
const TRACEPARENT: &str = "traceparent";

/// The headers a published dispatch carries.
pub(crate) fn headers(dispatch: &Dispatch) -> FieldTable {
    let mut table = FieldTable::default();
    table.insert(
        TRACEPARENT.into(),
        AMQPValue::LongString(LongString::from(dispatch.trace_parent())),
    );
    table
}

/// The `traceparent` a delivery carried, if any (a publisher of another
/// version may not send one; a value that is not text is ignored).
pub(crate) fn trace_parent(headers: Option<&FieldTable>) -> Option<String> {
    match headers?.inner().get(TRACEPARENT)? {
        AMQPValue::LongString(text) => std::str::from_utf8(text.as_bytes()).ok().map(str::to_owned),
        AMQPValue::ShortString(text) => Some(text.as_str().to_owned()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use flowforge_ports::{DispatchId, RunId, TaskRunId};

    use super::*;

    #[test]
    fn the_header_round_trips_the_runs_trace_context() {
        let run = uuid::Uuid::now_v7();
        let dispatch = Dispatch {
            dispatch_id: DispatchId(42),
            task_run_id: TaskRunId(7),
            run_id: RunId(run),
            task_key: "a".into(),
            task_type: "noop".into(),
            fencing_token: 1,
            ready_at: None,
            priority: Default::default(),
        };
        let table = headers(&dispatch);
        let carried = trace_parent(Some(&table)).expect("a traceparent");
        assert_eq!(carried, format!("00-{}-000000000000002a-01", run.simple()));
        assert_eq!(trace_parent(None), None);
        assert_eq!(trace_parent(Some(&FieldTable::default())), None);
    }
}
