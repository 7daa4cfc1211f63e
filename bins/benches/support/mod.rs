//! Shared by the benchmarks and the fault matrix (included by each with
//! `mod support;`): the `flowforge` processes they start, the workflow
//! definitions, the PostgreSQL server and throw-away databases (through
//! `psql`, since this crate links no SQL client of its own), the pgbench
//! conditional-UPDATE ceiling, a minimal AMQP client that deletes the
//! queues and exchanges a benchmark declared, and statistics.
//!
//! Where the server is: `PGHOST` (default 127.0.0.1), `PGPORT` (5432),
//! `PGUSER` (postgres; trust or `PGPASSWORD` auth), read by `psql` and
//! `pgbench` as well.

#![allow(dead_code, clippy::print_stderr)]

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use flowforge::{WorkflowDefinition, parse_definition};
use flowforge_ports::{DefinitionStore, WorkflowId};
use serde_json::{Value, json};

/// Lease of the benchmarks' own claims: long, nothing is ever reaped.
pub(crate) const LEASE: Duration = Duration::from_secs(600);

/// The number in environment variable `name`, or `default` when it is unset
/// or not a number.
pub(crate) fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A workflow definition `name` version 1 of `tasks` (JSON task objects).
pub(crate) fn definition(name: &str, tasks: Vec<Value>) -> WorkflowDefinition {
    let body = serde_json::to_vec(&json!({ "name": name, "version": 1, "tasks": tasks })).expect("json");
    parse_definition(&body).expect("a valid benchmark definition")
}

/// A `width`-wide fan-out/fan-in of noop tasks: `root`, `m00000`…, `sink`.
pub(crate) fn fanout(width: usize) -> WorkflowDefinition {
    let mut tasks = vec![json!({"key": "root", "task_type": "noop"})];
    let keys: Vec<String> = (0..width).map(|i| format!("m{i:05}")).collect();
    tasks.extend(
        keys.iter()
            .map(|k| json!({"key": k, "task_type": "noop", "depends_on": ["root"]})),
    );
    tasks.push(json!({"key": "sink", "task_type": "noop", "depends_on": keys}));
    definition(&format!("fanout-{width}"), tasks)
}

/// The key of the `i`th task of a [`chain`].
pub(crate) fn chain_key(i: usize) -> String {
    format!("t{i:05}")
}

/// A chain of `len` noop tasks, each depending on the one before.
pub(crate) fn chain(len: usize) -> WorkflowDefinition {
    let tasks = (0..len)
        .map(|i| {
            let deps: Vec<String> = if i == 0 { vec![] } else { vec![chain_key(i - 1)] };
            json!({"key": chain_key(i), "task_type": "noop", "depends_on": deps})
        })
        .collect();
    definition(&format!("chain-{len}"), tasks)
}

/// A 40-task DAG: 8 levels of 5, each task depending on two of the level above.
pub(crate) fn dag40() -> WorkflowDefinition {
    let mut tasks = Vec::new();
    for level in 0..8 {
        for i in 0..5 {
            let deps: Vec<String> = if level == 0 {
                vec![]
            } else {
                vec![
                    format!("l{}t{}", level - 1, i),
                    format!("l{}t{}", level - 1, (i + 1) % 5),
                ]
            };
            tasks.push(json!({"key": format!("l{level}t{i}"), "task_type": "noop", "depends_on": deps}));
        }
    }
    definition("dag-40", tasks)
}

/// Publishes `def` in `store`; returns its id.
pub(crate) async fn publish<S: DefinitionStore>(store: &S, def: &WorkflowDefinition) -> WorkflowId {
    store.publish_definition(def).await.expect("publishing").id
}

/// The PostgreSQL server the benchmarks use.
#[derive(Debug, Clone)]
pub(crate) struct Server {
    pub(crate) host: String,
    pub(crate) port: String,
    pub(crate) user: String,
}

impl Server {
    /// From `PGHOST`, `PGPORT`, `PGUSER`, with this machine's defaults.
    pub(crate) fn from_env() -> Self {
        let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
        Self {
            host: var("PGHOST", "127.0.0.1"),
            port: var("PGPORT", "5432"),
            user: var("PGUSER", "postgres"),
        }
    }

    /// The URL of database `db` on this server.
    pub(crate) fn url(&self, db: &str) -> String {
        format!("postgres://{}@{}:{}/{db}", self.user, self.host, self.port)
    }

    fn connection_args(&self, db: &str) -> [String; 8] {
        [
            "-h".into(),
            self.host.clone(),
            "-p".into(),
            self.port.clone(),
            "-U".into(),
            self.user.clone(),
            "-d".into(),
            db.to_owned(),
        ]
    }

    /// Runs `sql` (any number of statements) with `psql` in `db`, stopping
    /// at the first error; returns the unaligned, tuples-only output.
    pub(crate) fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let mut child = Command::new("psql")
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(self.connection_args(db))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run psql: {e}"))?;
        let mut stdin = child.stdin.take().ok_or("psql has no stdin")?;
        let script = sql.to_owned();
        // Written from another thread: a long script must not deadlock
        // against psql's full stdout pipe.
        let writer = std::thread::spawn(move || stdin.write_all(script.as_bytes()));
        let output = child.wait_with_output().map_err(|e| format!("psql: {e}"))?;
        let _ = writer.join();
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
        } else {
            Err(format!(
                "psql failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    /// [`Server::psql`], panicking with the statement on failure.
    pub(crate) fn sql(&self, db: &str, sql: &str) -> String {
        self.psql(db, sql)
            .unwrap_or_else(|e| panic!("{e}\nwhile running in {db}:\n{sql}"))
    }
}

/// A short random lowercase suffix for database and queue names.
pub(crate) fn random_suffix() -> String {
    (0..10).map(|_| char::from(b'a' + fastrand::u8(..26))).collect()
}

/// A database this benchmark created (`ff_bench_<random>`), dropped (with
/// `FORCE`, ending its connections) when this guard is dropped, however
/// the benchmark ends.
#[derive(Debug)]
pub(crate) struct BenchDb {
    pub(crate) server: Server,
    pub(crate) name: String,
}

impl BenchDb {
    /// Creates `ff_bench_<random>[_<tag>]`.
    pub(crate) fn create(server: &Server, tag: &str) -> Self {
        let mut name = format!("ff_bench_{}", random_suffix());
        if !tag.is_empty() {
            name = format!("{name}_{tag}");
        }
        server.sql("postgres", &format!("CREATE DATABASE {name}"));
        eprintln!("created database {name}");
        Self {
            server: server.clone(),
            name,
        }
    }

    /// Its URL.
    pub(crate) fn url(&self) -> String {
        self.server.url(&self.name)
    }

    /// Runs SQL in it (see [`Server::sql`]).
    pub(crate) fn sql(&self, sql: &str) -> String {
        self.server.sql(&self.name, sql)
    }
}

impl Drop for BenchDb {
    fn drop(&mut self) {
        match self.server.psql(
            "postgres",
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        ) {
            Ok(_) => eprintln!("dropped database {}", self.name),
            Err(e) => eprintln!("could not drop database {}: {e}", self.name),
        }
    }
}

/// The server's `synchronous_commit` as sessions of `db` see it (the
/// benchmark's store connections and pgbench's alike: neither sets it).
pub(crate) fn synchronous_commit(db: &BenchDb) -> String {
    db.sql("SHOW synchronous_commit")
}

/// Rows each pgbench client owns in `bench_rows` (ids `client_id × N ..`).
pub(crate) const PGBENCH_ROWS_PER_CLIENT: u32 = 10_000;
/// The most pgbench clients the table is laid out for.
pub(crate) const PGBENCH_MAX_CLIENTS: u32 = 16;

/// The single-row conditional UPDATE each pgbench transaction runs: the
/// shape of a FlowForge transition (`… WHERE id = $1 AND state IN (…)`,
/// token bumped), each client on its own id range so rows are distinct.
pub(crate) const PGBENCH_SCRIPT: &str = "\
\\set id :client_id * 10000 + random(0, 9999)
UPDATE bench_rows SET state = CASE state WHEN 'ready' THEN 'running' ELSE 'ready' END, token = token + 1
WHERE id = :id AND state IN ('ready', 'running');
";

/// What one pgbench run measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pgbench {
    /// Transactions per second (without initial connection time).
    pub(crate) tps: f64,
    /// Average latency of one transaction, ms (a commit round trip at 1 client).
    pub(crate) latency_ms: f64,
}

/// Creates `bench_rows` in `db` (idempotent): 16 × 10 000 rows.
pub(crate) fn pgbench_prepare(db: &BenchDb) {
    db.sql(&format!(
        "CREATE TABLE IF NOT EXISTS bench_rows (id integer PRIMARY KEY, state text NOT NULL, token bigint NOT NULL);
         INSERT INTO bench_rows SELECT g, 'ready', 0 FROM generate_series(0, {} - 1) AS g ON CONFLICT DO NOTHING;
         VACUUM ANALYZE bench_rows;",
        PGBENCH_ROWS_PER_CLIENT * PGBENCH_MAX_CLIENTS
    ));
}

/// A pgbench command running `script` in `db` for `secs` seconds with
/// `clients` clients (one thread each), `-M prepared`, no vacuum.
pub(crate) fn pgbench_cmd(db: &BenchDb, clients: u32, secs: u64, script: &Path) -> Command {
    let mut cmd = Command::new("pgbench");
    cmd.args(["-n", "-M", "prepared"])
        .args(["-c", &clients.to_string(), "-j", &clients.to_string()])
        .args(["-T", &secs.to_string()])
        .arg("-f")
        .arg(script)
        .args(["-h", &db.server.host, "-p", &db.server.port, "-U", &db.server.user])
        .arg(&db.name);
    cmd
}

/// Runs [`PGBENCH_SCRIPT`] for `secs` seconds with `clients` clients (one
/// thread each), `-M prepared`, no vacuum: the conditional-UPDATE ceiling.
pub(crate) fn pgbench_update(db: &BenchDb, clients: u32, secs: u64) -> Pgbench {
    assert!(clients <= PGBENCH_MAX_CLIENTS, "bench_rows is laid out for 16 clients");
    let mut script = tempfile::NamedTempFile::new().expect("a temporary pgbench script");
    script
        .write_all(PGBENCH_SCRIPT.as_bytes())
        .expect("writing the pgbench script");
    let output = pgbench_cmd(db, clients, secs, script.path())
        .output()
        .expect("running pgbench");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "pgbench failed ({}): {text}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let figure = |prefix: &str| -> f64 {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("pgbench printed no `{prefix}`:\n{text}"))
    };
    Pgbench {
        tps: figure("tps = "),
        latency_ms: figure("latency average = "),
    }
}

/// The `p`th percentile (nearest rank) of sorted samples.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// The median of unsorted samples.
pub(crate) fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile(&sorted, 50.0)
}

/// Milliseconds of a duration.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Rounds to `digits` decimals, for readable JSON.
pub(crate) fn round(x: f64, digits: i32) -> f64 {
    let k = 10f64.powi(digits);
    (x * k).round() / k
}

/// A minimal AMQP 0-9-1 client over a blocking socket: just enough to
/// delete the queues and exchanges a benchmark declared (this crate links
/// no AMQP client; the adapter declares but never deletes).
pub(crate) mod cluster;
pub(crate) mod proxy;

pub(crate) mod amqp {
    use std::io::{self, Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    const FRAME_METHOD: u8 = 1;
    const FRAME_HEARTBEAT: u8 = 8;
    const FRAME_END: u8 = 0xCE;

    /// The parts of an `amqp://user:pass@host:port/vhost` URL.
    struct Target {
        user: String,
        password: String,
        address: String,
        vhost: String,
    }

    fn parse(url: &str) -> io::Result<Target> {
        let bad = || io::Error::new(io::ErrorKind::InvalidInput, format!("unsupported AMQP URL {url}"));
        let rest = url.strip_prefix("amqp://").ok_or_else(bad)?;
        let (authority, vhost) = rest.split_once('/').unwrap_or((rest, ""));
        let vhost = vhost.split('?').next().unwrap_or("");
        let (credentials, host) = authority.rsplit_once('@').unwrap_or(("guest:guest", authority));
        let (user, password) = credentials.split_once(':').unwrap_or((credentials, ""));
        let address = if host.contains(':') {
            host.to_owned()
        } else {
            format!("{host}:5672")
        };
        let vhost = match vhost {
            "" => "/".to_owned(),
            v => v.replace("%2f", "/").replace("%2F", "/"),
        };
        Ok(Target {
            user: user.to_owned(),
            password: password.to_owned(),
            address,
            vhost,
        })
    }

    fn short(out: &mut Vec<u8>, s: &str) {
        out.push(s.len() as u8);
        out.extend_from_slice(s.as_bytes());
    }

    fn long(out: &mut Vec<u8>, s: &[u8]) {
        out.extend_from_slice(&(s.len() as u32).to_be_bytes());
        out.extend_from_slice(s);
    }

    struct Connection {
        socket: TcpStream,
    }

    impl Connection {
        fn open(url: &str) -> io::Result<Self> {
            let target = parse(url)?;
            let socket = TcpStream::connect(&target.address)?;
            socket.set_read_timeout(Some(Duration::from_secs(10)))?;
            socket.set_write_timeout(Some(Duration::from_secs(10)))?;
            let mut c = Self { socket };
            c.socket.write_all(b"AMQP\x00\x00\x09\x01")?;
            c.expect(0, 10, 10)?; // connection.start
            let mut args = Vec::new();
            args.extend_from_slice(&0u32.to_be_bytes()); // client properties: empty table
            short(&mut args, "PLAIN");
            long(&mut args, format!("\0{}\0{}", target.user, target.password).as_bytes());
            short(&mut args, "en_US");
            c.send(0, 10, 11, &args)?; // connection.start-ok
            let tune = c.expect(0, 10, 30)?;
            let mut args = Vec::new();
            args.extend_from_slice(tune.get(..6).ok_or_else(|| protocol("short connection.tune"))?);
            args.extend_from_slice(&0u16.to_be_bytes()); // no heartbeats
            c.send(0, 10, 31, &args)?; // connection.tune-ok
            let mut args = Vec::new();
            short(&mut args, &target.vhost);
            short(&mut args, "");
            args.push(0);
            c.send(0, 10, 40, &args)?; // connection.open
            c.expect(0, 10, 41)?;
            c.send(1, 20, 10, &[0])?; // channel.open
            c.expect(1, 20, 11)?;
            Ok(c)
        }

        fn send(&mut self, channel: u16, class: u16, method: u16, args: &[u8]) -> io::Result<()> {
            let mut frame = vec![FRAME_METHOD];
            frame.extend_from_slice(&channel.to_be_bytes());
            frame.extend_from_slice(&((args.len() + 4) as u32).to_be_bytes());
            frame.extend_from_slice(&class.to_be_bytes());
            frame.extend_from_slice(&method.to_be_bytes());
            frame.extend_from_slice(args);
            frame.push(FRAME_END);
            self.socket.write_all(&frame)
        }

        /// Reads frames until the method `class.method` on `channel`
        /// arrives; a close from the broker is an error carrying its text.
        fn expect(&mut self, channel: u16, class: u16, method: u16) -> io::Result<Vec<u8>> {
            loop {
                let mut header = [0u8; 7];
                self.socket.read_exact(&mut header)?;
                let size = u32::from_be_bytes([header[3], header[4], header[5], header[6]]) as usize;
                let mut payload = vec![0u8; size + 1];
                self.socket.read_exact(&mut payload)?;
                if payload.pop() != Some(FRAME_END) {
                    return Err(protocol("bad frame end"));
                }
                if header[0] == FRAME_HEARTBEAT {
                    continue;
                }
                if header[0] != FRAME_METHOD || payload.len() < 4 {
                    return Err(protocol("unexpected frame"));
                }
                let got_channel = u16::from_be_bytes([header[1], header[2]]);
                let got = (
                    u16::from_be_bytes([payload[0], payload[1]]),
                    u16::from_be_bytes([payload[2], payload[3]]),
                );
                if got == (10, 50) || got == (20, 40) {
                    let text_len = payload.get(6).copied().unwrap_or(0) as usize;
                    let text = payload.get(7..7 + text_len).unwrap_or_default();
                    return Err(io::Error::other(format!(
                        "broker closed the {}: {}",
                        if got.0 == 10 { "connection" } else { "channel" },
                        String::from_utf8_lossy(text)
                    )));
                }
                if got_channel == channel && got == (class, method) {
                    return Ok(payload[4..].to_vec());
                }
            }
        }

        fn close(mut self) -> io::Result<()> {
            let mut args = Vec::new();
            args.extend_from_slice(&200u16.to_be_bytes());
            short(&mut args, "bench done");
            args.extend_from_slice(&[0, 0, 0, 0]);
            self.send(0, 10, 50, &args)?;
            self.expect(0, 10, 51).map(|_| ())
        }
    }

    fn protocol(what: &str) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, format!("AMQP: {what}"))
    }

    /// Deletes `queue` (with whatever it holds); returns how many messages
    /// it held.
    pub(crate) fn delete_queue(url: &str, queue: &str) -> io::Result<u32> {
        let mut c = Connection::open(url)?;
        let mut args = vec![0, 0];
        short(&mut args, queue);
        args.push(0); // if-unused, if-empty, no-wait: all off
        c.send(1, 50, 40, &args)?;
        let ok = c.expect(1, 50, 41)?;
        let count = ok.get(..4).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        c.close()?;
        Ok(count)
    }

    /// Deletes `exchange`.
    pub(crate) fn delete_exchange(url: &str, exchange: &str) -> io::Result<()> {
        let mut c = Connection::open(url)?;
        let mut args = vec![0, 0];
        short(&mut args, exchange);
        args.push(0); // if-unused, no-wait: off
        c.send(1, 40, 20, &args)?;
        c.expect(1, 40, 21)?;
        c.close()
    }
}
