//! The dependency graph of a workflow's forward tasks and the questions the
//! scheduler asks of it.
//!
//! Nodes are numbered in ascending key order, so "ties by ascending key"
//! is simply "ties by ascending node number" everywhere. Every walk is
//! iterative: a generated 100 000-task chain must not overflow the stack.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};

/// Why a set of tasks and edges is not a DAG.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// Two tasks share a key.
    #[error("duplicate task key '{0}'")]
    DuplicateKey(String),
    /// A task depends on a key no task has.
    #[error("task '{task}' depends on unknown task '{dependency}'")]
    UnknownDependency {
        /// The dependent task.
        task: String,
        /// The missing key.
        dependency: String,
    },
    /// A task lists itself in `depends_on`.
    #[error("task '{0}' depends on itself")]
    SelfDependency(String),
    /// A task lists the same dependency twice.
    #[error("task '{task}' lists dependency '{dependency}' more than once")]
    DuplicateDependency {
        /// The task whose `depends_on` repeats.
        task: String,
        /// The repeated key.
        dependency: String,
    },
    /// The edges form a cycle; the path starts and ends at its smallest key.
    #[error("dependency cycle detected: {}", .0.join(" -> "))]
    Cycle(Vec<String>),
}

impl GraphError {
    /// The task the error is about (for a cycle: where its path starts).
    pub fn task(&self) -> &str {
        match self {
            Self::DuplicateKey(task) | Self::SelfDependency(task) => task,
            Self::UnknownDependency { task, .. } | Self::DuplicateDependency { task, .. } => task,
            Self::Cycle(path) => path.first().map_or("", String::as_str),
        }
    }
}

/// A validated DAG over task keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DependencyGraph {
    /// Keys in ascending order; a node's number is its index here.
    keys: Vec<String>,
    index: HashMap<String, usize>,
    /// `deps[n]`: the nodes `n` depends on, ascending.
    deps: Vec<Vec<usize>>,
    /// `dependents[n]`: the nodes that depend on `n`, ascending.
    dependents: Vec<Vec<usize>>,
}

impl DependencyGraph {
    /// Builds the graph from `(key, depends_on)` pairs, refusing duplicate
    /// keys, unknown, repeated or self dependencies, and cycles. Runs in
    /// O((V + E) log V) time and O(V + E) space without recursion.
    pub fn new<K, D, I>(tasks: I) -> Result<Self, GraphError>
    where
        I: IntoIterator<Item = (K, D)>,
        K: Into<String>,
        D: IntoIterator,
        D::Item: Into<String>,
    {
        let mut raw: Vec<(String, Vec<String>)> = tasks
            .into_iter()
            .map(|(k, d)| (k.into(), d.into_iter().map(Into::into).collect()))
            .collect();
        raw.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(w) = raw.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(GraphError::DuplicateKey(w[0].0.clone()));
        }
        let index: HashMap<String, usize> = raw.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        let mut deps = Vec::with_capacity(raw.len());
        let mut dependents = vec![Vec::new(); raw.len()];
        for (node, (key, names)) in raw.iter().enumerate() {
            let mut mine = Vec::with_capacity(names.len());
            for name in names {
                let Some(&dep) = index.get(name) else {
                    return Err(GraphError::UnknownDependency {
                        task: key.clone(),
                        dependency: name.clone(),
                    });
                };
                if dep == node {
                    return Err(GraphError::SelfDependency(key.clone()));
                }
                mine.push(dep);
            }
            mine.sort_unstable();
            if let Some(w) = mine.windows(2).find(|w| w[0] == w[1]) {
                return Err(GraphError::DuplicateDependency {
                    task: key.clone(),
                    dependency: raw[w[0]].0.clone(),
                });
            }
            for &dep in &mine {
                dependents[dep].push(node);
            }
            deps.push(mine);
        }
        let graph = Self {
            keys: raw.into_iter().map(|(k, _)| k).collect(),
            index,
            deps,
            dependents,
        };
        if let Some(cycle) = graph.find_cycle() {
            return Err(GraphError::Cycle(cycle));
        }
        Ok(graph)
    }

    /// How many tasks the graph holds.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the graph has no tasks.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether `key` is a task of this graph.
    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Every key, ascending.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> {
        self.keys.iter().map(String::as_str)
    }

    /// The direct dependencies of `key`, ascending (empty for an unknown key).
    pub fn dependencies_of(&self, key: &str) -> impl Iterator<Item = &str> {
        self.neighbours(key, &self.deps)
    }

    /// The direct dependents of `key`, ascending (empty for an unknown key).
    pub fn dependents_of(&self, key: &str) -> impl Iterator<Item = &str> {
        self.neighbours(key, &self.dependents)
    }

    fn neighbours<'a>(&'a self, key: &str, adj: &'a [Vec<usize>]) -> impl Iterator<Item = &'a str> {
        self.index
            .get(key)
            .map(|&n| adj[n].as_slice())
            .unwrap_or_default()
            .iter()
            .map(|&m| self.keys[m].as_str())
    }

    /// Every key such that each dependency comes before its dependents;
    /// among the tasks available at each step, the smallest key first.
    pub fn topological_order(&self) -> Vec<&str> {
        let mut waiting: Vec<usize> = self.deps.iter().map(Vec::len).collect();
        let mut heap: BinaryHeap<Reverse<usize>> = (0..self.len()).filter(|&n| waiting[n] == 0).map(Reverse).collect();
        let mut order = Vec::with_capacity(self.len());
        while let Some(Reverse(n)) = heap.pop() {
            order.push(self.keys[n].as_str());
            for &d in &self.dependents[n] {
                waiting[d] -= 1;
                if waiting[d] == 0 {
                    heap.push(Reverse(d));
                }
            }
        }
        order
    }

    /// Tasks grouped by depth: level 0 has no dependencies, level k holds
    /// the tasks whose longest chain of dependencies has k edges. Each
    /// level is sorted by key.
    pub fn levels(&self) -> Vec<Vec<&str>> {
        let mut depth = vec![0usize; self.len()];
        let mut levels: Vec<Vec<&str>> = Vec::new();
        for key in self.topological_order() {
            let n = self.index[key];
            let d = self.deps[n].iter().map(|&p| depth[p] + 1).max().unwrap_or(0);
            depth[n] = d;
            if levels.len() <= d {
                levels.resize_with(d + 1, Vec::new);
            }
            levels[d].push(key);
        }
        for level in &mut levels {
            level.sort_unstable();
        }
        levels
    }

    /// The tasks not in `completed` whose dependencies are all in
    /// `completed`, ascending.
    pub fn ready_tasks(&self, completed: &BTreeSet<&str>) -> Vec<&str> {
        (0..self.len())
            .filter(|&n| !completed.contains(self.keys[n].as_str()))
            .filter(|&n| self.deps[n].iter().all(|&d| completed.contains(self.keys[d].as_str())))
            .map(|n| self.keys[n].as_str())
            .collect()
    }

    /// Everything `key` waits on, directly or not, ascending.
    pub fn transitive_dependencies_of(&self, key: &str) -> Vec<&str> {
        self.reach(key, &self.deps)
    }

    /// Everything that waits on `key`, directly or not, ascending.
    pub fn transitive_dependents_of(&self, key: &str) -> Vec<&str> {
        self.reach(key, &self.dependents)
    }

    fn reach(&self, key: &str, adj: &[Vec<usize>]) -> Vec<&str> {
        let Some(&start) = self.index.get(key) else {
            return Vec::new();
        };
        let mut seen = vec![false; self.len()];
        let mut stack = vec![start];
        while let Some(n) = stack.pop() {
            for &m in &adj[n] {
                if !seen[m] {
                    seen[m] = true;
                    stack.push(m);
                }
            }
        }
        (0..self.len())
            .filter(|&n| seen[n])
            .map(|n| self.keys[n].as_str())
            .collect()
    }

    /// Depth-first search over `depends_on` edges with an explicit stack of
    /// `(node, next child index)` frames. Returns the first cycle found, as
    /// a closed path rotated to start at its smallest key.
    fn find_cycle(&self) -> Option<Vec<String>> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            OnPath,
            Done,
        }
        let mut mark = vec![Mark::New; self.len()];
        let mut stack: Vec<(usize, usize)> = Vec::new();
        for root in 0..self.len() {
            if mark[root] != Mark::New {
                continue;
            }
            mark[root] = Mark::OnPath;
            stack.push((root, 0));
            while let Some(frame) = stack.last_mut() {
                let (node, child) = *frame;
                if let Some(&next) = self.deps[node].get(child) {
                    frame.1 += 1;
                    match mark[next] {
                        Mark::New => {
                            mark[next] = Mark::OnPath;
                            stack.push((next, 0));
                        }
                        Mark::OnPath => {
                            let from = stack.iter().position(|&(n, _)| n == next)?;
                            let mut cycle: Vec<usize> = stack[from..].iter().map(|&(n, _)| n).collect();
                            let low = (0..cycle.len()).min_by_key(|&i| cycle[i]).unwrap_or(0);
                            cycle.rotate_left(low);
                            cycle.push(cycle[0]);
                            return Some(cycle.into_iter().map(|n| self.keys[n].clone()).collect());
                        }
                        Mark::Done => {}
                    }
                } else {
                    mark[node] = Mark::Done;
                    stack.pop();
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn graph(edges: &[(&str, &[&str])]) -> Result<DependencyGraph, GraphError> {
        DependencyGraph::new(edges.iter().map(|(k, d)| (*k, d.iter().copied())))
    }

    #[test]
    fn a_diamond_orders_and_levels_by_key() {
        let g = graph(&[("d", &["b", "c"]), ("c", &["a"]), ("b", &["a"]), ("a", &[])]).unwrap();
        assert_eq!(g.topological_order(), ["a", "b", "c", "d"]);
        assert_eq!(g.levels(), vec![vec!["a"], vec!["b", "c"], vec!["d"]]);
        assert_eq!(g.transitive_dependencies_of("d"), ["a", "b", "c"]);
        assert_eq!(g.transitive_dependents_of("a"), ["b", "c", "d"]);
        assert_eq!(g.dependents_of("a").collect::<Vec<_>>(), ["b", "c"]);
        let done = BTreeSet::from(["a", "b"]);
        assert_eq!(g.ready_tasks(&done), ["c"]);
        assert_eq!(g.ready_tasks(&BTreeSet::new()), ["a"]);
    }

    #[test]
    fn levels_use_the_longest_chain() {
        let g = graph(&[("a", &[]), ("b", &["a"]), ("c", &["a", "b"])]).unwrap();
        assert_eq!(g.levels(), vec![vec!["a"], vec!["b"], vec!["c"]]);
    }

    #[test]
    fn a_two_cycle_is_reported_as_a_path() {
        let err = graph(&[("a", &["b"]), ("b", &["a"])]).unwrap_err();
        assert_eq!(err.to_string(), "dependency cycle detected: a -> b -> a");
        assert_eq!(err.task(), "a");
    }

    #[test]
    fn graph_errors_name_the_task() {
        assert_eq!(
            graph(&[("load", &["extract"])]).unwrap_err().to_string(),
            "task 'load' depends on unknown task 'extract'"
        );
        assert_eq!(
            graph(&[("a", &["a"])]).unwrap_err(),
            GraphError::SelfDependency("a".into())
        );
        assert_eq!(
            graph(&[("a", &[]), ("a", &[])]).unwrap_err(),
            GraphError::DuplicateKey("a".into())
        );
        assert!(matches!(
            graph(&[("a", &[]), ("b", &["a", "a"])]).unwrap_err(),
            GraphError::DuplicateDependency { .. }
        ));
    }

    fn chain(n: usize) -> Vec<(String, Vec<String>)> {
        (0..n)
            .map(|i| {
                let deps = if i == 0 { vec![] } else { vec![format!("t{:06}", i - 1)] };
                (format!("t{i:06}"), deps)
            })
            .collect()
    }

    #[test]
    fn a_100_000_node_chain_is_ordered_without_recursion() {
        let g = DependencyGraph::new(chain(100_000)).unwrap();
        let order = g.topological_order();
        assert_eq!(order.len(), 100_000);
        assert_eq!(order[0], "t000000");
        assert_eq!(order[99_999], "t099999");
        assert_eq!(g.levels().len(), 100_000);
        assert_eq!(g.transitive_dependencies_of("t099999").len(), 99_999);
    }

    #[test]
    fn a_cycle_at_the_far_end_of_a_100_000_node_chain_is_found() {
        let mut tasks = chain(100_000);
        tasks[99_998].1.push("t099999".into());
        let err = DependencyGraph::new(tasks).unwrap_err();
        assert_eq!(
            err,
            GraphError::Cycle(vec!["t099998".into(), "t099999".into(), "t099998".into()])
        );
    }

    /// A random DAG: task i may depend only on tasks with a smaller index,
    /// so the edges can never form a cycle.
    fn random_dag() -> impl Strategy<Value = Vec<(String, Vec<String>)>> {
        (2usize..40).prop_flat_map(|n| {
            prop::collection::vec(prop::collection::vec(any::<prop::sample::Index>(), 0..4), n).prop_map(move |picks| {
                picks
                    .into_iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let mut deps: Vec<String> = if i == 0 {
                            vec![]
                        } else {
                            p.iter().map(|ix| format!("k{}", ix.index(i))).collect()
                        };
                        deps.sort();
                        deps.dedup();
                        (format!("k{i}"), deps)
                    })
                    .collect()
            })
        })
    }

    proptest! {
        #[test]
        fn topological_order_respects_every_edge_and_ignores_declaration_order(
            tasks in random_dag(),
            seed in any::<u64>(),
        ) {
            let g = DependencyGraph::new(tasks.clone()).unwrap();
            let order = g.topological_order();
            prop_assert_eq!(order.len(), tasks.len());
            let pos: HashMap<&str, usize> = order.iter().enumerate().map(|(i, k)| (*k, i)).collect();
            for (key, deps) in &tasks {
                for d in deps {
                    prop_assert!(pos[d.as_str()] < pos[key.as_str()]);
                }
            }
            let mut shuffled = tasks.clone();
            let mut s = seed;
            for i in (1..shuffled.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                shuffled.swap(i, (s >> 33) as usize % (i + 1));
            }
            let again = DependencyGraph::new(shuffled).unwrap();
            prop_assert_eq!(again.topological_order(), order);
            prop_assert_eq!(again.levels(), g.levels());
        }

        #[test]
        fn a_planted_cycle_is_found_and_its_path_is_real(
            tasks in random_dag(),
            a in any::<prop::sample::Index>(),
            b in any::<prop::sample::Index>(),
        ) {
            let n = tasks.len();
            let (lo, hi) = {
                let (x, y) = (a.index(n), b.index(n));
                if x == y { (x.saturating_sub(1), x.max(1)) } else { (x.min(y), x.max(y)) }
            };
            prop_assume!(lo != hi);
            // Make `lo` reach `hi` (hi depends on ... lo) and then `lo` depend on `hi`.
            let mut tasks = tasks;
            if !tasks[hi].1.contains(&format!("k{lo}")) {
                tasks[hi].1.push(format!("k{lo}"));
            }
            tasks[lo].1.push(format!("k{hi}"));
            let edges: HashMap<String, Vec<String>> = tasks.iter().cloned().collect();
            match DependencyGraph::new(tasks) {
                Err(GraphError::Cycle(path)) => {
                    prop_assert!(path.len() >= 3);
                    prop_assert_eq!(path.first(), path.last());
                    for w in path.windows(2) {
                        prop_assert!(edges[&w[0]].contains(&w[1]), "{} does not depend on {}", w[0], w[1]);
                    }
                }
                other => prop_assert!(false, "expected a cycle, got {:?}", other),
            }
        }
    }
}
