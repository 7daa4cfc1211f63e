//! A TCP proxy in front of the broker or PostgreSQL that a test cuts,
//! stalls and restores, so an outage touches only the test's own
//! connections, never the shared service's.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forwards both ways.
    Forward,
    /// Closes every connection, and each new one as soon as it is accepted.
    Cut,
    /// Keeps every connection open but forwards nothing, either way: the
    /// peer goes silent, as a stopped process or a dead link does.
    Stall,
}

/// The proxy; dropping it cuts everything and stops accepting.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    mode: watch::Sender<Mode>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free local port, forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let (mode, _) = watch::channel(Mode::Forward);
        let modes = mode.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mode = modes.subscribe();
                if *mode.borrow() == Mode::Cut {
                    drop(client);
                    continue;
                }
                tokio::spawn(pipe(client, upstream, mode));
            }
        });
        Self { port, mode, accept }
    }

    /// The local port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Switches every connection, current and future, to `mode`.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.set(Mode::Cut);
        self.accept.abort();
    }
}

async fn pipe(mut client: TcpStream, upstream: SocketAddr, mut mode: watch::Receiver<Mode>) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let mut up = vec![0u8; 64 * 1024];
    let mut down = vec![0u8; 64 * 1024];
    loop {
        let current = *mode.borrow_and_update();
        if current == Mode::Cut {
            return;
        }
        if current == Mode::Stall {
            if mode.changed().await.is_err() {
                return;
            }
            continue;
        }
        tokio::select! {
            read = client_read.read(&mut up) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => if server_write.write_all(&up[..n]).await.is_err() { return },
            },
            read = server_read.read(&mut down) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => if client_write.write_all(&down[..n]).await.is_err() { return },
            },
            changed = mode.changed() => if changed.is_err() { return },
        }
    }
}
