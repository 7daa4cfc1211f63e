//! `flowforge schedules create|list|pause|resume|delete|backfill`: runs
//! started on a clock (docs/design/schedules.md). `flowforge server` (on
//! SQLite) and `flowforge scheduler` (distributed) fire them.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use flowforge::Service;
use flowforge_adapters_http::views::ScheduleBody;
use flowforge_app::schedules::{BackfillOutcome, ScheduleRequest, next_fire};
use flowforge_domain::schedule::Overlap;
use flowforge_ports::Store;
use flowforge_ports::store::ScheduleView;

use super::common::{parse_duration, parse_input};
use super::runs::Output;
use super::store::with_store;
use super::{Exit, Global, fail, print_report};

/// `flowforge schedules …`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Create a schedule: from now on, each fire time of CRON in TIMEZONE
    /// starts a run of the workflow whose input is INPUT plus
    /// `scheduled_for` and `fired_at`.
    // `--version` names the workflow's version here, not the binary's.
    #[command(disable_version_flag = true)]
    Create {
        /// Its unique name.
        name: String,
        /// The published workflow it starts.
        #[arg(long)]
        workflow: String,
        /// The version it starts (default: the latest at each fire).
        #[arg(long)]
        version: Option<u32>,
        /// Five cron fields (minute hour day-of-month month day-of-week),
        /// or @hourly, @daily, @weekly, @monthly, @yearly.
        #[arg(long)]
        cron: String,
        /// The IANA time zone the pattern is read in.
        #[arg(long, default_value = "UTC")]
        timezone: String,
        /// The run input: a JSON object, inline or `@file`.
        #[arg(long)]
        input: Option<String>,
        /// What a fire does while a run of this schedule is still active.
        #[arg(long, value_parser = parse_overlap, default_value = "skip")]
        overlap: Overlap,
        /// After a scheduler was away, the fire times this close to now
        /// fire late; older ones are counted as missed (s, m, h or d).
        #[arg(long, value_parser = parse_duration, default_value = "1h", value_name = "DURATION")]
        catchup_window: Duration,
    },
    /// Every schedule, with its next fire time and the outcome counts of
    /// its fire times so far.
    List {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Stop firing a schedule (its runs go on).
    Pause {
        /// The schedule's name.
        name: String,
    },
    /// Fire a paused schedule again, from now on: the fire times of the
    /// pause are neither fired nor counted.
    Resume {
        /// The schedule's name.
        name: String,
    },
    /// Delete a schedule and its fire records (its runs stay).
    Delete {
        /// The schedule's name.
        name: String,
    },
    /// Start a run for each fire time from --from to --to (both included,
    /// at most 1000, none after the last fire time the schedule handled)
    /// that has no outcome yet, whatever the overlap policy.
    Backfill {
        /// The schedule's name.
        name: String,
        /// The first instant, RFC 3339 (`2026-06-01T00:00:00Z`).
        #[arg(long, value_parser = parse_time)]
        from: DateTime<Utc>,
        /// The last instant, RFC 3339.
        #[arg(long, value_parser = parse_time)]
        to: DateTime<Utc>,
        /// Print the fire times and what would happen; start nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

fn parse_overlap(s: &str) -> Result<Overlap, String> {
    s.parse()
        .map_err(|e: flowforge_domain::schedule::ScheduleError| e.to_string())
}

fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{s:?} is not an RFC 3339 time such as 2026-06-01T00:00:00Z: {e}"))
}

fn stamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Runs a `schedules` subcommand.
pub(crate) async fn run(global: &Global, command: Command) -> anyhow::Result<Exit> {
    with_store!(global, |store| {
        let service = Service::new(store).with_limits(global.limits());
        execute(&service, command).await
    })
}

async fn execute<S: Store>(service: &Service<S>, command: Command) -> anyhow::Result<Exit> {
    match command {
        Command::Create {
            name,
            workflow,
            version,
            cron,
            timezone,
            input,
            overlap,
            catchup_window,
        } => {
            let input = match parse_input(input.as_deref()) {
                Ok(v) => v,
                Err(exit) => return Ok(exit),
            };
            let request = ScheduleRequest {
                name,
                workflow,
                version,
                cron,
                timezone: Some(timezone),
                input: Some(input),
                overlap: Some(overlap),
                catchup_window: Some(catchup_window),
            };
            match service.create_schedule(request).await {
                Ok(view) => {
                    let next = next_fire(&view).map_or_else(|| "never".to_owned(), stamp);
                    eprintln!("schedule '{}' created; it next fires at {next}", view.spec.name);
                    Ok(Exit::Ok)
                }
                Err(e) => Ok(fail(&e)),
            }
        }
        Command::List { output } => match service.schedules().await {
            Ok(schedules) => {
                print_report(&render_list(&schedules, output)?)?;
                Ok(Exit::Ok)
            }
            Err(e) => Ok(fail(&e)),
        },
        Command::Pause { name } => switch(service, &name, true).await,
        Command::Resume { name } => switch(service, &name, false).await,
        Command::Delete { name } => match service.delete_schedule(&name).await {
            Ok(()) => {
                eprintln!("schedule '{name}' deleted");
                Ok(Exit::Ok)
            }
            Err(e) => Ok(fail(&e)),
        },
        Command::Backfill {
            name,
            from,
            to,
            dry_run,
        } => match service.backfill(&name, from, to, dry_run).await {
            Ok(fires) => {
                let mut text = String::new();
                for fire in &fires {
                    let what = match fire.outcome {
                        BackfillOutcome::WouldStart => "would start a run".to_owned(),
                        BackfillOutcome::Started(run) => format!("started run {run}"),
                        BackfillOutcome::AlreadyRecorded(outcome) => format!("already {outcome}; nothing started"),
                    };
                    text.push_str(&format!("{}  {what}\n", stamp(fire.at)));
                }
                print_report(&text)?;
                let started = fires
                    .iter()
                    .filter(|f| matches!(f.outcome, BackfillOutcome::Started(_)))
                    .count();
                if dry_run {
                    eprintln!("dry run: {} fire time(s); nothing started", fires.len());
                } else {
                    eprintln!("{started} run(s) started for {} fire time(s)", fires.len());
                }
                Ok(Exit::Ok)
            }
            Err(e) => Ok(fail(&e)),
        },
    }
}

async fn switch<S: Store>(service: &Service<S>, name: &str, pause: bool) -> anyhow::Result<Exit> {
    match service.pause_schedule(name, pause).await {
        Ok(view) => {
            if pause {
                eprintln!("schedule '{name}' paused");
            } else {
                let next = next_fire(&view).map_or_else(|| "never".to_owned(), stamp);
                eprintln!("schedule '{name}' resumed; it next fires at {next}");
            }
            Ok(Exit::Ok)
        }
        Err(e) => Ok(fail(&e)),
    }
}

fn render_list(schedules: &[ScheduleView], output: Output) -> anyhow::Result<String> {
    if output == Output::Json {
        // The API's own body, so the two cannot drift apart.
        let rows: Vec<ScheduleBody> = schedules.iter().map(ScheduleBody::from).collect();
        return Ok(format!("{}\n", serde_json::to_string_pretty(&rows)?));
    }
    let mut text = format!(
        "{:<20} {:<16} {:<14} {:<18} {:<16} {:<21} {:>7} {:>7} {:>8} {:>6}\n",
        "NAME", "WORKFLOW", "CRON", "TIMEZONE", "OVERLAP", "NEXT", "STARTED", "SKIPPED", "BUFFERED", "MISSED"
    );
    for s in schedules {
        let workflow = match s.spec.version {
            Some(v) => format!("{} v{v}", s.spec.workflow),
            None => s.spec.workflow.clone(),
        };
        let next = if s.paused {
            "paused".to_owned()
        } else {
            next_fire(s).map_or_else(|| "never".to_owned(), stamp)
        };
        text.push_str(&format!(
            "{:<20} {:<16} {:<14} {:<18} {:<16} {:<21} {:>7} {:>7} {:>8} {:>6}\n",
            s.spec.name,
            workflow,
            s.spec.cron,
            s.spec.timezone,
            s.spec.overlap.as_str(),
            next,
            s.counts.started,
            s.counts.skipped_overlap,
            s.counts.buffered,
            s.counts.missed,
        ));
    }
    Ok(text)
}
