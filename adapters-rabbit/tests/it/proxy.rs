//! A TCP proxy in front of the broker that a test can cut, stall and
//! restore, so outages touch only the test's own connections.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Forwards both ways.
    Forward,
    /// Holds every connection open but forwards nothing: a black hole.
    Stall,
    /// Closes every connection, and each new one as soon as it is accepted.
    Cut,
}

pub(crate) struct Proxy {
    port: u16,
    mode: watch::Sender<Mode>,
    accept: JoinHandle<()>,
}

impl Proxy {
    pub(crate) async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
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

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn set(&self, mode: Mode) {
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
        match current {
            Mode::Cut => return,
            Mode::Stall => {
                if mode.changed().await.is_err() {
                    return;
                }
                continue;
            }
            Mode::Forward => {}
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
