//! Integration tests of the PostgreSQL store against a real server: one
//! binary, one module per concern, one fresh database per test.

// Test code: a failed step should panic loudly with its value, and the
// harness prints skip notices and measured figures.
#![allow(clippy::unwrap_used, clippy::print_stderr, clippy::print_stdout)]

#[macro_use]
mod harness;

mod contract;
mod definitions;
mod explain;
mod migration;
mod notify;
mod pool;
mod races;
mod transitions;
