//! CPU accounting of the benchmark's processes and the broker, from
//! `/proc`, so a figure can be read against what the machine spent.

use super::*;

/// CPU time (user + system) of a process so far, ms (`/proc`, USER_HZ = 100).
pub(crate) fn cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks * 10.0)
}

/// Busy and total jiffies of the whole machine (`/proc/stat`).
pub(crate) fn machine_jiffies() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let numbers: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|n| n.parse().ok())
        .collect();
    let total: f64 = numbers.iter().sum();
    let idle = numbers.get(3).copied().unwrap_or(0.0) + numbers.get(4).copied().unwrap_or(0.0);
    (total - idle, total)
}

/// The pid of the RabbitMQ node on this machine, if it runs here.
pub(crate) fn broker_pid() -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (comm.trim() == "beam.smp").then_some(pid)
    })
}

/// Which local process holds each local TCP port (`ss -tnp`).
pub(crate) fn port_owners() -> HashMap<u16, u32> {
    let Ok(out) = Command::new("ss").args(["-tnpH"]).output() else {
        return HashMap::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let local = l.split_whitespace().nth(3)?;
            let port = local.rsplit_once(':')?.1.parse().ok()?;
            let pid = l.split("pid=").nth(1)?.split(',').next()?.parse().ok()?;
            Some((port, pid))
        })
        .collect()
}

/// Where the CPU went during a scenario: each of our processes, the
/// PostgreSQL backends serving this benchmark's database (by the process
/// they serve), the broker, and how busy the whole machine was.
pub(crate) struct CpuProbe {
    groups: Vec<(String, Vec<u32>)>,
    start: Vec<(String, f64)>,
    backends: HashMap<u32, f64>,
    machine: (f64, f64),
}

impl CpuProbe {
    fn backend_pids(db: &BenchDb) -> Vec<u32> {
        Self::backends_by_client(db).into_iter().map(|(pid, _)| pid).collect()
    }

    /// The backends of this benchmark's database, each with the client
    /// port it serves.
    fn backends_by_client(db: &BenchDb) -> Vec<(u32, u16)> {
        db.sql(&format!(
            "SELECT pid || ' ' || coalesce(client_port, 0) FROM pg_stat_activity WHERE datname = '{}' \
             AND pid <> pg_backend_pid()",
            db.name
        ))
        .lines()
        .filter_map(|l| {
            let (pid, port) = l.trim().split_once(' ')?;
            Some((pid.parse().ok()?, port.parse().ok()?))
        })
        .collect()
    }

    fn group_ms(pids: &[u32]) -> f64 {
        pids.iter().filter_map(|p| cpu_ms(*p)).sum()
    }

    pub(crate) fn start(db: &BenchDb, procs: &Processes) -> Self {
        let mut groups: Vec<(String, Vec<u32>)> = vec![
            ("scheduler".into(), procs.pids("scheduler")),
            ("publisher".into(), procs.pids("publisher")),
            ("workers".into(), procs.pids("worker")),
            ("benchmark client".into(), vec![std::process::id()]),
        ];
        if let Some(pid) = broker_pid() {
            groups.push(("rabbitmq (whole node)".into(), vec![pid]));
        }
        let start = groups.iter().map(|(n, p)| (n.clone(), Self::group_ms(p))).collect();
        let backends = Self::backend_pids(db)
            .into_iter()
            .filter_map(|p| Some((p, cpu_ms(p)?)))
            .collect();
        Self {
            groups,
            start,
            backends,
            machine: machine_jiffies(),
        }
    }

    /// CPU ms per task of each part, the sum, and the machine's busy share.
    pub(crate) fn per_task(&self, db: &BenchDb, tasks: f64) -> (Value, String) {
        let mut parts = serde_json::Map::new();
        let mut text = Vec::new();
        let mut total = 0.0;
        // Each backend's CPU, attributed to the process it serves.
        let owners = port_owners();
        let mut by_client: HashMap<String, f64> = HashMap::new();
        for (pid, port) in Self::backends_by_client(db) {
            let Some(now) = cpu_ms(pid) else { continue };
            let spent = now - self.backends.get(&pid).copied().unwrap_or(0.0);
            let client = owners
                .get(&port)
                .and_then(|owner| self.groups.iter().find(|(_, pids)| pids.contains(owner)))
                .map_or("other", |(name, _)| name.as_str());
            *by_client.entry(client.to_owned()).or_default() += spent;
        }
        let mut add = |name: &str, spent: f64| {
            let per = spent / tasks;
            total += per;
            parts.insert(name.to_owned(), json!(round(per, 3)));
            text.push(format!("{name} {per:.3}"));
        };
        let mut clients: Vec<(String, f64)> = by_client.into_iter().collect();
        clients.sort_by(|a, b| a.0.cmp(&b.0));
        for (client, spent) in clients {
            add(&format!("postgres backends serving {client}"), spent);
        }
        for ((name, pids), (_, before)) in self.groups.iter().zip(&self.start) {
            add(name, Self::group_ms(pids) - before);
        }
        let (busy, all) = machine_jiffies();
        let share = (busy - self.machine.0) / (all - self.machine.1).max(1.0);
        parts.insert("total".to_owned(), json!(round(total, 3)));
        parts.insert("machine_busy_pct".to_owned(), json!(round(share * 100.0, 1)));
        let summary = format!(
            "CPU ms per task: {} (total {total:.3}, i.e. at most {:.0} tasks/s on {} cores); the whole machine \
             was {:.0} % busy meanwhile (other users included)",
            text.join(", "),
            1000.0 * std::thread::available_parallelism().map_or(2.0, |n| n.get() as f64) / total,
            std::thread::available_parallelism().map_or(2, usize::from),
            share * 100.0
        );
        (Value::Object(parts), summary)
    }
}
