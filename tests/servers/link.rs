//! A link between regions: a TCP proxy in front of a server that delays every byte by a set
//! time each way (so a round trip through it takes twice that more), and can be cut (every
//! connection through it closed, new ones closed at once) and restored.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        tcp::{OwnedReadHalf, OwnedWriteHalf},
        TcpListener, TcpStream,
    },
    sync::{mpsc, watch},
    time::Instant,
};

pub struct RegionLink {
    pub addr: SocketAddr,
    cut: watch::Sender<bool>,
    /// Connections closed by a cut, or refused while cut.
    pub dropped: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl RegionLink {
    /// Listens on a free loopback port and forwards every connection to `upstream`, each byte
    /// `delay` later in each direction.
    pub async fn start(upstream: SocketAddr, delay: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, _) = watch::channel(false);
        let dropped = Arc::new(AtomicU64::new(0));
        let (cut_rx, count) = (cut.subscribe(), dropped.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if *cut_rx.borrow() {
                    count.fetch_add(1, Ordering::SeqCst);
                    drop(client);
                    continue;
                }
                let mut cut_rx = cut_rx.clone();
                let count = count.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (client_rx, client_tx) = client.into_split();
                    let (server_rx, server_tx) = server.into_split();
                    let up = tokio::spawn(delayed(client_rx, server_tx, delay));
                    let down = tokio::spawn(delayed(server_rx, client_tx, delay));
                    let (up_handle, down_handle) = (up.abort_handle(), down.abort_handle());
                    tokio::select! {
                        _ = cut_rx.wait_for(|cut| *cut) => {
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                        _ = async { let _ = tokio::join!(up, down); } => {}
                    }
                    up_handle.abort();
                    down_handle.abort();
                });
            }
        });
        RegionLink {
            addr,
            cut,
            dropped,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Closes every connection through the link, and every new one at once, until
    /// [`restore`](Self::restore).
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Forwards connections again.
    pub fn restore(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for RegionLink {
    fn drop(&mut self) {
        self.cut.send_replace(true);
        self.task.abort();
    }
}

/// Copies `rx` to `tx`, each chunk `delay` after it was read, in order.
async fn delayed(mut rx: OwnedReadHalf, mut tx: OwnedWriteHalf, delay: Duration) {
    // Both halves in this task, so that aborting it (a cut) delivers nothing still queued.
    let (queue, mut out) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((at, bytes)) = out.recv().await {
            tokio::time::sleep_until(at).await;
            if tx.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if queue
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    };
    tokio::join!(reader, writer);
}
