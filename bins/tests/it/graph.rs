//! `flowforge graph`: Mermaid and DOT snapshots of the diamond and the
//! saga, the JSON report against its schema, invalid input, bad flags.

use expect_test::{Expect, expect};
use serde_json::json;

use predicates::prelude::*;

use crate::{Files, assert_schema_valid, flowforge, run};

/// `flowforge graph FILE [--format FORMAT]` succeeds and prints `expected`.
fn check(file: &str, format: Option<&str>, expected: Expect) {
    let mut args = vec!["graph", file];
    if let Some(format) = format {
        args.extend(["--format", format]);
    }
    let out = run(&args);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    expected.assert_eq(&out.stdout);
}

#[test]
fn diamond_as_mermaid_is_the_default() {
    check(
        "examples/diamond.json",
        None,
        expect![[r#"
            flowchart LR
                %% diamond v1 (7c657f69cd4c7dbafde2cadc3eef32ef23ff2db994b615e9a66a894cc0c742b6)
                %% order: start, left, right, join
                %% level 0: start
                %% level 1: left, right
                %% level 2: join
                t0["start<br/>noop"]
                t1["left<br/>echo"]
                t2["right<br/>echo"]
                t3["join<br/>echo"]
                t0 --> t1
                t0 --> t2
                t1 --> t3
                t2 --> t3
        "#]],
    );
}

#[test]
fn saga_as_mermaid_draws_compensators_dashed() {
    check(
        "examples/saga.json",
        Some("mermaid"),
        expect![[r#"
            flowchart LR
                %% order-saga v1 (273f2ea1a048c77856627e8174ab6d37f812bfbfbac2344c5115275dd16b315e)
                %% order: reserve_inventory, charge_payment, ship_order, notify_customer
                %% level 0: reserve_inventory
                %% level 1: charge_payment
                %% level 2: ship_order
                %% level 3: notify_customer
                t0["reserve_inventory<br/>noop"]
                t1["charge_payment<br/>noop"]
                t2["ship_order<br/>fail"]
                t3["notify_customer<br/>echo"]
                t0 --> t1
                t1 --> t2
                t2 --> t3
                c0{{"refund_payment<br/>echo"}}
                c0 -.->|compensates| t1
                c1{{"release_inventory<br/>echo"}}
                c1 -.->|compensates| t0
                c2{{"cancel_shipment<br/>noop"}}
                c2 -.->|compensates| t2
                classDef compensator stroke-dasharray: 5 5
                class c0,c1,c2 compensator
        "#]],
    );
}

#[test]
fn diamond_as_dot() {
    check(
        "examples/diamond.json",
        Some("dot"),
        expect![[r#"
            // diamond v1 (7c657f69cd4c7dbafde2cadc3eef32ef23ff2db994b615e9a66a894cc0c742b6)
            // order: start, left, right, join
            digraph "diamond" {
                rankdir=LR;
                node [shape=box];
                "start" [label="start\n(noop)"];
                "left" [label="left\n(echo)"];
                "right" [label="right\n(echo)"];
                "join" [label="join\n(echo)"];
                "start" -> "left";
                "start" -> "right";
                "left" -> "join";
                "right" -> "join";
                { rank=same; "start"; } // level 0
                { rank=same; "left"; "right"; } // level 1
                { rank=same; "join"; } // level 2
            }
        "#]],
    );
}

#[test]
fn saga_as_dot() {
    check(
        "examples/saga.json",
        Some("dot"),
        expect![[r#"
            // order-saga v1 (273f2ea1a048c77856627e8174ab6d37f812bfbfbac2344c5115275dd16b315e)
            // order: reserve_inventory, charge_payment, ship_order, notify_customer
            digraph "order-saga" {
                rankdir=LR;
                node [shape=box];
                "reserve_inventory" [label="reserve_inventory\n(noop)"];
                "charge_payment" [label="charge_payment\n(noop)"];
                "ship_order" [label="ship_order\n(fail)"];
                "notify_customer" [label="notify_customer\n(echo)"];
                "reserve_inventory" -> "charge_payment";
                "charge_payment" -> "ship_order";
                "ship_order" -> "notify_customer";
                { rank=same; "reserve_inventory"; } // level 0
                { rank=same; "charge_payment"; } // level 1
                { rank=same; "ship_order"; } // level 2
                { rank=same; "notify_customer"; } // level 3
                "refund_payment" [label="refund_payment\n(echo)", style="dashed,rounded"];
                "refund_payment" -> "charge_payment" [style=dashed, label="compensates", constraint=false];
                "release_inventory" [label="release_inventory\n(echo)", style="dashed,rounded"];
                "release_inventory" -> "reserve_inventory" [style=dashed, label="compensates", constraint=false];
                "cancel_shipment" [label="cancel_shipment\n(noop)", style="dashed,rounded"];
                "cancel_shipment" -> "ship_order" [style=dashed, label="compensates", constraint=false];
            }
        "#]],
    );
}

#[test]
fn json_reports_order_levels_and_compensators() {
    let out = run(["graph", "examples/diamond.json", "--format", "json"]);
    assert_eq!(out.code, 0, "{out:?}");
    let report = assert_schema_valid("graph-report.schema.json", &out.stdout);
    assert_eq!(report["workflow"]["name"], "diamond");
    assert_eq!(report["order"], json!(["start", "left", "right", "join"]));
    assert_eq!(report["levels"], json!([["start"], ["left", "right"], ["join"]]));
    assert_eq!(report["compensators"], json!([]));

    let out = run(["graph", "examples/saga.json", "--format", "json"]);
    assert_eq!(out.code, 0, "{out:?}");
    let report = assert_schema_valid("graph-report.schema.json", &out.stdout);
    assert_eq!(
        report["order"],
        json!(["reserve_inventory", "charge_payment", "ship_order", "notify_customer"])
    );
    assert_eq!(
        report["compensators"],
        json!([
            {"key": "refund_payment", "compensate_for": "charge_payment"},
            {"key": "release_inventory", "compensate_for": "reserve_inventory"},
            {"key": "cancel_shipment", "compensate_for": "ship_order"},
        ])
    );
    assert_eq!(
        report["tasks"][2],
        json!({"key": "ship_order", "task_type": "fail", "depends_on": ["charge_payment"], "compensate_for": null})
    );
    // The fingerprint is the one `validate` prints.
    let validate = run(["validate", "examples/saga.json"]);
    assert!(
        validate
            .stdout
            .contains(report["workflow"]["fingerprint"].as_str().unwrap()),
        "{validate:?}"
    );

    let out = run(["graph", "examples/etl.json", "--format", "json"]);
    let report = assert_schema_valid("graph-report.schema.json", &out.stdout);
    assert_eq!(
        report["levels"],
        json!([["extract"], ["profile", "transform"], ["load"]])
    );
}

#[test]
fn an_invalid_file_prints_validates_errors_to_stderr_and_exits_2() {
    let files = Files::new();
    let path = files.json(
        "cycle.json",
        &json!({"name": "w", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop", "depends_on": ["b"]},
            {"key": "b", "task_type": "noop", "depends_on": ["a"]}]}),
    );
    let validate = run(["validate".as_ref(), path.as_os_str()]);
    for format in ["mermaid", "dot", "json"] {
        let out = run(["graph".as_ref(), path.as_os_str(), "--format".as_ref(), format.as_ref()]);
        assert_eq!(out.code, 2, "{out:?}");
        assert!(out.stdout.is_empty(), "{out:?}");
        assert_eq!(out.stderr, validate.stdout);
        assert!(
            out.stderr
                .contains("graph $.tasks[0] (task 'a'): dependency cycle detected: a -> b -> a")
        );
    }
    let missing = run(["graph", "examples/missing.json"]);
    assert_eq!(missing.code, 2, "{missing:?}");
    assert!(
        missing
            .stderr
            .starts_with("examples/missing.json: io: cannot read file"),
        "{missing:?}"
    );
}

#[test]
fn bad_usage_exits_2() {
    for args in [
        &["graph"][..],
        &["graph", "examples/diamond.json", "--format", "png"],
        &["graph", "examples/diamond.json", "examples/saga.json"],
    ] {
        flowforge(args)
            .assert()
            .code(2)
            .stdout(predicate::str::is_empty())
            .stderr(predicate::str::contains("--help"));
    }
}
