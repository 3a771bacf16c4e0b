//! `--upstream URL`: the gateway as a reverse proxy. Every request the limiter lets through goes
//! to the upstream with its method, its path and query byte for byte (after the upstream's
//! path prefix), its headers (hop-by-hop ones dropped, `x-forwarded-for` appended with the
//! client's address) and its body, streamed both ways over pooled connections; the upstream's
//! status, headers and body come back, and the limiter adds its fields. An upstream that
//! cannot be reached answers 502; one that neither takes any of the request nor answers for
//! the timeout, 504; a response body idle that long cuts the client's connection.

use std::{
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{
    header::{self, HeaderMap, HeaderName, HeaderValue},
    uri::{Authority, PathAndQuery, Scheme},
    Request, Response, StatusCode, Uri,
};
use http_body_util::{Either, Full};
use hyper::{body::Incoming, client::conn::http1::SendRequest};
use hyper_util::rt::TokioIo;

/// What the proxy answers with: the upstream's body, or a line of its own (502, 504, 400).
pub type ProxyBody = Either<Download, Full<Bytes>>;

/// The headers that concern one connection, not the request (RFC 9110, 7.6.1), never
/// forwarded either way.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Where requests go: `http://HOST[:PORT][/PREFIX]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    authority: Authority,
    /// The path prefix, without a trailing `/` (empty for none).
    prefix: String,
}

impl Upstream {
    /// Reads `--upstream`'s URL: `http://`, a host and an optional port, an optional path
    /// prefix; no query, no fragment, no user.
    pub fn parse(url: &str) -> Result<Self, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("{url:?} is not a URL ({e})"))?;
        if uri.scheme() != Some(&Scheme::HTTP) {
            return Err(format!("{url:?}: only http:// upstreams are served"));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| format!("{url:?} names no host"))?;
        if authority.as_str().contains('@') {
            return Err(format!("{url:?}: no user in the URL"));
        }
        if authority.host().is_empty() {
            return Err(format!("{url:?} names no host"));
        }
        let path = uri.path_and_query().map_or("", PathAndQuery::as_str);
        if path.contains('?') || url.contains('#') {
            return Err(format!("{url:?}: a prefix takes no query nor fragment"));
        }
        Ok(Self {
            authority,
            prefix: path.trim_end_matches('/').to_owned(),
        })
    }

    /// The upstream, as the start-up line shows it.
    pub fn describe(&self) -> String {
        format!("http://{}{}", self.authority, self.prefix)
    }

    /// The request target sent upstream for a client's `uri`: its path and query byte for
    /// byte after the prefix, in origin form (`/path?query`). Under a prefix, a path with a
    /// `.` or `..` segment (`%2e` too) names none: an upstream that resolves them would serve
    /// what lies outside the prefix.
    fn target(&self, uri: Uri) -> Result<Uri, String> {
        if self.prefix.is_empty() && uri.scheme().is_none() && uri.authority().is_none() {
            return Ok(uri);
        }
        if !self.prefix.is_empty() && uri.path().split('/').any(is_dot_segment) {
            return Err(format!("{:?} leaves the upstream's prefix", uri.path()));
        }
        let path_and_query = uri.path_and_query().map_or("/", PathAndQuery::as_str);
        Uri::try_from(format!("{}{path_and_query}", self.prefix)).map_err(|e| e.to_string())
    }

    /// Where to connect: the host (an IPv6 address without its brackets) and the port.
    fn address(&self) -> (&str, u16) {
        let host = self.authority.host();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        (host, self.authority.port_u16().unwrap_or(80))
    }
}

/// Whether a path segment is `.` or `..`, its dots written as they are or as `%2e`.
fn is_dot_segment(segment: &str) -> bool {
    let dots = segment.to_ascii_lowercase().replace("%2e", ".");
    dots == "." || dots == ".."
}

/// The most idle upstream connections kept for the next client connections.
const MAX_IDLE: usize = 256;
/// How long an idle upstream connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The proxy every client connection shares: the upstream, the timeout and the pool of idle
/// upstream connections.
#[derive(Clone)]
pub struct Proxy {
    shared: Arc<Shared>,
}

struct Shared {
    upstream: Upstream,
    /// `Host` for a request that has none (HTTP/1.0): the upstream's authority.
    host: HeaderValue,
    timeout: Duration,
    /// The idle connections, the most recently used last.
    idle: Mutex<Vec<(SendRequest<Upload>, Instant)>>,
}

impl Proxy {
    pub fn new(upstream: Upstream, timeout: Duration) -> Self {
        let host = HeaderValue::from_str(upstream.authority.as_str())
            .expect("an authority is a header value");
        Self {
            shared: Arc::new(Shared {
                upstream,
                host,
                timeout,
                idle: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The proxy for one client connection from `client`.
    pub fn connection(&self, client: SocketAddr) -> ProxyConnection {
        ProxyConnection {
            held: Arc::new(Held {
                shared: Arc::clone(&self.shared),
                sender: Mutex::new(None),
            }),
            client: HeaderValue::from_str(&client.ip().to_string())
                .expect("an address is a header value"),
        }
    }
}

impl Shared {
    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<(SendRequest<Upload>, Instant)>> {
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The most recently used idle connection still open and not too old.
    fn checkout(&self) -> Option<SendRequest<Upload>> {
        let mut idle = self.lock_idle();
        while let Some((sender, since)) = idle.pop() {
            if !sender.is_closed() && since.elapsed() < IDLE_TIMEOUT {
                return Some(sender);
            }
        }
        None
    }

    /// Keeps a connection for later, dropping those closed or too old.
    fn checkin(&self, sender: SendRequest<Upload>) {
        if sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.lock_idle();
        idle.retain(|(s, since)| !s.is_closed() && now.duration_since(*since) < IDLE_TIMEOUT);
        if idle.len() < MAX_IDLE {
            idle.push((sender, now));
        }
    }

    /// A new connection to the upstream, driven by a task of its own.
    async fn connect(&self) -> Result<SendRequest<Upload>, BoxError> {
        let stream = tokio::net::TcpStream::connect(self.upstream.address()).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream connection ended");
            }
        });
        Ok(sender)
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The proxy as one client connection sees it. Its requests go over one upstream connection
/// in turn (HTTP/1 answers one request at a time): taken from the pool, or opened, for the
/// first, and given back to the pool when the client's connection ends.
#[derive(Clone)]
pub struct ProxyConnection {
    held: Arc<Held>,
    /// The client's address, as `x-forwarded-for` gets it.
    client: HeaderValue,
}

/// The upstream connection a client connection holds between its requests.
struct Held {
    shared: Arc<Shared>,
    sender: Mutex<Option<SendRequest<Upload>>>,
}

impl Held {
    fn take(&self) -> Option<SendRequest<Upload>> {
        self.sender
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    fn give_back(&self, sender: SendRequest<Upload>) {
        let mut held = self
            .sender
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match held.as_ref() {
            None => *held = Some(sender),
            Some(_) => {
                drop(held);
                self.shared.checkin(sender);
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let sender = self
            .sender
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(sender) = sender {
            self.shared.checkin(sender);
        }
    }
}

/// How many times a request that provably did not reach the upstream (its connection closed
/// before it was written) is sent; the last time over a new connection.
const ATTEMPTS: usize = 3;

impl ProxyConnection {
    /// Sends `req` and waits for the response's head. A request goes out once: it is sent
    /// again only when hyper hands it back unwritten.
    async fn send(&self, mut req: Request<Upload>) -> Result<Response<Incoming>, BoxError> {
        let shared = &self.held.shared;
        for attempt in 1..=ATTEMPTS {
            let reused = if attempt < ATTEMPTS {
                self.held.take().or_else(|| shared.checkout())
            } else {
                None
            };
            let mut sender = match reused {
                Some(sender) => sender,
                None => shared.connect().await?,
            };
            if sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(req).await {
                Ok(res) => {
                    self.held.give_back(sender);
                    return Ok(res);
                }
                Err(mut e) => match e.take_message() {
                    Some(unsent) => req = unsent,
                    None => return Err(e.into_error().into()),
                },
            }
        }
        Err("the upstream closed every connection the request was given to".into())
    }

    /// The request to the upstream, its answer back.
    async fn forward(self, req: Request<Incoming>) -> Response<ProxyBody> {
        let shared = &self.held.shared;
        let (mut parts, body) = req.into_parts();
        parts.uri = match shared.upstream.target(parts.uri) {
            Ok(uri) => uri,
            Err(_) => return text(StatusCode::BAD_REQUEST, "bad request target\n"),
        };
        // HTTP/1.1 to the upstream, whatever the client spoke.
        parts.version = http::Version::HTTP_11;
        drop_hop_by_hop(&mut parts.headers);
        forwarded_for(&mut parts.headers, &self.client);
        if !parts.headers.contains_key(header::HOST) {
            parts.headers.insert(header::HOST, shared.host.clone());
        }
        let progress = Arc::new(Progress::new());
        let body = Upload::new(body, Arc::clone(&progress));
        let sent = self.send(Request::from_parts(parts, body));
        let answered = tokio::select! {
            answered = sent => Some(answered),
            () = progress.idle_for(shared.timeout) => None,
        };
        match answered {
            Some(Ok(res)) => {
                let (mut parts, body) = res.into_parts();
                drop_hop_by_hop(&mut parts.headers);
                let body = Download::new(body, shared.timeout);
                Response::from_parts(parts, Either::Left(body))
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "upstream unreachable");
                text(StatusCode::BAD_GATEWAY, "upstream unreachable\n")
            }
            None => {
                tracing::debug!(
                    timeout_ms = shared.timeout.as_millis() as u64,
                    "upstream timed out"
                );
                text(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n")
            }
        }
    }
}

/// When a request last made progress: its start, then each part of its body taken by the
/// upstream connection. The upstream's time to answer counts from the last.
struct Progress {
    start: tokio::time::Instant,
    /// Microseconds from `start` to the last progress.
    last_us: std::sync::atomic::AtomicU64,
}

impl Progress {
    fn new() -> Self {
        Self {
            start: tokio::time::Instant::now(),
            last_us: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn made(&self) {
        let us = self.start.elapsed().as_micros() as u64;
        self.last_us
            .fetch_max(us, std::sync::atomic::Ordering::Relaxed);
    }

    /// Ends once nothing happened for `timeout`: no connection, no part of the body taken,
    /// no answer.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            let last =
                Duration::from_micros(self.last_us.load(std::sync::atomic::Ordering::Relaxed));
            let due = self.start + last + timeout;
            if tokio::time::Instant::now() >= due {
                return;
            }
            tokio::time::sleep_until(due).await;
        }
    }
}

/// The client's request body on its way upstream, each part of it counted as progress: a
/// slow upload is not an upstream that does not answer.
pub struct Upload {
    inner: Incoming,
    progress: Arc<Progress>,
}

impl Upload {
    fn new(inner: Incoming, progress: Arc<Progress>) -> Self {
        Self { inner, progress }
    }
}

impl http_body::Body for Upload {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if polled.is_ready() {
            self.progress.made();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The upstream's response body on its way to the client: one that sends nothing for the
/// upstream timeout ends with an error, which cuts the client's connection (nothing else
/// can tell it the body is incomplete).
pub struct Download {
    inner: Incoming,
    timeout: Duration,
    /// Armed while a part is awaited.
    idle: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Download {
    fn new(inner: Incoming, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            idle: None,
        }
    }
}

impl http_body::Body for Download {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some(idle) = &mut this.idle {
                    idle.as_mut()
                        .reset(tokio::time::Instant::now() + this.timeout);
                }
                Poll::Ready(frame.map(|f| f.map_err(BoxError::from)))
            }
            Poll::Pending => {
                let timeout = this.timeout;
                let idle = this
                    .idle
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match idle.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        tracing::debug!(
                            timeout_ms = timeout.as_millis() as u64,
                            "upstream body stalled; the client's connection is cut"
                        );
                        Poll::Ready(Some(Err("the upstream's body stalled".into())))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl tower::Service<Request<Incoming>> for ProxyConnection {
    type Response = Response<ProxyBody>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(req).await) })
    }
}

/// A response of the proxy's own: `status` and one line of text.
fn text(status: StatusCode, line: &'static str) -> Response<ProxyBody> {
    let mut res = Response::new(Either::Right(Full::new(Bytes::from_static(
        line.as_bytes(),
    ))));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name) || name == header::UPGRADE
}

/// Drops the hop-by-hop headers, and those the `Connection` header names. Looks before it
/// removes: most messages carry none, or only `Connection`.
fn drop_hop_by_hop(headers: &mut HeaderMap) {
    while let Some(name) = headers.keys().find(|name| is_hop_by_hop(name)).cloned() {
        if name == header::CONNECTION {
            let named: Vec<HeaderName> = headers
                .get_all(header::CONNECTION)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .map(str::trim)
                // The usual options, never header names worth a lookup.
                .filter(|o| {
                    !o.eq_ignore_ascii_case("close") && !o.eq_ignore_ascii_case("keep-alive")
                })
                .filter_map(|o| HeaderName::from_bytes(o.as_bytes()).ok())
                .collect();
            for name in &named {
                headers.remove(name);
            }
        }
        headers.remove(&name);
    }
}

/// Appends the client's address to `x-forwarded-for` (every line of it joined, in order).
fn forwarded_for(headers: &mut HeaderMap, client: &HeaderValue) {
    const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");
    let mut joined = Vec::new();
    for before in headers.get_all(&XFF) {
        if !before.is_empty() {
            joined.extend_from_slice(before.as_bytes());
            joined.extend_from_slice(b", ");
        }
    }
    let value = match joined.is_empty() {
        true => client.clone(),
        false => {
            joined.extend_from_slice(client.as_bytes());
            match HeaderValue::from_bytes(&joined) {
                Ok(value) => value,
                Err(_) => return,
            }
        }
    };
    headers.insert(XFF, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls_are_read_or_refused() {
        let u = Upstream::parse("http://127.0.0.1:8080/api/").unwrap();
        assert_eq!(u.describe(), "http://127.0.0.1:8080/api");
        let target = |u: &Upstream, t: &str| u.target(t.parse().unwrap()).unwrap().to_string();
        assert_eq!(target(&u, "/v1/x?a=%2F&b"), "/api/v1/x?a=%2F&b");
        assert_eq!(target(&u, "http://elsewhere/v1?q"), "/api/v1?q");
        assert_eq!(u.address(), ("127.0.0.1", 8080));
        let bare = Upstream::parse("http://backend").unwrap();
        assert_eq!(target(&bare, "/"), "/");
        assert_eq!(target(&bare, "/a%20b?c=d"), "/a%20b?c=d");
        assert_eq!(bare.address(), ("backend", 80));
        for escape in ["/../admin", "/a/./b", "/%2e%2E/admin", "/a/%2E/b", "/.."] {
            assert!(u.target(escape.parse().unwrap()).is_err(), "{escape}");
        }
        assert_eq!(target(&u, "/a..b/.c/d."), "/api/a..b/.c/d.");
        let v6 = Upstream::parse("http://[::1]:9000").unwrap();
        assert_eq!(v6.address(), ("::1", 9000));
        for bad in [
            "https://backend",
            "backend:80",
            "http://",
            "http://u:p@backend",
            "http://backend/?q=1",
            "http://backend/#f",
            "ftp://backend",
        ] {
            assert!(Upstream::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hop_by_hop_headers_go_and_the_client_is_appended() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-private"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert("x-kept", HeaderValue::from_static("yes"));
        h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.7"));
        h.append("x-forwarded-for", HeaderValue::from_static("198.51.100.9"));
        drop_hop_by_hop(&mut h);
        forwarded_for(&mut h, &HeaderValue::from_static("10.0.0.2"));
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h["x-kept"], "yes");
        assert_eq!(h["x-forwarded-for"], "203.0.113.7, 198.51.100.9, 10.0.0.2");
    }
}
