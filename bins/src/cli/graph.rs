//! `flowforge graph FILE [--format mermaid|dot|json]`: a definition's
//! forward DAG (edges point from a dependency to its dependent), its levels,
//! its topological order, and its compensators, drawn distinctly (a dashed
//! edge from each compensator to the task it undoes).
//!
//! Renderers are pure functions of a [`WorkflowDefinition`], so they are
//! snapshot-tested. Task keys may hold any printable text, so:
//! * Mermaid node ids are generated (`t0`, `t1`, … in topological order,
//!   `c0`, … for compensators) and labels are quoted, with `"`, `#`, `<`,
//!   `>`, `&` and backticks written as entity codes;
//! * DOT ids are the keys themselves, quoted, with `\` and `"` escaped.
//!
//! JSON: `{ "workflow": {"name", "version", "fingerprint"}, "tasks":
//! [{"key", "task_type", "depends_on", "compensate_for"}], "order": [...],
//! "levels": [[...]], "compensators": [{"key", "compensate_for"}] }`
//! (schema: `bins/schemas/graph-report.schema.json`); `tasks` in
//! declaration order, compensators included.
//!
//! An invalid file prints the same error lines as `validate` to stderr and
//! exits 2.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use clap::ValueEnum;
use flowforge_domain::{TaskDefinition, WorkflowDefinition};
use serde_json::{Value, json};

use super::validate::{check_file, render_text};
use super::{Exit, print_report};

/// Arguments of `flowforge graph`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The definition file (JSON).
    #[arg(value_name = "FILE")]
    pub(crate) file: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Mermaid)]
    pub(crate) format: Format,
}

/// What `graph` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// A Mermaid flowchart.
    Mermaid,
    /// A Graphviz digraph.
    Dot,
    /// Machine-readable: tasks, order, levels, compensators.
    Json,
}

/// `flowforge graph`.
pub(crate) fn run(args: &Args) -> anyhow::Result<Exit> {
    let report = check_file(&args.file);
    let Some(definition) = report.definition.as_ref() else {
        eprint!("{}", render_text(&report));
        return Ok(Exit::Invalid);
    };
    let text = match args.format {
        Format::Mermaid => mermaid(definition),
        Format::Dot => dot(definition),
        Format::Json => format!("{}\n", serde_json::to_string_pretty(&graph_json(definition))?),
    };
    print_report(&text)?;
    Ok(Exit::Ok)
}

/// A quoted Mermaid label of `lines`, joined by line breaks; characters
/// Mermaid would read as syntax or markup become entity codes.
fn mermaid_label(lines: &[&str]) -> String {
    let mut out = String::from("\"");
    for (i, text) in lines.iter().enumerate() {
        if i > 0 {
            out.push_str("<br/>");
        }
        for c in text.chars() {
            match c {
                '"' => out.push_str("#quot;"),
                '#' => out.push_str("#35;"),
                '&' => out.push_str("#amp;"),
                '<' => out.push_str("#lt;"),
                '>' => out.push_str("#gt;"),
                '`' => out.push_str("#96;"),
                c => out.push(c),
            }
        }
    }
    out.push('"');
    out
}

/// The compensators, by the key of the task each undoes.
fn compensators(def: &WorkflowDefinition) -> Vec<(&str, &TaskDefinition)> {
    def.compensators().collect()
}

/// A Mermaid flowchart: tasks as boxes, compensators as dashed hexagons
/// joined to their task by a dashed edge; name, order and levels as
/// comments.
pub(crate) fn mermaid(def: &WorkflowDefinition) -> String {
    let graph = def.graph();
    let order = graph.topological_order();
    let ids: HashMap<&str, String> = order.iter().enumerate().map(|(i, k)| (*k, format!("t{i}"))).collect();
    let mut out = String::from("flowchart LR\n");
    let _ = writeln!(out, "    %% {} v{} ({})", def.name(), def.version(), def.fingerprint());
    let _ = writeln!(out, "    %% order: {}", order.join(", "));
    for (n, level) in graph.levels().iter().enumerate() {
        let _ = writeln!(out, "    %% level {n}: {}", level.join(", "));
    }
    for key in &order {
        let task_type = def.task(key).map_or("", TaskDefinition::task_type);
        let _ = writeln!(out, "    {}[{}]", ids[key], mermaid_label(&[key, task_type]));
    }
    for key in &order {
        for dependent in graph.dependents_of(key) {
            let _ = writeln!(out, "    {} --> {}", ids[key], ids[dependent]);
        }
    }
    let compensators = compensators(def);
    for (i, (target, task)) in compensators.iter().enumerate() {
        let label = mermaid_label(&[task.key(), task.task_type()]);
        let _ = writeln!(out, "    c{i}{{{{{label}}}}}");
        let _ = writeln!(out, "    c{i} -.->|compensates| {}", ids[target]);
    }
    if !compensators.is_empty() {
        out.push_str("    classDef compensator stroke-dasharray: 5 5\n");
        let all: Vec<String> = (0..compensators.len()).map(|i| format!("c{i}")).collect();
        let _ = writeln!(out, "    class {} compensator", all.join(","));
    }
    out
}

/// A quoted DOT id or string: `\` and `"` escaped, newlines as `\n`.
fn dot_quote(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
    format!("\"{escaped}\"")
}

/// A Graphviz digraph: one rank per level, compensators as dashed boxes
/// with a dashed edge to their task that does not affect the ranking.
pub(crate) fn dot(def: &WorkflowDefinition) -> String {
    let graph = def.graph();
    let order = graph.topological_order();
    let mut out = String::new();
    let _ = writeln!(out, "// {} v{} ({})", def.name(), def.version(), def.fingerprint());
    let _ = writeln!(out, "// order: {}", order.join(", "));
    let _ = writeln!(out, "digraph {} {{", dot_quote(def.name()));
    out.push_str("    rankdir=LR;\n    node [shape=box];\n");
    for key in &order {
        let task_type = def.task(key).map_or("", TaskDefinition::task_type);
        let label = dot_quote(&format!("{key}\n({task_type})"));
        let _ = writeln!(out, "    {} [label={label}];", dot_quote(key));
    }
    for key in &order {
        for dependent in graph.dependents_of(key) {
            let _ = writeln!(out, "    {} -> {};", dot_quote(key), dot_quote(dependent));
        }
    }
    for (n, level) in graph.levels().iter().enumerate() {
        let members: Vec<String> = level.iter().map(|k| dot_quote(k)).collect();
        let _ = writeln!(out, "    {{ rank=same; {}; }} // level {n}", members.join("; "));
    }
    for (target, task) in compensators(def) {
        let label = dot_quote(&format!("{}\n({})", task.key(), task.task_type()));
        let key = dot_quote(task.key());
        let _ = writeln!(out, "    {key} [label={label}, style=\"dashed,rounded\"];");
        let _ = writeln!(
            out,
            "    {key} -> {} [style=dashed, label=\"compensates\", constraint=false];",
            dot_quote(target)
        );
    }
    out.push_str("}\n");
    out
}

/// The `graph --format json` report.
pub(crate) fn graph_json(def: &WorkflowDefinition) -> Value {
    let graph = def.graph();
    let tasks: Vec<Value> = def
        .tasks()
        .iter()
        .map(|t| {
            json!({
                "key": t.key(),
                "task_type": t.task_type(),
                "depends_on": t.depends_on(),
                "compensate_for": t.compensate_for(),
            })
        })
        .collect();
    let compensators: Vec<Value> = compensators(def)
        .into_iter()
        .map(|(target, t)| json!({ "key": t.key(), "compensate_for": target }))
        .collect();
    json!({
        "workflow": { "name": def.name(), "version": def.version(), "fingerprint": def.fingerprint() },
        "tasks": tasks,
        "order": graph.topological_order(),
        "levels": graph.levels(),
        "compensators": compensators,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use flowforge_domain::schema::parse_value;

    /// Keys that are syntax in Mermaid or DOT.
    fn awkward() -> WorkflowDefinition {
        parse_value(json!({"name": "we\"ird \\ name", "version": 1, "tasks": [
            {"key": "end", "task_type": "noop"},
            {"key": "say \"hi\" #1 <b>&`x`", "task_type": "echo", "depends_on": ["end"]},
            {"key": "back\\slash\\", "task_type": "noop"},
            {"key": "undo end", "task_type": "noop", "compensate_for": "end"}
        ]}))
        .unwrap()
    }

    /// Drops the line that carries the fingerprint.
    fn without_fingerprint(text: &str) -> String {
        text.lines()
            .filter(|l| !l.contains(" v1 ("))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    #[test]
    fn mermaid_ids_are_generated_and_labels_escaped() {
        expect![[r#"
            flowchart LR
                %% order: back\slash\, end, say "hi" #1 <b>&`x`
                %% level 0: back\slash\, end
                %% level 1: say "hi" #1 <b>&`x`
                t0["back\slash\<br/>noop"]
                t1["end<br/>noop"]
                t2["say #quot;hi#quot; #35;1 #lt;b#gt;#amp;#96;x#96;<br/>echo"]
                t1 --> t2
                c0{{"undo end<br/>noop"}}
                c0 -.->|compensates| t1
                classDef compensator stroke-dasharray: 5 5
                class c0 compensator
        "#]]
        .assert_eq(&without_fingerprint(&mermaid(&awkward())));
    }

    #[test]
    fn dot_ids_are_quoted_and_escaped() {
        expect![[r#"
            // order: back\slash\, end, say "hi" #1 <b>&`x`
            digraph "we\"ird \\ name" {
                rankdir=LR;
                node [shape=box];
                "back\\slash\\" [label="back\\slash\\\n(noop)"];
                "end" [label="end\n(noop)"];
                "say \"hi\" #1 <b>&`x`" [label="say \"hi\" #1 <b>&`x`\n(echo)"];
                "end" -> "say \"hi\" #1 <b>&`x`";
                { rank=same; "back\\slash\\"; "end"; } // level 0
                { rank=same; "say \"hi\" #1 <b>&`x`"; } // level 1
                "undo end" [label="undo end\n(noop)", style="dashed,rounded"];
                "undo end" -> "end" [style=dashed, label="compensates", constraint=false];
            }
        "#]]
        .assert_eq(&without_fingerprint(&dot(&awkward())));
    }
}
