//! A state machine held as data: a validated table of named transitions.
//!
//! The table is checked when it is built, so a bad edit to either real
//! machine (see [`crate::state`]) fails the test run instead of surfacing as
//! a stuck run in production.

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::hash::Hash;

/// A state of some machine: a small `Copy` enum with a stable lower-case name.
pub trait State: Copy + Eq + Hash + Ord + fmt::Debug + 'static {
    /// Every state, in declaration order.
    const ALL: &'static [Self];
    /// The stable lower-case name used in storage, reports and logs.
    fn as_str(self) -> &'static str;
}

/// The name of a transition of some machine.
pub trait TransitionName: Copy + Eq + Hash + fmt::Debug + 'static {
    /// The stable snake-case name used in the event history.
    fn as_str(self) -> &'static str;
}

/// One edge of a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition<S, T> {
    /// The edge's name; unique within its machine.
    pub name: T,
    /// The state the row must be in for the edge to apply.
    pub source: S,
    /// The state the edge leaves the row in.
    pub target: S,
    /// Whether only the holder of the current lease may take this edge.
    pub requires_lease: bool,
}

/// Why a transition table was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MachineError {
    /// Two edges share a name, so the event history could not tell them apart.
    #[error("transition '{0}' is declared twice")]
    DuplicateName(&'static str),
    /// An edge leaves a state declared terminal.
    #[error("transition '{name}' leaves terminal state '{state}'")]
    EdgeOutOfTerminal {
        /// The offending edge.
        name: &'static str,
        /// The terminal state it leaves.
        state: &'static str,
    },
    /// A non-terminal state has no way out, so a row there would be stuck.
    #[error("state '{0}' is not terminal but has no outgoing transition")]
    DeadEnd(&'static str),
    /// A state that cannot be reached from the initial state.
    #[error("state '{0}' cannot be reached from the initial state")]
    Unreachable(&'static str),
    /// A retry edge that leads into a terminal state would open a
    /// generation with nothing to do.
    #[error("retry edge '{name}' leads into terminal state '{state}'")]
    RetryIntoTerminal {
        /// The offending edge.
        name: &'static str,
        /// The terminal state it leads into.
        state: &'static str,
    },
}

/// An edge that only an operator's retry takes, opening a new generation of
/// a finished row (docs/design/retry.md): the one kind of edge allowed to
/// leave a terminal state. One name joins several sources and targets, so
/// that the history names the act, not each pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryEdge<S, T> {
    /// The edge's name; unique within its machine, retry edges included.
    pub name: T,
    /// The states the row may be in.
    pub sources: Vec<S>,
    /// The states the edge may leave it in; never terminal.
    pub targets: Vec<S>,
}

/// A validated transition table.
#[derive(Debug, Clone)]
pub struct StateMachine<S: State, T: TransitionName> {
    initial: S,
    terminal: BTreeSet<S>,
    transitions: Vec<Transition<S, T>>,
    retry_edges: Vec<RetryEdge<S, T>>,
}

impl<S: State, T: TransitionName> StateMachine<S, T> {
    /// Builds a machine, refusing duplicate names, edges out of terminal
    /// states, non-terminal dead ends and unreachable states.
    pub fn new(initial: S, terminal: &[S], transitions: Vec<Transition<S, T>>) -> Result<Self, MachineError> {
        let terminal: BTreeSet<S> = terminal.iter().copied().collect();
        let mut names = HashSet::new();
        for t in &transitions {
            if !names.insert(t.name) {
                return Err(MachineError::DuplicateName(t.name.as_str()));
            }
            if terminal.contains(&t.source) {
                return Err(MachineError::EdgeOutOfTerminal {
                    name: t.name.as_str(),
                    state: t.source.as_str(),
                });
            }
        }
        for &state in S::ALL {
            if !terminal.contains(&state) && !transitions.iter().any(|t| t.source == state) {
                return Err(MachineError::DeadEnd(state.as_str()));
            }
        }
        let mut reached = BTreeSet::from([initial]);
        let mut frontier = vec![initial];
        while let Some(state) = frontier.pop() {
            for t in transitions.iter().filter(|t| t.source == state) {
                if reached.insert(t.target) {
                    frontier.push(t.target);
                }
            }
        }
        if let Some(&lost) = S::ALL.iter().find(|s| !reached.contains(s)) {
            return Err(MachineError::Unreachable(lost.as_str()));
        }
        Ok(Self {
            initial,
            terminal,
            transitions,
            retry_edges: Vec::new(),
        })
    }

    /// Adds the edges an operator's retry takes, refusing a name already
    /// used and a target that is terminal. Terminality keeps its meaning:
    /// no edge of a generation leaves a terminal state.
    pub fn with_retry_edges(mut self, edges: Vec<RetryEdge<S, T>>) -> Result<Self, MachineError> {
        for edge in &edges {
            let taken = self.transitions.iter().any(|t| t.name == edge.name)
                || self.retry_edges.iter().any(|r| r.name == edge.name);
            if taken {
                return Err(MachineError::DuplicateName(edge.name.as_str()));
            }
            if let Some(&state) = edge.targets.iter().find(|s| self.terminal.contains(s)) {
                return Err(MachineError::RetryIntoTerminal {
                    name: edge.name.as_str(),
                    state: state.as_str(),
                });
            }
            self.retry_edges.push(edge.clone());
        }
        Ok(self)
    }

    /// The state every row starts in.
    pub fn initial(&self) -> S {
        self.initial
    }

    /// Whether no edge leaves `state`.
    pub fn is_terminal(&self, state: S) -> bool {
        self.terminal.contains(&state)
    }

    /// Every edge, in table order.
    pub fn transitions(&self) -> &[Transition<S, T>] {
        &self.transitions
    }

    /// The edge called `name`, if the table has it.
    pub fn get(&self, name: T) -> Option<&Transition<S, T>> {
        self.transitions.iter().find(|t| t.name == name)
    }

    /// The edge called `name` by its string form (as stored in the history).
    pub fn get_by_str(&self, name: &str) -> Option<&Transition<S, T>> {
        self.transitions.iter().find(|t| t.name.as_str() == name)
    }

    /// The edges from `source` to `target`, in table order (several edges may
    /// join the same pair of states, e.g. `fail` and `reap_lease_final`).
    pub fn edges_between(&self, source: S, target: S) -> impl Iterator<Item = &Transition<S, T>> {
        self.transitions
            .iter()
            .filter(move |t| t.source == source && t.target == target)
    }

    /// The retry edges, in table order.
    pub fn retry_edges(&self) -> &[RetryEdge<S, T>] {
        &self.retry_edges
    }

    /// Whether the retry edge `name` may carry a row from `from` to `to`.
    pub fn is_legal_retry(&self, name: T, from: S, to: S) -> bool {
        self.retry_edges
            .iter()
            .any(|r| r.name == name && r.sources.contains(&from) && r.targets.contains(&to))
    }

    /// Whether the edge `name` may be taken from `from`.
    pub fn is_legal(&self, name: T, from: S) -> bool {
        self.get(name).is_some_and(|t| t.source == from)
    }

    /// Whether the edge `name` needs the current lease (unknown names: no).
    pub fn requires_lease(&self, name: T) -> bool {
        self.get(name).is_some_and(|t| t.requires_lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    enum Light {
        Red,
        Green,
        Off,
    }

    impl State for Light {
        const ALL: &'static [Self] = &[Light::Red, Light::Green, Light::Off];
        fn as_str(self) -> &'static str {
            match self {
                Light::Red => "red",
                Light::Green => "green",
                Light::Off => "off",
            }
        }
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    enum Flip {
        Go,
        Stop,
        Halt,
    }

    impl TransitionName for Flip {
        fn as_str(self) -> &'static str {
            match self {
                Flip::Go => "go",
                Flip::Stop => "stop",
                Flip::Halt => "halt",
            }
        }
    }

    fn edge(name: Flip, source: Light, target: Light) -> Transition<Light, Flip> {
        Transition {
            name,
            source,
            target,
            requires_lease: false,
        }
    }

    #[test]
    fn a_sound_table_builds_and_answers_lookups() {
        let m = StateMachine::new(
            Light::Red,
            &[Light::Off],
            vec![
                edge(Flip::Go, Light::Red, Light::Green),
                edge(Flip::Stop, Light::Green, Light::Red),
                edge(Flip::Halt, Light::Green, Light::Off),
            ],
        )
        .unwrap();
        assert!(m.is_legal(Flip::Go, Light::Red));
        assert!(!m.is_legal(Flip::Go, Light::Green));
        assert!(m.is_terminal(Light::Off));
        assert_eq!(m.get_by_str("halt").map(|t| t.target), Some(Light::Off));
        assert_eq!(m.edges_between(Light::Green, Light::Red).count(), 1);
    }

    #[test]
    fn duplicate_names_are_refused() {
        let err = StateMachine::new(
            Light::Red,
            &[Light::Off],
            vec![
                edge(Flip::Go, Light::Red, Light::Green),
                edge(Flip::Go, Light::Green, Light::Off),
            ],
        )
        .unwrap_err();
        assert_eq!(err, MachineError::DuplicateName("go"));
    }

    #[test]
    fn an_edge_out_of_a_terminal_state_is_refused() {
        let err = StateMachine::new(
            Light::Red,
            &[Light::Off],
            vec![
                edge(Flip::Go, Light::Red, Light::Green),
                edge(Flip::Halt, Light::Green, Light::Off),
                edge(Flip::Stop, Light::Off, Light::Red),
            ],
        )
        .unwrap_err();
        assert!(matches!(err, MachineError::EdgeOutOfTerminal { name: "stop", .. }));
    }

    #[test]
    fn a_non_terminal_dead_end_is_refused() {
        let err = StateMachine::new(
            Light::Red,
            &[Light::Off],
            vec![
                edge(Flip::Go, Light::Red, Light::Green),
                edge(Flip::Halt, Light::Red, Light::Off),
            ],
        )
        .unwrap_err();
        assert_eq!(err, MachineError::DeadEnd("green"));
    }

    fn sound() -> StateMachine<Light, Flip> {
        StateMachine::new(
            Light::Red,
            &[Light::Off],
            vec![
                edge(Flip::Go, Light::Red, Light::Green),
                edge(Flip::Halt, Light::Green, Light::Off),
            ],
        )
        .unwrap()
    }

    #[test]
    fn a_retry_edge_may_leave_a_terminal_state_but_not_enter_one() {
        let m = sound()
            .with_retry_edges(vec![RetryEdge {
                name: Flip::Stop,
                sources: vec![Light::Off],
                targets: vec![Light::Red],
            }])
            .unwrap();
        assert!(m.is_terminal(Light::Off));
        assert!(m.is_legal_retry(Flip::Stop, Light::Off, Light::Red));
        assert!(!m.is_legal_retry(Flip::Stop, Light::Off, Light::Green));
        assert!(!m.is_legal(Flip::Stop, Light::Off));
        let err = sound()
            .with_retry_edges(vec![RetryEdge {
                name: Flip::Stop,
                sources: vec![Light::Green],
                targets: vec![Light::Off],
            }])
            .unwrap_err();
        assert!(matches!(err, MachineError::RetryIntoTerminal { name: "stop", .. }));
    }

    #[test]
    fn a_retry_edge_may_not_reuse_a_name() {
        let err = sound()
            .with_retry_edges(vec![RetryEdge {
                name: Flip::Go,
                sources: vec![Light::Off],
                targets: vec![Light::Red],
            }])
            .unwrap_err();
        assert_eq!(err, MachineError::DuplicateName("go"));
    }

    #[test]
    fn an_unreachable_state_is_refused() {
        let err = StateMachine::new(
            Light::Red,
            &[Light::Off],
            vec![
                edge(Flip::Go, Light::Red, Light::Off),
                edge(Flip::Stop, Light::Green, Light::Off),
            ],
        )
        .unwrap_err();
        assert_eq!(err, MachineError::Unreachable("green"));
    }
}
