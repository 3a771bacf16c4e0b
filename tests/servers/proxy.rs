//! A TCP proxy in front of a test server that can cut a connection at a chosen moment: after
//! the server answered a request, before the answer reaches the client. The request reached
//! the server, the client sees its connection drop with the request in flight.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

pub struct Proxy {
    pub addr: SocketAddr,
    /// When set, the next answer from the server is swallowed and that client's connection
    /// closed; then the proxy forwards normally again.
    cut_next_answer: Arc<AtomicBool>,
    /// Client connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut_next_answer = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (cut, count) = (cut_next_answer.clone(), accepted.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let cut = cut.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    pump(client, server, cut).await;
                });
            }
        });
        Proxy {
            addr,
            cut_next_answer,
            accepted,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Swallows the next answer any client would get, and closes that client's connection.
    pub fn cut_next_answer(&self) {
        self.cut_next_answer.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pump(client: TcpStream, server: TcpStream, cut: Arc<AtomicBool>) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let upstream = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if server_tx.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match server_rx.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if cut.swap(false, Ordering::SeqCst) {
                    break; // the answer is lost; the client's connection closes below
                }
                if client_tx.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    upstream.abort();
}
