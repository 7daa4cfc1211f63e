//! Live progress of a run, fed by the engine's lifecycle hooks: on a
//! terminal a progress bar (indicatif) with the tasks by state and a line
//! per retry and failure; otherwise, or with `NO_COLOR`, plain lines.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use flowforge_domain::SkipReason;
use flowforge_ports::{Observer, RunEvent, TaskEvent};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Shown {
    Running,
    Retrying,
    Succeeded,
    Failed,
    Skipped,
}

#[derive(Debug, Default)]
struct Tally {
    state: HashMap<String, Shown>,
    counts: HashMap<Shown, u64>,
}

impl Tally {
    fn set(&mut self, key: &str, to: Shown) {
        if let Some(from) = self.state.insert(key.to_owned(), to)
            && let Some(n) = self.counts.get_mut(&from)
        {
            *n = n.saturating_sub(1);
        }
        *self.counts.entry(to).or_default() += 1;
    }

    fn count(&self, s: Shown) -> u64 {
        self.counts.get(&s).copied().unwrap_or(0)
    }
}

/// The progress view of one run.
#[derive(Debug)]
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    tally: Mutex<Tally>,
    started: Instant,
}

impl Progress {
    /// A view of a run of `total` forward tasks, drawn on stderr.
    pub(crate) fn new(total: u64, quiet: bool) -> Self {
        let fancy = !quiet && std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        let bar = fancy.then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Self {
            bar,
            tally: Mutex::new(Tally::default()),
            started: Instant::now(),
        }
    }

    fn update(&self, key: &str, to: Shown) {
        let mut tally = self.tally.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        tally.set(key, to);
        if let Some(bar) = &self.bar {
            bar.set_position(tally.count(Shown::Succeeded) + tally.count(Shown::Failed) + tally.count(Shown::Skipped));
            bar.set_message(format!(
                "{} running · {} succeeded · {} retrying · {} failed",
                tally.count(Shown::Running),
                tally.count(Shown::Succeeded),
                tally.count(Shown::Retrying),
                tally.count(Shown::Failed)
            ));
        }
    }

    fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("[{:>8.2}s] {text}", self.started.elapsed().as_secs_f64()),
        }
    }

    /// Removes the bar (before the report is printed).
    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn name(e: &TaskEvent) -> String {
    match &e.compensate_for {
        Some(forward) => format!("{} (undoing {forward})", e.task_key),
        None => e.task_key.clone(),
    }
}

impl Observer for Progress {
    fn on_task_start(&self, e: &TaskEvent) {
        self.update(&e.task_key, Shown::Running);
        if self.bar.is_none() {
            self.line(&format!("start    {} (attempt {})", name(e), e.attempt));
        }
    }

    fn on_task_succeeded(&self, e: &TaskEvent) {
        self.update(&e.task_key, Shown::Succeeded);
        if self.bar.is_none() {
            self.line(&format!("done     {}", name(e)));
        }
    }

    fn on_task_failed(&self, e: &TaskEvent) {
        self.update(&e.task_key, Shown::Failed);
        self.line(&format!(
            "failed   {} after {} attempt(s): {}",
            name(e),
            e.attempt,
            e.error.as_deref().unwrap_or("")
        ));
    }

    fn on_task_retry(&self, e: &TaskEvent) {
        self.update(&e.task_key, Shown::Retrying);
        self.line(&format!(
            "retry    {} attempt {} failed: {} (next in {:.1}s)",
            name(e),
            e.attempt,
            e.error.as_deref().unwrap_or(""),
            e.retry_in.unwrap_or_default().as_secs_f64()
        ));
    }

    fn on_task_skipped(&self, e: &TaskEvent, reason: SkipReason) {
        self.update(&e.task_key, Shown::Skipped);
        self.line(&format!("skipped  {} ({reason})", name(e)));
    }

    fn on_workflow_done(&self, e: &RunEvent) {
        if self.bar.is_none() {
            self.line(&format!("run      {} {}", e.run_id, e.state));
        }
    }
}
