//! Schedules (docs/design/schedules.md): when a cron pattern fires in its
//! time zone, which fire times a scheduler that was away catches up or
//! counts as missed, and what a fire does when the schedule's previous run
//! is still going. Time comes in as arguments; nothing here reads a clock.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::offset::LocalResult;
use chrono::{DateTime, NaiveDateTime, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The longest a schedule's name may be, in characters.
pub const MAX_NAME_CHARS: usize = 200;

/// The longest catch-up window a schedule may have: beyond a week, a
/// scheduler that was away that long is better served by a backfill, which
/// says what it starts before it starts it.
pub const MAX_CATCHUP_WINDOW: Duration = Duration::from_secs(7 * 86_400);

/// The catch-up window when a schedule does not give one.
pub const DEFAULT_CATCHUP_WINDOW: Duration = Duration::from_secs(3_600);

/// The most fire times one backfill may start.
pub const MAX_BACKFILL: usize = 1_000;

/// How far past a wall-clock time that does not exist the next one that
/// does is looked for: the longest gap any zone has made is a day (Samoa,
/// 2011), so two days bound it with room to spare.
const LONGEST_GAP_MINUTES: i64 = 2 * 24 * 60;

/// What a fire does while a run of the same schedule is still active
/// (docs/design/schedules.md#overlap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// The fire starts nothing and is recorded `skipped_overlap`.
    #[default]
    Skip,
    /// The fire waits (`buffered`) and starts once nothing is active; a
    /// fire while one already waits is `skipped_overlap`.
    BufferOne,
    /// The fire starts its run regardless.
    Allow,
    /// The active runs are asked to cancel and the fire starts its run.
    CancelPrevious,
}

impl Overlap {
    /// Every policy, in the order the docs list them.
    pub const ALL: [Self; 4] = [Self::Skip, Self::BufferOne, Self::Allow, Self::CancelPrevious];

    /// The policy's name, as the API and the store spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::BufferOne => "buffer_one",
            Self::Allow => "allow",
            Self::CancelPrevious => "cancel_previous",
        }
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Overlap {
    type Err = ScheduleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| ScheduleError::Overlap(s.to_owned()))
    }
}

/// How one fire time ended: every fire time ends in exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FireOutcome {
    /// Its run started (at the fire, or later from the buffer).
    Started,
    /// A run of the schedule was active; nothing started.
    SkippedOverlap,
    /// It waits for the active run to end (then its run starts and it
    /// names that run, still counted here).
    Buffered,
    /// It fell before the catch-up window while no scheduler was running.
    Missed,
}

impl FireOutcome {
    /// Every outcome.
    pub const ALL: [Self; 4] = [Self::Started, Self::SkippedOverlap, Self::Buffered, Self::Missed];

    /// The outcome's name, as the API, the store and the metric spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::SkippedOverlap => "skipped_overlap",
            Self::Buffered => "buffered",
            Self::Missed => "missed",
        }
    }
}

impl fmt::Display for FireOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FireOutcome {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| format!("unknown fire outcome '{s}'"))
    }
}

/// What the store does with a due fire, decided under its lock on the
/// schedule from what it found there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Start the fire's run.
    Start,
    /// Request the cancel of the active runs, then start the fire's run.
    CancelAndStart,
    /// Record `skipped_overlap`.
    Skip,
    /// Record `buffered`; its run starts when nothing is active.
    Buffer,
}

impl Decision {
    /// The outcome the fire is recorded with.
    pub const fn outcome(self) -> FireOutcome {
        match self {
            Self::Start | Self::CancelAndStart => FireOutcome::Started,
            Self::Skip => FireOutcome::SkippedOverlap,
            Self::Buffer => FireOutcome::Buffered,
        }
    }
}

/// Decides a due fire: `active` whether a run of the schedule is pending or
/// running, `buffered` whether an earlier fire already waits in the buffer.
/// A waiting fire counts as active for every policy but `allow`: it is the
/// next run, so a later fire overlaps it.
pub const fn decide(policy: Overlap, active: bool, buffered: bool) -> Decision {
    match policy {
        Overlap::Allow => Decision::Start,
        Overlap::Skip if active || buffered => Decision::Skip,
        Overlap::BufferOne if buffered => Decision::Skip,
        Overlap::BufferOne if active => Decision::Buffer,
        Overlap::CancelPrevious if active => Decision::CancelAndStart,
        Overlap::Skip | Overlap::BufferOne | Overlap::CancelPrevious => Decision::Start,
    }
}

/// Why a schedule was refused, naming the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The name is empty, too long or holds control characters.
    #[error("name: {0}")]
    Name(String),
    /// The cron pattern does not parse.
    #[error("cron: '{pattern}' is not a cron pattern: {reason}")]
    Cron {
        /// The pattern as given.
        pattern: String,
        /// What the parser said.
        reason: String,
    },
    /// The time zone is not an IANA name.
    #[error("timezone: '{0}' is not an IANA time zone (such as Europe/Paris or UTC)")]
    TimeZone(String),
    /// Not one of the overlap policies.
    #[error("overlap: '{0}' is not a policy: use skip, buffer_one, allow or cancel_previous")]
    Overlap(String),
    /// The catch-up window is out of range.
    #[error("catchup_window: {0}")]
    CatchupWindow(String),
    /// The input is not a JSON object.
    #[error("input: {0}")]
    Input(String),
}

/// Checks a schedule's name: visible text, at most [`MAX_NAME_CHARS`].
pub fn check_name(name: &str) -> Result<(), ScheduleError> {
    if name.trim().is_empty() {
        return Err(ScheduleError::Name("must not be empty".into()));
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(ScheduleError::Name(format!("longer than {MAX_NAME_CHARS} characters")));
    }
    if let Some(c) = name.chars().find(|c| c.is_control() || *c == '/') {
        return Err(ScheduleError::Name(format!(
            "holds {c:?}, which a name may not: it is used in paths and on the command line"
        )));
    }
    Ok(())
}

/// Checks a catch-up window: from one second to [`MAX_CATCHUP_WINDOW`].
pub fn check_catchup_window(window: Duration) -> Result<(), ScheduleError> {
    if window < Duration::from_secs(1) || window > MAX_CATCHUP_WINDOW {
        return Err(ScheduleError::CatchupWindow(format!(
            "{}s is outside 1s to {}s (7 days); for older fire times use a backfill",
            window.as_secs(),
            MAX_CATCHUP_WINDOW.as_secs()
        )));
    }
    Ok(())
}

/// Checks a schedule's input: a JSON object, so the fire can add
/// `scheduled_for` and `fired_at` to it.
pub fn check_input(input: &Value) -> Result<(), ScheduleError> {
    if input.is_object() {
        Ok(())
    } else {
        Err(ScheduleError::Input(
            "must be a JSON object: each fire adds scheduled_for and fired_at to it".into(),
        ))
    }
}

/// A cron pattern read in a time zone: five fields (minute, hour, day of
/// month, month, day of week) or a nickname such as `@daily`.
#[derive(Clone)]
pub struct Cron {
    text: String,
    pattern: croner::Cron,
    zone: Tz,
}

impl fmt::Debug for Cron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cron")
            .field("pattern", &self.text)
            .field("zone", &self.zone.name())
            .finish()
    }
}

impl Cron {
    /// Reads `pattern` in the IANA zone `zone`.
    pub fn parse(pattern: &str, zone: &str) -> Result<Self, ScheduleError> {
        let parser = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build();
        let parsed = parser.parse(pattern).map_err(|e| ScheduleError::Cron {
            pattern: pattern.to_owned(),
            reason: e.to_string(),
        })?;
        let zone: Tz = zone.parse().map_err(|_| ScheduleError::TimeZone(zone.to_owned()))?;
        Ok(Self {
            text: pattern.to_owned(),
            pattern: parsed,
            zone,
        })
    }

    /// The fire times strictly after `after` and at most `until`, oldest
    /// first, at most `limit` of them.
    ///
    /// The pattern is matched on wall-clock times of the zone. A wall-clock
    /// time the zone skips (spring forward) fires once, at the first instant
    /// after the gap; one the zone repeats (fall back) fires once, at its
    /// first occurrence. Two wall-clock times that so land on one instant
    /// fire once.
    pub fn fires(&self, after: DateTime<Utc>, until: DateTime<Utc>, limit: usize) -> Vec<DateTime<Utc>> {
        let mut fires = Vec::new();
        if after >= until || limit == 0 {
            return fires;
        }
        // Wall-clock times map to instants in the same order (a repeated
        // time takes its first instant), so those before `after`'s own wall
        // time fire before `after` and the walk may start there.
        let mut wall = after.with_timezone(&self.zone).naive_local();
        let mut inclusive = true;
        let mut last = after;
        while fires.len() < limit {
            let Ok(next) = self.pattern.find_next_occurrence(&wall, inclusive) else {
                break;
            };
            wall = next;
            inclusive = false;
            let Some(at) = self.instant(next) else {
                continue;
            };
            if at > until {
                break;
            }
            if at > last {
                fires.push(at);
                last = at;
            }
        }
        fires
    }

    /// The first fire time strictly after `after`, if any within reach.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.fires(after, DateTime::<Utc>::MAX_UTC, 1).into_iter().next()
    }

    /// The instant a wall-clock time of the zone fires at.
    fn instant(&self, wall: NaiveDateTime) -> Option<DateTime<Utc>> {
        match self.zone.from_local_datetime(&wall) {
            LocalResult::Single(at) | LocalResult::Ambiguous(at, _) => Some(at.with_timezone(&Utc)),
            LocalResult::None => (1..=LONGEST_GAP_MINUTES).find_map(|m| {
                let later = wall.checked_add_signed(TimeDelta::minutes(m))?;
                match self.zone.from_local_datetime(&later) {
                    LocalResult::Single(at) | LocalResult::Ambiguous(at, _) => Some(at.with_timezone(&Utc)),
                    LocalResult::None => None,
                }
            }),
        }
    }
}

/// What a scheduler does with a schedule's fire times since its cursor.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CatchUp {
    /// Fire times before the catch-up window: recorded `missed`.
    pub missed: Vec<DateTime<Utc>>,
    /// Fire times inside it, oldest first: each fires in turn.
    pub due: Vec<DateTime<Utc>>,
}

/// Splits the fire times after `cursor` (the last one handled) and at most
/// `now` into those older than `now - window`, missed, and the rest, due;
/// at most `limit` in all, the oldest first, so a scheduler away for long
/// works through them a batch at a time.
pub fn catch_up(cron: &Cron, cursor: DateTime<Utc>, now: DateTime<Utc>, window: Duration, limit: usize) -> CatchUp {
    let window = TimeDelta::from_std(window).unwrap_or(TimeDelta::MAX);
    let horizon = now.checked_sub_signed(window).unwrap_or(DateTime::<Utc>::MIN_UTC);
    let (missed, due) = cron.fires(cursor, now, limit).into_iter().partition(|at| *at < horizon);
    CatchUp { missed, due }
}

/// Why a backfill's range was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackfillRefusal {
    /// `from` is after `to`.
    #[error("from ({from}) is after to ({to})")]
    Reversed {
        /// The range's start.
        from: DateTime<Utc>,
        /// The range's end.
        to: DateTime<Utc>,
    },
    /// `to` is after the schedule's cursor: those fire times are the
    /// scheduler's to fire (a backfilled one would stand in its way).
    #[error(
        "to ({to}) is after the last fire time the schedule has handled ({cursor}); \
         the scheduler fires what comes after it, so backfill up to {cursor} at most"
    )]
    Ahead {
        /// The range's end.
        to: DateTime<Utc>,
        /// The schedule's cursor.
        cursor: DateTime<Utc>,
    },
    /// More fire times than one backfill may start.
    #[error(
        "the range holds more than {MAX_BACKFILL} fire times, the most one backfill may start; split it into smaller ranges"
    )]
    TooMany,
}

/// The fire times a backfill from `from` to `to` (both included) of a
/// schedule whose cursor is `cursor` starts: at most [`MAX_BACKFILL`], and
/// none after the cursor, which only moves forward, so the scheduler never
/// meets a backfilled fire time.
pub fn backfill(
    cron: &Cron,
    cursor: DateTime<Utc>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<DateTime<Utc>>, BackfillRefusal> {
    if from > to {
        return Err(BackfillRefusal::Reversed { from, to });
    }
    if to > cursor {
        return Err(BackfillRefusal::Ahead { to, cursor });
    }
    let before = from
        .checked_sub_signed(TimeDelta::milliseconds(1))
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    let fires = cron.fires(before, to, MAX_BACKFILL + 1);
    if fires.len() > MAX_BACKFILL {
        return Err(BackfillRefusal::TooMany);
    }
    Ok(fires)
}

/// The input of a fire's run: the schedule's input with `scheduled_for`
/// (the fire time) and `fired_at` (when it fired), both RFC 3339 in UTC,
/// taking the place of any keys of those names.
pub fn fire_input(input: &Value, scheduled_for: DateTime<Utc>, fired_at: DateTime<Utc>) -> Value {
    let mut object = match input {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    let stamp = |at: DateTime<Utc>| Value::String(at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
    object.insert("scheduled_for".into(), stamp(scheduled_for));
    object.insert("fired_at".into(), stamp(fired_at));
    Value::Object(object)
}

#[cfg(test)]
mod tests {
    use chrono::NaiveDate;
    use proptest::prelude::*;

    use super::*;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.from_utc_datetime(
            &NaiveDate::from_ymd_opt(y, mo, d)
                .and_then(|day| day.and_hms_opt(h, mi, 0))
                .expect("a valid date"),
        )
    }

    fn cron(pattern: &str, zone: &str) -> Cron {
        Cron::parse(pattern, zone).expect("a valid schedule")
    }

    #[test]
    fn a_daily_pattern_fires_at_its_local_time() {
        let c = cron("0 3 * * *", "Europe/Paris");
        // Paris is UTC+1 in January.
        let fires = c.fires(utc(2026, 1, 1, 0, 0), utc(2026, 1, 3, 23, 0), 10);
        assert_eq!(
            fires,
            vec![utc(2026, 1, 1, 2, 0), utc(2026, 1, 2, 2, 0), utc(2026, 1, 3, 2, 0)]
        );
    }

    #[test]
    fn a_skipped_local_time_fires_once_just_after_the_gap() {
        // America/New_York springs forward on 2026-03-08: 02:00 EST becomes
        // 03:00 EDT (07:00 UTC), so 02:30 does not exist that day.
        let c = cron("30 2 * * *", "America/New_York");
        let fires = c.fires(utc(2026, 3, 7, 0, 0), utc(2026, 3, 9, 12, 0), 10);
        assert_eq!(
            fires,
            vec![utc(2026, 3, 7, 7, 30), utc(2026, 3, 8, 7, 0), utc(2026, 3, 9, 6, 30)]
        );
    }

    #[test]
    fn times_inside_the_gap_and_its_end_fire_once() {
        let c = cron("*/30 * * * *", "America/New_York");
        let fires = c.fires(utc(2026, 3, 8, 6, 0), utc(2026, 3, 8, 8, 0), 10);
        // 01:00, 01:30 EST; 02:00, 02:30 skipped and 03:00 EDT all at 07:00
        // UTC; then 03:30 EDT, 04:00 EDT.
        assert_eq!(
            fires,
            vec![
                utc(2026, 3, 8, 6, 0) + TimeDelta::minutes(30),
                utc(2026, 3, 8, 7, 0),
                utc(2026, 3, 8, 7, 30),
                utc(2026, 3, 8, 8, 0),
            ]
        );
    }

    #[test]
    fn a_repeated_local_time_fires_once_at_its_first_occurrence() {
        // America/New_York falls back on 2026-11-01: 02:00 EDT becomes
        // 01:00 EST, so 01:30 happens at 05:30 and at 06:30 UTC.
        let c = cron("30 1 * * *", "America/New_York");
        let fires = c.fires(utc(2026, 10, 31, 12, 0), utc(2026, 11, 2, 12, 0), 10);
        assert_eq!(fires, vec![utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)]);
        // Also when the walk starts inside the repeated hour, after the
        // first occurrence.
        let fires = c.fires(utc(2026, 11, 1, 5, 45), utc(2026, 11, 1, 12, 0), 10);
        assert_eq!(fires, Vec::<DateTime<Utc>>::new());
    }

    #[test]
    fn an_hourly_pattern_does_not_fire_the_repeated_hour_twice() {
        let c = cron("0 * * * *", "America/New_York");
        let fires = c.fires(utc(2026, 11, 1, 4, 30), utc(2026, 11, 1, 7, 30), 10);
        // 01:00 EDT (05:00 UTC); 01:00 EST (06:00 UTC) is the same wall
        // time again; 02:00 EST is 07:00 UTC.
        assert_eq!(fires, vec![utc(2026, 11, 1, 5, 0), utc(2026, 11, 1, 7, 0)]);
    }

    #[test]
    fn bad_patterns_and_zones_say_which_field() {
        let e = Cron::parse("61 * * * *", "UTC").unwrap_err();
        assert!(e.to_string().starts_with("cron: '61 * * * *'"), "{e}");
        let e = Cron::parse("0 0 * * * *", "UTC").unwrap_err();
        assert!(matches!(e, ScheduleError::Cron { .. }), "{e}");
        let e = Cron::parse("0 3 * * *", "Mars/Olympus").unwrap_err();
        assert_eq!(e, ScheduleError::TimeZone("Mars/Olympus".into()));
        assert!(Cron::parse("@daily", "UTC").is_ok());
    }

    #[test]
    fn catch_up_counts_fires_before_the_window_as_missed() {
        let c = cron("0 * * * *", "UTC");
        // Away from 09:00 to 12:10 with a one-hour window.
        let plan = catch_up(
            &c,
            utc(2026, 6, 1, 9, 0),
            utc(2026, 6, 1, 12, 10),
            Duration::from_secs(3600),
            100,
        );
        assert_eq!(plan.missed, vec![utc(2026, 6, 1, 10, 0), utc(2026, 6, 1, 11, 0)]);
        assert_eq!(plan.due, vec![utc(2026, 6, 1, 12, 0)]);
    }

    #[test]
    fn overlap_policies_decide() {
        use Decision::*;
        for (policy, idle, active, waiting) in [
            (Overlap::Skip, Start, Skip, Skip),
            (Overlap::BufferOne, Start, Buffer, Skip),
            (Overlap::Allow, Start, Start, Start),
            (Overlap::CancelPrevious, Start, CancelAndStart, CancelAndStart),
        ] {
            assert_eq!(decide(policy, false, false), idle, "{policy} idle");
            assert_eq!(decide(policy, true, false), active, "{policy} active");
            assert_eq!(decide(policy, true, true), waiting, "{policy} active with one waiting");
        }
        for policy in Overlap::ALL {
            assert_eq!(policy.as_str().parse::<Overlap>(), Ok(policy));
        }
        assert!("sometimes".parse::<Overlap>().is_err());
    }

    #[test]
    fn a_backfill_includes_both_ends_and_refuses_what_it_should_not_start() {
        let c = cron("0 * * * *", "UTC");
        let cursor = utc(2026, 6, 1, 12, 0);
        let fires = backfill(&c, cursor, utc(2026, 6, 1, 9, 0), utc(2026, 6, 1, 11, 0)).expect("three");
        assert_eq!(
            fires,
            vec![utc(2026, 6, 1, 9, 0), utc(2026, 6, 1, 10, 0), utc(2026, 6, 1, 11, 0)]
        );
        let every_minute = cron("* * * * *", "UTC");
        assert_eq!(
            backfill(&every_minute, cursor, utc(2026, 5, 1, 0, 0), utc(2026, 6, 1, 0, 0)),
            Err(BackfillRefusal::TooMany)
        );
        // Any range, however wide, is refused without walking all of it.
        assert_eq!(
            backfill(&every_minute, cursor, DateTime::<Utc>::MIN_UTC, cursor),
            Err(BackfillRefusal::TooMany)
        );
        assert!(matches!(
            backfill(&c, cursor, cursor, cursor - TimeDelta::hours(1)),
            Err(BackfillRefusal::Reversed { .. })
        ));
        let ahead = backfill(&c, cursor, cursor, cursor + TimeDelta::hours(1));
        assert!(matches!(ahead, Err(BackfillRefusal::Ahead { .. })), "{ahead:?}");
    }

    #[test]
    fn the_fire_input_carries_both_times() {
        let input = serde_json::json!({"region": "eu", "fired_at": "mine"});
        let got = fire_input(
            &input,
            utc(2026, 6, 1, 9, 0),
            utc(2026, 6, 1, 9, 0) + TimeDelta::seconds(2),
        );
        assert_eq!(
            got,
            serde_json::json!({
                "region": "eu",
                "scheduled_for": "2026-06-01T09:00:00.000Z",
                "fired_at": "2026-06-01T09:00:02.000Z",
            })
        );
        assert!(check_input(&serde_json::json!([1])).is_err());
        assert!(check_name("nightly etl").is_ok());
        assert!(check_name(" ").is_err());
        assert!(check_name("a/b").is_err());
        assert!(check_catchup_window(Duration::ZERO).is_err());
        assert!(check_catchup_window(Duration::from_secs(3600)).is_ok());
    }

    fn zones() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "UTC",
            "America/New_York",
            "Europe/Paris",
            "Australia/Lord_Howe",
            "Asia/Kolkata",
        ])
    }

    fn patterns() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "*/15 * * * *",
            "0 * * * *",
            "30 1 * * *",
            "30 2 * * *",
            "0 0 * * 0",
            "45 23 L * *",
            "0 3 1,15 * *",
        ])
    }

    proptest! {
        /// Fire times strictly increase, lie inside the window asked for,
        /// and a walk split anywhere gives the same times as one walk.
        #[test]
        fn fires_are_increasing_and_a_split_walk_agrees(
            zone in zones(),
            pattern in patterns(),
            start in 0i64..(4 * 365 * 24 * 60),
            span in 1i64..(20 * 24 * 60),
            split in 0i64..(20 * 24 * 60),
        ) {
            let c = cron(pattern, zone);
            let from = utc(2025, 1, 1, 0, 0) + TimeDelta::minutes(start);
            let to = from + TimeDelta::minutes(span);
            let whole = c.fires(from, to, 10_000);
            prop_assert!(whole.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(whole.iter().all(|at| *at > from && *at <= to));
            let mid = from + TimeDelta::minutes(split.min(span));
            let mut parts = c.fires(from, mid, 10_000);
            parts.extend(c.fires(mid, to, 10_000));
            prop_assert_eq!(whole, parts);
        }

        /// Catch-up loses no fire time: missed then due is every fire time,
        /// and each missed one is older than each due one.
        #[test]
        fn catch_up_partitions_the_fire_times(
            zone in zones(),
            pattern in patterns(),
            away in 1i64..(3 * 24 * 60),
            window in 1u64..(24 * 3600),
        ) {
            let c = cron(pattern, zone);
            let cursor = utc(2026, 3, 1, 0, 0);
            let now = cursor + TimeDelta::minutes(away);
            let plan = catch_up(&c, cursor, now, Duration::from_secs(window), 100_000);
            let mut all = plan.missed.clone();
            all.extend(plan.due.iter().copied());
            prop_assert_eq!(all, c.fires(cursor, now, 100_000));
            if let (Some(m), Some(d)) = (plan.missed.last(), plan.due.first()) {
                prop_assert!(m < d);
            }
        }
    }
}
