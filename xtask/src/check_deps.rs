//! `cargo xtask check-deps`: the direction of dependencies
//! (docs/design/layering.md#dependency-direction),
//! enforced three ways.
//!
//! 1. **Layers.** Edges between workspace crates only point inwards:
//!    `domain` ← `ports` ← adapters and `app` ← `bins`. Adapters never
//!    depend on each other or on `app`; `app` never on an adapter (its
//!    integration tests excepted: a dev-dependency); `domain`
//!    on no internal crate; `xtask` on anything. Every dependency kind
//!    (normal, dev, build) counts, read from `cargo metadata`.
//! 2. **Allow-lists** (rustc's tidy `deps.rs` model): the transitive
//!    *normal* dependencies of `flowforge-domain` and of `flowforge-ports`,
//!    walked in `cargo metadata`'s resolve graph, must each be on a sorted
//!    list in [`allowed`]. A new entry is allowed, but deliberate: the error
//!    names the package, the path that pulled it in, and the list to edit.
//!    A list that is unsorted or names something no longer used also fails,
//!    so the lists stay honest. The resolve graph unifies features across
//!    the workspace, so a list is what the crate really links in *this*
//!    workspace (a superset of what it needs alone).
//! 3. **Source scan** of `domain/src/**/*.rs` for paths that mean I/O,
//!    processes, threads, environment, clocks or a runtime ([`scan`]).
//!
//! `cargo deny` checks the same boundary from the other side (deny.toml and
//! xtask/deny-domain.toml); `cargo xtask deny-selftest` proves both bite.

mod allowed;
pub(crate) mod scan;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{cargo, project_root};

/// Where the allow-lists live, for error messages.
const ALLOWED_FILE: &str = "xtask/src/check_deps/allowed.rs";

/// `cargo xtask check-deps`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    if let Some(arg) = args.first() {
        bail!("check-deps takes no arguments, got `{arg}`");
    }
    check(&project_root())
}

/// Runs every check against the workspace at `root`; prints a summary on
/// success, every problem on failure.
pub(crate) fn check(root: &Path) -> Result<()> {
    let metadata = Metadata::load(root)?;
    let mut problems = check_layers(&metadata);

    let mut summary = Vec::new();
    for (crate_name, list_name, list) in [
        ("flowforge-domain", "DOMAIN_ALLOWED", allowed::DOMAIN_ALLOWED),
        ("flowforge-ports", "PORTS_ALLOWED", allowed::PORTS_ALLOWED),
    ] {
        let used = metadata.normal_closure(crate_name)?;
        summary.push(format!("{crate_name}: {} dependencies", used.len()));
        problems.extend(compare_with_allow_list(crate_name, &used, list_name, list));
    }

    let (files, hits) = scan_domain(&root.join("domain/src"), root)?;
    summary.push(format!("domain/src: {files} files scanned"));
    problems.extend(hits);

    if problems.is_empty() {
        println!("check-deps: ok ({})", summary.join("; "));
        return Ok(());
    }
    for problem in &problems {
        eprintln!("error: {problem}");
    }
    bail!("check-deps found {} problem(s)", problems.len())
}

/// The architectural layer of a workspace crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layer {
    Domain,
    Ports,
    Adapter,
    /// An inbound (driving) adapter — the HTTP API: it calls the app's
    /// use cases, so it sits above `app`, and no other adapter knows it.
    Inbound,
    App,
    Bins,
    Xtask,
    /// Test support: a dev-dependency of any layer but `domain`; it knows
    /// no FlowForge crate.
    Testkit,
}

fn layer_of(package: &str) -> Option<Layer> {
    Some(match package {
        "flowforge-domain" => Layer::Domain,
        "flowforge-ports" => Layer::Ports,
        "flowforge-app" => Layer::App,
        "flowforge-bins" => Layer::Bins,
        "flowforge-xtask" => Layer::Xtask,
        "flowforge-testkit" => Layer::Testkit,
        "flowforge-adapters-http" => Layer::Inbound,
        p if p.starts_with("flowforge-adapters-") => Layer::Adapter,
        _ => return None,
    })
}

/// Whether a crate of layer `from` may depend on one of layer `to` with a
/// dependency of `kind` (`normal`, `dev` or `build`).
fn dependency_allowed(from: Layer, to: Layer, kind: &str) -> bool {
    // `app`'s own integration tests run its loops over the in-process queue
    // and SQLite; its library never sees an adapter.
    edge_allowed(from, to)
        || (from == Layer::App && to == Layer::Adapter && kind == "dev")
        || (from != Layer::Domain && to == Layer::Testkit && kind == "dev")
}

/// Whether a crate of layer `from` may depend on one of layer `to`.
fn edge_allowed(from: Layer, to: Layer) -> bool {
    use Layer::*;
    match (from, to) {
        (Xtask, _) => true,
        (_, Xtask) | (Domain, _) | (Testkit, _) | (_, Testkit) => false,
        (Ports, Domain) => true,
        (Adapter | App | Inbound, Domain | Ports) => true,
        (Inbound, App) => true,
        (Bins, Domain | Ports | Adapter | App | Inbound) => true,
        _ => false,
    }
}

fn check_layers(metadata: &Metadata) -> Vec<String> {
    let mut problems = Vec::new();
    for member in &metadata.members {
        let Some(from) = layer_of(&member.name) else {
            problems.push(format!(
                "workspace crate `{}` has no layer: add it to `layer_of` in xtask/src/check_deps.rs",
                member.name
            ));
            continue;
        };
        for (dep, kind) in &member.internal_deps {
            let Some(to) = layer_of(dep) else { continue };
            if !dependency_allowed(from, to, kind) {
                problems.push(format!(
                    "`{}` may not depend on `{dep}` ({kind} dependency in {}): dependencies point inwards, \
                     domain <- ports <- adapters & app <- bins (docs/design/layering.md#dependency-direction)",
                    member.name,
                    member.manifest.display()
                ));
            }
        }
    }
    problems
}

/// Compares the packages `root` really uses (name → the path that pulled it
/// in) with its allow-list.
fn compare_with_allow_list(
    root: &str,
    used: &BTreeMap<String, Vec<String>>,
    list_name: &str,
    list: &[&str],
) -> Vec<String> {
    let mut problems = Vec::new();
    for pair in list.windows(2) {
        if pair[0] >= pair[1] {
            problems.push(format!(
                "{list_name} in {ALLOWED_FILE} must be sorted without duplicates: `{}` comes before `{}`",
                pair[0], pair[1]
            ));
        }
    }
    let listed: BTreeSet<&str> = list.iter().copied().collect();
    for (name, path) in used {
        if !listed.contains(name.as_str()) {
            problems.push(format!(
                "`{name}` is a dependency of `{root}` but not on its allow-list; pulled in by {}. \
                 If this is deliberate, add \"{name}\" to {list_name} in {ALLOWED_FILE} (keep it sorted)",
                path.join(" -> ")
            ));
        }
    }
    for name in listed {
        if !used.contains_key(name) {
            problems.push(format!(
                "`{name}` is on {list_name} in {ALLOWED_FILE} but `{root}` no longer depends on it: remove it"
            ));
        }
    }
    problems
}

/// Scans every `.rs` file under `dir`; returns the number of files and the
/// hits, as `file:line: …`.
fn scan_domain(dir: &Path, root: &Path) -> Result<(usize, Vec<String>)> {
    let mut files = Vec::new();
    crate::rust_files(dir, &mut files)?;
    let mut hits = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let shown = file.strip_prefix(root).unwrap_or(file).display().to_string();
        for hit in scan::scan(&text) {
            hits.push(format!(
                "{shown}:{}: `{}` is forbidden in domain (no I/O, processes, threads, environment, clocks or runtimes): {}",
                hit.line, hit.path, hit.text
            ));
        }
    }
    Ok((files.len(), hits))
}

/// A workspace member, as far as the checks need it.
#[derive(Debug)]
struct Member {
    name: String,
    manifest: PathBuf,
    /// `(internal crate, dependency kind)` for every declared dependency on
    /// another workspace member.
    internal_deps: Vec<(String, String)>,
}

/// The parts of `cargo metadata` the checks read.
#[derive(Debug)]
struct Metadata {
    members: Vec<Member>,
    member_ids: BTreeSet<String>,
    /// package id → (name, version)
    packages: HashMap<String, (String, String)>,
    /// package id → ids of its normal (non-dev, non-build) dependencies
    normal_deps: HashMap<String, Vec<String>>,
}

impl Metadata {
    fn load(root: &Path) -> Result<Self> {
        let output = Command::new(cargo())
            .args(["metadata", "--format-version", "1"])
            .current_dir(root)
            .output()
            .context("running cargo metadata")?;
        if !output.status.success() {
            bail!("cargo metadata failed:\n{}", String::from_utf8_lossy(&output.stderr));
        }
        let json: Value = serde_json::from_slice(&output.stdout).context("parsing cargo metadata")?;
        Self::from_json(&json)
    }

    fn from_json(json: &Value) -> Result<Self> {
        let str_of = |v: &Value, key: &str| -> Result<String> {
            v.get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .with_context(|| format!("cargo metadata: missing `{key}`"))
        };
        let array = |v: &Value, key: &str| -> Result<Vec<Value>> {
            v.get(key)
                .and_then(Value::as_array)
                .cloned()
                .with_context(|| format!("cargo metadata: missing `{key}`"))
        };

        let member_ids: BTreeSet<String> = array(json, "workspace_members")?
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        let mut packages = HashMap::new();
        let mut member_names = BTreeSet::new();
        let mut raw_members = Vec::new();
        for package in array(json, "packages")? {
            let id = str_of(&package, "id")?;
            let name = str_of(&package, "name")?;
            packages.insert(id.clone(), (name.clone(), str_of(&package, "version")?));
            if member_ids.contains(&id) {
                member_names.insert(name.clone());
                raw_members.push((name, PathBuf::from(str_of(&package, "manifest_path")?), package));
            }
        }
        let mut members = Vec::new();
        for (name, manifest, package) in raw_members {
            let mut internal_deps = Vec::new();
            for dep in array(&package, "dependencies")? {
                let dep_name = str_of(&dep, "name")?;
                let is_path = dep.get("path").is_some() && dep.get("source").is_none_or(Value::is_null);
                if is_path && member_names.contains(&dep_name) {
                    let kind = dep.get("kind").and_then(Value::as_str).unwrap_or("normal").to_owned();
                    internal_deps.push((dep_name, kind));
                }
            }
            members.push(Member {
                name,
                manifest,
                internal_deps,
            });
        }

        let resolve = json.get("resolve").context("cargo metadata: no resolve graph")?;
        let mut normal_deps = HashMap::new();
        for node in array(resolve, "nodes")? {
            let id = str_of(&node, "id")?;
            let mut deps = Vec::new();
            for dep in array(&node, "deps")? {
                let normal = dep
                    .get("dep_kinds")
                    .and_then(Value::as_array)
                    .is_some_and(|kinds| kinds.iter().any(|k| k.get("kind").is_none_or(Value::is_null)));
                if normal {
                    deps.push(str_of(&dep, "pkg")?);
                }
            }
            normal_deps.insert(id, deps);
        }
        Ok(Self {
            members,
            member_ids,
            packages,
            normal_deps,
        })
    }

    /// Every package `root` reaches through normal edges, except workspace
    /// members (their direction is the layer check's business), by name,
    /// each with the shortest path that pulls it in.
    fn normal_closure(&self, root: &str) -> Result<BTreeMap<String, Vec<String>>> {
        let root_id = self
            .member_ids
            .iter()
            .find(|id| self.packages.get(*id).is_some_and(|(name, _)| name == root))
            .with_context(|| format!("`{root}` is not a workspace member"))?;
        let label = |id: &str| {
            self.packages
                .get(id)
                .map_or_else(|| id.to_owned(), |(name, version)| format!("{name} v{version}"))
        };
        let mut parent: HashMap<&str, &str> = HashMap::new();
        let mut queue = VecDeque::from([root_id.as_str()]);
        let mut used = BTreeMap::new();
        while let Some(id) = queue.pop_front() {
            for dep in self.normal_deps.get(id).into_iter().flatten() {
                if dep == root_id || parent.contains_key(dep.as_str()) {
                    continue;
                }
                parent.insert(dep, id);
                queue.push_back(dep);
                let Some((name, _)) = self.packages.get(dep) else {
                    continue;
                };
                if self.member_ids.contains(dep) || used.contains_key(name) {
                    continue;
                }
                let mut path = vec![label(dep)];
                let mut at = id;
                while at != root_id {
                    path.push(label(at));
                    at = parent[at];
                }
                path.push(label(root_id));
                path.reverse();
                used.insert(name.clone(), path);
            }
        }
        Ok(used)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_layer_rules_are_the_design() {
        use Layer::*;
        let layers = [Domain, Ports, Adapter, Inbound, App, Bins, Xtask];
        let allowed: Vec<(Layer, Layer)> = layers
            .iter()
            .flat_map(|&a| layers.iter().map(move |&b| (a, b)))
            .filter(|&(a, b)| a != b || a == Adapter || a == Xtask)
            .filter(|&(a, b)| edge_allowed(a, b))
            .collect();
        assert_eq!(
            allowed,
            [
                (Ports, Domain),
                (Adapter, Domain),
                (Adapter, Ports),
                (Inbound, Domain),
                (Inbound, Ports),
                (Inbound, App),
                (App, Domain),
                (App, Ports),
                (Bins, Domain),
                (Bins, Ports),
                (Bins, Adapter),
                (Bins, Inbound),
                (Bins, App),
                (Xtask, Domain),
                (Xtask, Ports),
                (Xtask, Adapter),
                (Xtask, Inbound),
                (Xtask, App),
                (Xtask, Bins),
                (Xtask, Xtask),
            ]
        );
        assert!(!edge_allowed(Adapter, Adapter), "adapters never depend on each other");
        assert!(!edge_allowed(Inbound, Adapter) && !edge_allowed(Adapter, Inbound));
        assert_eq!(layer_of("flowforge-adapters-http"), Some(Inbound));
        assert!(dependency_allowed(App, Adapter, "dev"), "app's tests may use adapters");
        assert!(!dependency_allowed(App, Adapter, "normal"), "app's library never does");
        assert!(!dependency_allowed(App, Adapter, "build"));
        assert!(dependency_allowed(Adapter, Testkit, "dev"), "tests use the test kit");
        assert!(dependency_allowed(Bins, Testkit, "dev"));
        assert!(
            !dependency_allowed(Adapter, Testkit, "normal"),
            "shipped code never does"
        );
        assert!(!dependency_allowed(Domain, Testkit, "dev"), "domain stays pure");
        assert!(
            !dependency_allowed(Testkit, Ports, "normal"),
            "the kit knows no FlowForge crate"
        );
        assert_eq!(layer_of("flowforge-adapters-sqlite"), Some(Adapter));
        assert_eq!(layer_of("serde"), None);
    }

    fn used(entries: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        entries
            .iter()
            .map(|(n, p)| ((*n).to_owned(), p.iter().map(|s| (*s).to_owned()).collect()))
            .collect()
    }

    #[test]
    fn an_unlisted_package_is_named_with_its_path_and_the_list_to_edit() {
        let problems = compare_with_allow_list(
            "flowforge-domain",
            &used(&[
                ("serde", &["flowforge-domain v0.1.0", "serde v1.0.0"]),
                ("mio", &["flowforge-domain v0.1.0", "tokio v1.0.0", "mio v1.0.0"]),
            ]),
            "DOMAIN_ALLOWED",
            &["serde"],
        );
        assert_eq!(problems.len(), 1, "{problems:?}");
        let p = &problems[0];
        assert!(p.contains("`mio`"), "{p}");
        assert!(
            p.contains("flowforge-domain v0.1.0 -> tokio v1.0.0 -> mio v1.0.0"),
            "{p}"
        );
        assert!(p.contains("DOMAIN_ALLOWED in xtask/src/check_deps/allowed.rs"), "{p}");
    }

    #[test]
    fn an_unsorted_or_stale_list_fails() {
        let u = used(&[("a", &[]), ("b", &[])]);
        let problems = compare_with_allow_list("r", &u, "L", &["b", "a"]);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("must be sorted"), "{problems:?}");
        let problems = compare_with_allow_list("r", &u, "L", &["a", "a", "b"]);
        assert!(problems[0].contains("without duplicates"), "{problems:?}");
        let problems = compare_with_allow_list("r", &u, "L", &["a", "b", "c"]);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("`c` is on L") && problems[0].contains("remove it"));
        assert!(compare_with_allow_list("r", &u, "L", &["a", "b"]).is_empty());
    }

    /// A tiny `cargo metadata` document: a workspace of `domain`, `ports`
    /// and two adapters, one of which depends on the other.
    fn metadata() -> Metadata {
        let dep = |name: &str, kind: Option<&str>| json!({"name": name, "kind": kind, "path": "/w/x", "source": null});
        let pkg = |id: &str, deps: Vec<Value>| json!({"id": id, "name": id, "version": "0.1.0", "manifest_path": format!("/w/{id}/Cargo.toml"), "dependencies": deps});
        let edge = |pkg: &str, kind: Option<&str>| json!({"pkg": pkg, "dep_kinds": [{"kind": kind, "target": null}]});
        Metadata::from_json(&json!({
            "workspace_members": ["flowforge-domain", "flowforge-ports", "flowforge-adapters-a", "flowforge-adapters-b"],
            "packages": [
                pkg("flowforge-domain", vec![]),
                pkg("flowforge-ports", vec![dep("flowforge-domain", None)]),
                pkg("flowforge-adapters-a", vec![dep("flowforge-ports", None)]),
                pkg("flowforge-adapters-b", vec![dep("flowforge-adapters-a", Some("dev"))]),
                pkg("serde", vec![]), pkg("proptest", vec![]), pkg("cc", vec![]), pkg("itoa", vec![]),
            ],
            "resolve": {"nodes": [
                {"id": "flowforge-domain", "deps": [edge("serde", None), edge("proptest", Some("dev")), edge("cc", Some("build"))]},
                {"id": "flowforge-ports", "deps": [edge("flowforge-domain", None)]},
                {"id": "serde", "deps": [edge("itoa", None)]},
            ]}
        }))
        .unwrap()
    }

    #[test]
    fn the_closure_follows_only_normal_edges_and_records_the_path() {
        let m = metadata();
        let used = m.normal_closure("flowforge-domain").unwrap();
        assert_eq!(used.keys().collect::<Vec<_>>(), ["itoa", "serde"]);
        assert_eq!(used["itoa"], ["flowforge-domain v0.1.0", "serde v0.1.0", "itoa v0.1.0"]);
        // Workspace members are not listed; what they pull in is.
        let ports = m.normal_closure("flowforge-ports").unwrap();
        assert_eq!(ports.keys().collect::<Vec<_>>(), ["itoa", "serde"]);
    }

    #[test]
    fn an_adapter_depending_on_another_adapter_is_refused_even_as_a_dev_dependency() {
        let problems = check_layers(&metadata());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("`flowforge-adapters-b` may not depend on `flowforge-adapters-a` (dev dependency"),
            "{}",
            problems[0]
        );
    }
}
