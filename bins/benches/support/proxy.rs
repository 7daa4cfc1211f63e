//! TCP proxies the fault matrix puts between each process and each
//! service, so one fault can silence one path — a partition: no RST, bytes
//! held until it heals — or kill a publisher the moment the broker
//! confirms its publish, before it can mark the dispatch published.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// AMQP 0-9-1 frames: a 7-byte header (type, channel, payload size), the
/// payload, and the frame-end octet.
const FRAME_HEADER: usize = 7;
const FRAME_METHOD: u8 = 1;
/// `basic.ack`: class 60, method 80 — from the broker, a publisher confirm.
const BASIC_ACK: [u8; 4] = [0, 60, 0, 80];

/// The pid the next confirm through a proxy kills, if armed.
type Trap = Arc<Mutex<Option<u32>>>;

/// One proxy from a local port to a service.
pub(crate) struct Proxy {
    pub(crate) addr: SocketAddr,
    open: watch::Sender<bool>,
    trap: Trap,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free local port and forwards to `upstream`
    /// (`host:port`); `amqp` when the service speaks AMQP 0-9-1, so its
    /// frames can be watched for confirms.
    pub(crate) async fn start(upstream: &str, amqp: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a local port for a proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let (open, watch) = watch::channel(true);
        let trap: Trap = Arc::default();
        let upstream = upstream.to_owned();
        let accept = {
            let trap = Arc::clone(&trap);
            tokio::spawn(async move {
                loop {
                    match listener.accept().await {
                        Ok((client, _)) => {
                            let trap = amqp.then(|| Arc::clone(&trap));
                            tokio::spawn(serve(client, upstream.clone(), watch.clone(), trap));
                        }
                        // Out of descriptors, say: the path must not die of it.
                        Err(e) => {
                            eprintln!("proxy to {upstream}: accept failed: {e}");
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        }
                    }
                }
            })
        };
        Self {
            addr,
            open,
            trap,
            accept,
        }
    }

    /// Silences the path (`true`) or heals it: while silent, bytes in
    /// either direction and new connections wait, unanswered and unreset.
    pub(crate) fn silence(&self, silent: bool) {
        self.open.send_replace(!silent);
    }

    /// Arms the confirm trap: the next `basic.ack` the broker sends through
    /// this proxy SIGKILLs `pid` (our own child) before the frame is passed
    /// on, and the connection is dropped.
    pub(crate) fn arm_confirm_trap(&self, pid: u32) {
        *self.trap.lock().expect("trap lock") = Some(pid);
    }

    /// Disarms the trap; true when it was still armed (had not sprung).
    pub(crate) fn disarm(&self) -> bool {
        self.trap.lock().expect("trap lock").take().is_some()
    }

    /// Whether the trap is armed (and so has not sprung yet).
    pub(crate) fn trap_armed(&self) -> bool {
        self.trap.lock().expect("trap lock").is_some()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Open connections end with their processes, or when the watch
        // closes (a silenced one).
        self.accept.abort();
    }
}

/// One client connection: forwarded once the path is open.
async fn serve(client: TcpStream, upstream: String, mut open: watch::Receiver<bool>, trap: Option<Trap>) {
    if open.wait_for(|o| *o).await.is_err() {
        return;
    }
    let Ok(server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pump(client_read, server_write, open.clone(), None),
        pump(server_read, client_write, open, trap),
    );
}

/// Copies one direction while the path is open; `trap` scans the broker's
/// frames for a publisher confirm.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut open: watch::Receiver<bool>, trap: Option<Trap>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = from.read(&mut buf).await.unwrap_or(0);
        if open.wait_for(|o| *o).await.is_err() {
            return;
        }
        if n == 0 {
            let _ = to.shutdown().await;
            return;
        }
        let Some(trap) = &trap else {
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
            continue;
        };
        // Whole frames only, so a confirm is seen before any of it passes.
        pending.extend_from_slice(&buf[..n]);
        let mut whole = 0;
        while let Some(len) = frame_len(&pending[whole..]) {
            if is_confirm(&pending[whole..whole + len]) && spring(trap) {
                return;
            }
            whole += len;
        }
        if to.write_all(&pending[..whole]).await.is_err() {
            return;
        }
        pending.drain(..whole);
    }
}

/// The length of the whole frame at the start of `bytes`, if it is all
/// there.
fn frame_len(bytes: &[u8]) -> Option<usize> {
    let size = u32::from_be_bytes(bytes.get(3..FRAME_HEADER)?.try_into().ok()?) as usize;
    let len = FRAME_HEADER + size + 1;
    (bytes.len() >= len).then_some(len)
}

fn is_confirm(frame: &[u8]) -> bool {
    frame[0] == FRAME_METHOD && frame.get(FRAME_HEADER..FRAME_HEADER + 4) == Some(&BASIC_ACK[..])
}

/// Kills the armed pid, if any; true when it did.
fn spring(trap: &Trap) -> bool {
    let Some(pid) = trap.lock().expect("trap lock").take() else {
        return false;
    };
    // Only our own child, by its pid: never 0, never a group.
    if let Ok(pid) = i32::try_from(pid)
        && pid > 0
    {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    true
}

/// `url` with its `host:port` replaced by `addr`.
pub(crate) fn via(url: &str, addr: SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    // A URL without a path keeps none: `amqp://host/` would name the
    // vhost "" instead of the default.
    let (authority, path) = rest
        .split_once('/')
        .map_or((rest, String::new()), |(a, p)| (a, format!("/{p}")));
    let credentials = authority
        .rsplit_once('@')
        .map(|(c, _)| format!("{c}@"))
        .unwrap_or_default();
    format!("{scheme}://{credentials}{addr}{path}")
}

/// The `host:port` of `url` (`default_port` when it names none).
pub(crate) fn upstream(url: &str, default_port: u16) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:{default_port}")
    }
}
