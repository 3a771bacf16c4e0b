//! `--upstream URL`: the gateway in front of a service. The upstreams here are axum servers
//! of the test's own on 127.0.0.1, each on a runtime of its own thread.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::{
    body::{Body, Bytes},
    extract::{ConnectInfo, Request},
    http::{HeaderMap, Method, StatusCode, Uri},
    response::IntoResponse,
    routing::any,
    Router,
};

use crate::servers::gateway::{assert_refused, get, get_path, start_gateway};

/// An upstream serving `app` on a free 127.0.0.1 port until the test process ends, its
/// handlers given each connection's address (`ConnectInfo`).
pub(crate) fn upstream(app: Router) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            axum::serve(listener, app).await.unwrap();
        });
    });
    addr
}

/// A client connection to `addr`, whose reads give up after 30 s.
fn client(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// Sends `request` (whole, as bytes) to `addr` and reads the answer to the end.
fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = client(addr);
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// What the echoing upstream saw, one `name: value` line each, as its body.
async fn echo(method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> impl IntoResponse {
    let h = |name: &str| {
        headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_else(|| "-".into())
    };
    let seen = format!(
        "method: {method}\nuri: {uri}\nhost: {}\nx-custom: {}\nx-forwarded-for: {}\ncontent-length: {}\ntransfer-encoding: {}\nconnection-private: {}\nbody: {}\n",
        h("host"),
        h("x-custom"),
        h("x-forwarded-for"),
        h("content-length"),
        h("transfer-encoding"),
        h("x-private"),
        String::from_utf8_lossy(&body),
    );
    (StatusCode::CREATED, [("x-from-upstream", "yes")], seen)
}

#[test]
fn a_proxied_request_keeps_its_method_target_headers_and_body() {
    let up = upstream(Router::new().fallback(any(echo)));
    let url = format!("http://{up}/prefix/");
    let gw = start_gateway(&["--upstream", &url, "--limit", "100"]);
    assert!(
        gw.banner
            .iter()
            .any(|l| l == &format!("upstream: http://{up}/prefix")),
        "{:?}",
        gw.banner
    );
    let answer = exchange(
        gw.addr,
        b"POST /a/b%2Fc?x=1&y=%20z HTTP/1.1\r\nhost: gw\r\nx-custom: kept\r\nx-forwarded-for: 203.0.113.7\r\nconnection: close, x-private\r\nx-private: dropped\r\ncontent-length: 5\r\n\r\nhello",
    );
    let lower = answer.to_ascii_lowercase();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert!(lower.contains("\r\nx-from-upstream: yes\r\n"), "{answer}");
    assert!(
        lower.contains("\r\nratelimit: "),
        "the limiter's fields: {answer}"
    );
    for line in [
        "method: POST",
        "uri: /prefix/a/b%2Fc?x=1&y=%20z",
        "host: gw",
        "x-custom: kept",
        "x-forwarded-for: 203.0.113.7, 127.0.0.1",
        "content-length: 5",
        "transfer-encoding: -",
        "connection-private: -",
        "body: hello",
    ] {
        assert!(answer.contains(line), "{line} in {answer}");
    }
}

/// A request without `Host` (HTTP/1.0) reaches the upstream with the upstream's authority.
#[test]
fn a_request_without_host_gets_the_upstreams() {
    let up = upstream(Router::new().fallback(any(echo)));
    let url = format!("http://{up}");
    let gw = start_gateway(&["--upstream", &url, "--limit", "100"]);
    let answer = exchange(gw.addr, b"GET /old HTTP/1.0\r\n\r\n");
    assert!(
        answer.starts_with("HTTP/1.0 201") || answer.starts_with("HTTP/1.1 201"),
        "{answer}"
    );
    assert!(answer.contains(&format!("host: {up}\n")), "{answer}");
}

/// The upstream port each request came from, as its body.
async fn peer_port(ConnectInfo(peer): ConnectInfo<SocketAddr>) -> String {
    peer.port().to_string()
}

/// The bodies of the responses in a stream of HTTP/1.1 answers whose bodies are short lines.
fn bodies(answers: &str) -> Vec<String> {
    answers
        .split("HTTP/1.1 ")
        .skip(1)
        .map(|answer| answer.rsplit("\r\n\r\n").next().unwrap_or("").to_owned())
        .collect()
}

/// A client connection's requests go over one upstream connection, and the upstream
/// connections outlive the client connections: twenty clients one after another, each with
/// three requests, reach the upstream over a handful of connections, not sixty.
#[test]
fn upstream_connections_are_kept_and_shared() {
    let up = upstream(Router::new().fallback(any(peer_port)));
    let url = format!("http://{up}");
    let gw = start_gateway(&["--upstream", &url, "--limit", "1000"]);
    let mut ports = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let answers = exchange(
            gw.addr,
            b"GET /1 HTTP/1.1\r\nhost: gw\r\n\r\nGET /2 HTTP/1.1\r\nhost: gw\r\n\r\nGET /3 HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n",
        );
        let seen = bodies(&answers);
        assert_eq!(seen.len(), 3, "{answers}");
        assert!(
            seen.iter().all(|port| port == &seen[0]),
            "one client connection, one upstream connection: {seen:?}"
        );
        ports.insert(seen[0].clone());
    }
    // The pool gets a connection back when its client's connection has ended, which a
    // client reading its last answer may outrun: a few new connections, not one per client.
    assert!(ports.len() <= 5, "upstream connections: {ports:?}");
}

/// An upstream that closes its connection after each answer (`connection: close`): every
/// request still gets its answer, over a new connection each time.
#[test]
fn an_upstream_closing_its_connections_is_connected_again() {
    let up = upstream(
        Router::new().fallback(any(|peer: ConnectInfo<SocketAddr>| async move {
            ([("connection", "close")], peer_port(peer).await)
        })),
    );
    let url = format!("http://{up}");
    let gw = start_gateway(&["--upstream", &url, "--limit", "1000"]);
    let answers = exchange(
        gw.addr,
        b"GET /1 HTTP/1.1\r\nhost: gw\r\n\r\nGET /2 HTTP/1.1\r\nhost: gw\r\n\r\nGET /3 HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n",
    );
    let seen = bodies(&answers);
    assert_eq!(seen.len(), 3, "{answers}");
    let distinct: std::collections::BTreeSet<_> = seen.iter().collect();
    assert_eq!(distinct.len(), 3, "a new connection each time: {seen:?}");
}

/// Reads one answer from a kept-alive connection: its head and a body of `content-length`.
fn read_answer(s: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let text = String::from_utf8_lossy(&seen).to_ascii_lowercase();
        if let Some(end) = text.find("\r\n\r\n") {
            if seen.len() >= end + 4 + content_length(&text) {
                return text;
            }
        }
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "closed mid-answer: {:?}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
}

/// The `content-length` of a message head in lower case (0 without one).
fn content_length(head: &str) -> usize {
    head.split("\r\n")
        .find_map(|line| line.strip_prefix("content-length: "))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Reads an answer from `s`: a 200 whose body is `body`.
fn expect_ok(s: &mut TcpStream, body: &str) {
    let answer = read_answer(s);
    let whole = answer.starts_with("http/1.1 200") && answer.ends_with(&format!("\r\n\r\n{body}"));
    assert!(whole, "{answer}");
}

/// Reads from `stream` into `buffered` until it holds a whole request head: where the head
/// ends in `buffered`, or `None` when the stream ends or fails first.
fn read_head(stream: &mut TcpStream, buffered: &mut Vec<u8>) -> Option<usize> {
    let mut buf = [0u8; 1024];
    loop {
        if let Some(end) = buffered.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(end + 4);
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(k) => buffered.extend_from_slice(&buf[..k]),
        }
    }
}

/// An upstream that closes each connection right after its answer without saying so (no
/// `connection: close`): the connection, kept by its client connection or idle in the pool,
/// is found closed by the next request, which goes over a new one.
#[test]
fn an_upstream_closing_idle_connections_is_connected_again() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let up = listener.local_addr().unwrap();
    // The number of each connection the upstream closed, once closed.
    let (closed_tx, closed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Each connection answers one request with its number, then closes.
        for (n, stream) in listener.incoming().enumerate() {
            let Ok(mut stream) = stream else { continue };
            let closed_tx = closed_tx.clone();
            std::thread::spawn(move || {
                if read_head(&mut stream, &mut Vec::new()).is_none() {
                    return;
                }
                let body = n.to_string();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes());
                drop(stream);
                let _ = closed_tx.send(n);
            });
        }
    });
    let closed_no = |n: usize| {
        let got = closed.recv_timeout(Duration::from_secs(60));
        assert_eq!(got, Ok(n), "the upstream's connection {n} did not close");
    };
    let url = format!("http://{up}");
    let gw = start_gateway(&["--upstream", &url, "--limit", "1000"]);
    // Kept by the client connection between its requests.
    let mut s = client(gw.addr);
    s.write_all(b"GET /1 HTTP/1.1\r\nhost: gw\r\n\r\n").unwrap();
    expect_ok(&mut s, "0");
    closed_no(0);
    s.write_all(b"GET /2 HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n")
        .unwrap();
    expect_ok(&mut s, "1");
    drop(s);
    // The second connection went to the pool with its client connection's end; closed
    // there, it is found so by the next client's request.
    closed_no(1);
    let (status, text) = get(gw.addr, "");
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("\r\n\r\n2"), "{text}");
}

/// An upstream that answers a request as soon as its head comes, and reads its body after:
/// the rest of the client's body still goes up after the answer went down, and the client's
/// next request is answered too.
#[test]
fn a_body_the_upstream_answered_early_still_goes_up() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let up = listener.local_addr().unwrap();
    let uploaded = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let seen = Arc::clone(&uploaded);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let seen = Arc::clone(&seen);
            std::thread::spawn(move || {
                let mut buffered = Vec::new();
                let mut buf = [0u8; 1024];
                loop {
                    // A head, answered at once.
                    let Some(end) = read_head(&mut stream, &mut buffered) else {
                        return;
                    };
                    let head = String::from_utf8_lossy(&buffered[..end]).to_ascii_lowercase();
                    let length = content_length(&head);
                    buffered.drain(..end);
                    if stream
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .is_err()
                    {
                        return;
                    }
                    // Then its body.
                    while buffered.len() < length {
                        match stream.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(k) => buffered.extend_from_slice(&buf[..k]),
                        }
                    }
                    seen.lock().unwrap().extend(buffered.drain(..length));
                }
            });
        }
    });
    let url = format!("http://{up}");
    let gw = start_gateway(&["--upstream", &url, "--limit", "1000"]);
    let mut s = client(gw.addr);
    s.write_all(b"POST /up HTTP/1.1\r\nhost: gw\r\ncontent-length: 10\r\n\r\n12345")
        .unwrap();
    expect_ok(&mut s, "ok");
    s.write_all(b"67890").unwrap();
    s.write_all(b"GET /next HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n")
        .unwrap();
    expect_ok(&mut s, "ok");
    // Room for a loaded machine: the body's rest goes up in a task of its own.
    for _ in 0..1200 {
        if uploaded.lock().unwrap().as_slice() == b"1234567890" {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "the upstream got {:?}",
        String::from_utf8_lossy(&uploaded.lock().unwrap())
    );
}

#[test]
fn a_refused_request_never_reaches_the_upstream() {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&hits);
    let up = upstream(Router::new().fallback(any(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        async { "upstream" }
    })));
    let url = format!("http://{up}");
    let gw = start_gateway(&[
        "--upstream",
        &url,
        "--key",
        "global",
        "--limit",
        "2",
        "--per",
        "1h",
    ]);
    let statuses: Vec<u16> = (0..5).map(|_| get(gw.addr, "").0).collect();
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}

/// The first bytes of a slow upstream's body reach the client before its last are sent: the
/// upstream sends its last chunk only once the client has read the first.
#[test]
fn a_slow_upstreams_body_is_streamed_to_the_client() {
    let (go, wait) = tokio::sync::watch::channel(false);
    let up = upstream(Router::new().fallback(any(move || {
        let wait = wait.clone();
        async move {
            // `first-chunk` at once, `last-chunk` once the test says go.
            let chunks = futures_util::stream::unfold(0u8, move |step| {
                let mut wait = wait.clone();
                async move {
                    match step {
                        0 => Some((
                            Ok::<_, std::io::Error>(Bytes::from_static(b"first-chunk\n")),
                            1,
                        )),
                        1 => {
                            let _ = wait.wait_for(|go| *go).await;
                            Some((Ok(Bytes::from_static(b"last-chunk\n")), 2))
                        }
                        _ => None,
                    }
                }
            });
            Body::from_stream(chunks)
        }
    })));
    let url = format!("http://{up}");
    let gw = start_gateway(&["--upstream", &url, "--limit", "100"]);
    let mut s = client(gw.addr);
    s.write_all(b"GET /stream HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("first-chunk") {
        let n = s
            .read(&mut buf)
            .expect("the first chunk did not come before the last was sent");
        assert!(
            n > 0,
            "closed before the first chunk: {:?}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(!String::from_utf8_lossy(&seen).contains("last-chunk"));
    go.send(true).unwrap();
    s.read_to_end(&mut seen).unwrap();
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("last-chunk"), "{text}");
}

#[test]
fn an_unreachable_upstream_is_502_and_a_silent_one_504() {
    // A port that was free a moment ago: nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("http://{closed}");
    let gw = start_gateway(&["--upstream", &url]);
    assert_eq!(get(gw.addr, "").0, 502);
    // An upstream that never answers, and a timeout of 300 ms.
    let silent = upstream(Router::new().fallback(any(std::future::pending::<&str>)));
    let url = format!("http://{silent}");
    let gw = start_gateway(&["--upstream", &url, "--upstream-timeout-ms", "300"]);
    let (status, text) = get_path(gw.addr, "/anything", "");
    assert_eq!(status, 504, "{text}");
    assert!(text.contains("ratelimit: "), "the limiter's fields: {text}");
}

/// `--count-only` reads the upstream's status: only the listed statuses spend quota.
#[test]
fn count_only_reads_the_upstreams_status() {
    let up = upstream(Router::new().fallback(any(|req: Request| async move {
        match req.uri().path() {
            "/fail" => StatusCode::UNAUTHORIZED,
            _ => StatusCode::OK,
        }
    })));
    let url = format!("http://{up}");
    let gw = start_gateway(&[
        "--upstream",
        &url,
        "--key",
        "global",
        "--limit",
        "2",
        "--per",
        "1h",
        "--count-only",
        "401",
    ]);
    // Successes spend nothing; two 401s spend the quota.
    for _ in 0..5 {
        assert_eq!(get(gw.addr, "").0, 200);
    }
    assert_eq!(get_path(gw.addr, "/fail", "").0, 401);
    assert_eq!(get_path(gw.addr, "/fail", "").0, 401);
    assert_eq!(get(gw.addr, "").0, 429);
}

#[test]
fn a_bad_upstream_url_is_refused_at_start_up() {
    for bad in [
        "https://backend",
        "backend:80",
        "http://u:p@backend",
        "http://backend/?q=1",
    ] {
        assert_refused(&["--upstream", bad], "--upstream");
    }
    assert_refused(&["--upstream-timeout-ms", "soon"], "--upstream-timeout-ms");
    assert_refused(&["--upstream-timeout-ms", "0"], "--upstream-timeout-ms");
}

/// Under a prefix, a path with `.` or `..` segments is refused (400) and never reaches the
/// upstream, which could resolve it outside the prefix.
#[test]
fn a_path_leaving_the_prefix_is_refused() {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&hits);
    let up = upstream(Router::new().fallback(any(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        async { "upstream" }
    })));
    let url = format!("http://{up}/api");
    let gw = start_gateway(&["--upstream", &url, "--limit", "100"]);
    for path in ["/../admin", "/v1/%2e%2e/%2E%2E/admin", "/./x"] {
        let answer = exchange(
            gw.addr,
            format!("GET {path} HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n").as_bytes(),
        );
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    assert_eq!(get_path(gw.addr, "/v1/ok", "").0, 200);
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

/// `--upstream-timeout-ms` counts from the request's last progress: a client that uploads
/// its body slowly (each part within the timeout, the whole beyond it) gets the upstream's
/// answer, not a 504.
#[test]
fn a_slow_upload_is_not_an_upstream_timeout() {
    let up = upstream(Router::new().fallback(any(echo)));
    let url = format!("http://{up}");
    let gw = start_gateway(&["--upstream", &url, "--upstream-timeout-ms", "3000"]);
    let mut s = client(gw.addr);
    s.write_all(b"POST /up HTTP/1.1\r\nhost: gw\r\nconnection: close\r\ncontent-length: 8\r\n\r\n")
        .unwrap();
    // Eight bytes, one every 500 ms: 4 s in all, never 3 s without progress.
    for b in b"abcdefgh" {
        std::thread::sleep(Duration::from_millis(500));
        s.write_all(&[*b]).unwrap();
    }
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 201"), "{out}");
    assert!(out.contains("body: abcdefgh"), "{out}");
}

/// An upstream that sends its answer's head and part of its body, then nothing, has the
/// client's connection cut after the upstream timeout: the client sees the body end early
/// instead of waiting forever.
#[test]
fn a_stalled_upstream_body_cuts_the_client_connection() {
    let up = upstream(Router::new().fallback(any(|| async {
        let chunks = futures_util::stream::unfold(0u8, |step| async move {
            match step {
                0 => Some((
                    Ok::<_, std::io::Error>(Bytes::from_static(b"first-chunk\n")),
                    1,
                )),
                _ => std::future::pending().await,
            }
        });
        Body::from_stream(chunks)
    })));
    let url = format!("http://{up}");
    let gw = start_gateway(&["--upstream", &url, "--upstream-timeout-ms", "300"]);
    let mut s = client(gw.addr);
    s.write_all(b"GET /stall HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    // Ends (the connection closed) long before the 30 s read timeout would fail it.
    s.read_to_end(&mut out)
        .expect("the connection was never cut");
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("first-chunk"), "{text}");
    assert!(
        !text.ends_with("0\r\n\r\n"),
        "a cut body does not end cleanly: {text:?}"
    );
}
