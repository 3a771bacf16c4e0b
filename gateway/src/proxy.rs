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
    sync::{
        atomic::{AtomicU8, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll, Waker},
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
    idle: Mutex<Vec<(Link, Instant)>>,
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
                link: Mutex::new(None),
                progress: Arc::new(Progress::new()),
                timer: Mutex::new(None),
            }),
            client: HeaderValue::from_str(&client.ip().to_string())
                .expect("an address is a header value"),
        }
    }
}

impl Shared {
    /// The most recently used idle connection not known to be closed and not too old.
    fn checkout(&self) -> Option<Link> {
        let mut idle = crate::locked(&self.idle);
        while let Some((link, since)) = idle.pop() {
            if !link.is_closed() && since.elapsed() < IDLE_TIMEOUT {
                return Some(link);
            }
        }
        None
    }

    /// Keeps a connection for later, dropping those closed or too old.
    fn checkin(&self, link: Link) {
        if link.is_closed() {
            return;
        }
        // Until a client connection takes it, its wake-ups wake no task.
        link.group.forget_task();
        let now = Instant::now();
        let mut idle = crate::locked(&self.idle);
        idle.retain(|(l, since)| !l.is_closed() && now.duration_since(*since) < IDLE_TIMEOUT);
        if idle.len() < MAX_IDLE {
            idle.push((link, now));
        }
    }

    /// Drives a connection still busy with a request (its body, which the upstream answered
    /// before it took it all) to its end in a task of its own, then pools it.
    #[cold]
    #[inline(never)]
    fn finish(self: &Arc<Self>, mut link: Link) {
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            let ready =
                std::future::poll_fn(|cx| link.poll_with(cx, |sender, cx| sender.poll_ready(cx)))
                    .await;
            if ready.is_ok() {
                shared.checkin(link);
            }
        });
    }

    /// A new connection to the upstream.
    async fn connect(&self) -> Result<Link, BoxError> {
        let stream = tokio::net::TcpStream::connect(self.upstream.address()).await?;
        stream.set_nodelay(true)?;
        // Heads and small bodies copied into one buffer, written by one `write`.
        let (sender, connection) = hyper::client::conn::http1::Builder::new()
            .writev(false)
            .handshake(TokioIo::new(stream))
            .await?;
        Ok(Link::new(sender, connection))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

type Connection = hyper::client::conn::http1::Connection<TokioIo<tokio::net::TcpStream>, Upload>;

/// One upstream connection: the handle its requests are sent with, and the connection itself,
/// which has no task of its own. What waits on it polls it, in the task of the client
/// connection it serves: a request while it waits for its response's head, a response body
/// while it waits for its next part. Between requests nothing polls it; the next request
/// finds out whether the upstream closed it meanwhile.
struct Link {
    sender: SendRequest<Upload>,
    /// `None` once ended (closed by either side, or failed). Dropping it hands a request
    /// queued on it back unwritten.
    connection: Option<Pin<Box<Connection>>>,
    group: Arc<Group>,
    /// The wakers the connection and what waits on it are polled with: each marks its part
    /// of `group` as woken.
    connection_waker: Waker,
    waiter_waker: Waker,
}

impl Link {
    fn new(sender: SendRequest<Upload>, connection: Connection) -> Self {
        let group = Arc::new(Group {
            // A new connection is polled first.
            state: AtomicU8::new(CONNECTION),
            task: Mutex::new(None),
        });
        let waker = |part| {
            Waker::from(Arc::new(Part {
                group: Arc::clone(&group),
                part,
            }))
        };
        Self {
            sender,
            connection: Some(Box::pin(connection)),
            connection_waker: waker(CONNECTION),
            waiter_waker: waker(WAITER),
            group,
        }
    }

    fn is_closed(&self) -> bool {
        self.connection.is_none() || self.sender.is_closed()
    }

    /// Polls `wait` (what waits on the connection, given its sender) and the connection as
    /// one, each when woken (`wait` also the first time, before the connection), until
    /// `wait` is ready or neither can go on: a wake-up of one by the other while they are
    /// polled has it polled again at once rather than the whole task again; one at another
    /// time (the upstream's socket) wakes the task in `cx`.
    fn poll_with<T>(
        &mut self,
        cx: &mut Context<'_>,
        mut wait: impl FnMut(&mut SendRequest<Upload>, &mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        let group = &*self.group;
        group.enter(cx.waker());
        let mut first = true;
        for _ in 0..ROUNDS {
            if std::mem::take(&mut first) || group.take(WAITER) {
                let mut cx = Context::from_waker(&self.waiter_waker);
                if let Poll::Ready(value) = wait(&mut self.sender, &mut cx) {
                    group.leave();
                    return Poll::Ready(value);
                }
            }
            if group.take(CONNECTION) {
                if let Some(connection) = &mut self.connection {
                    let mut cx = Context::from_waker(&self.connection_waker);
                    if let Poll::Ready(ended) = connection.as_mut().poll(&mut cx) {
                        if let Err(e) = ended {
                            tracing::debug!(error = %e, "upstream connection ended");
                        }
                        // Hands back, unwritten, a request queued on it.
                        self.connection = None;
                    }
                }
            }
            if group.leave_unless_woken() {
                return Poll::Pending;
            }
        }
        // Still woken after as many rounds: the task's other work gets its turn first.
        group.leave();
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// The most rounds of [`Link::poll_with`] in one poll.
const ROUNDS: usize = 16;

/// The state of a [`Link`]'s wake-ups: whether it is being polled, and which of its parts
/// were woken since they were last polled.
struct Group {
    state: AtomicU8,
    /// The task that polled the link last, woken by a wake-up while it is not polled; none
    /// while the link is idle in the pool.
    task: Mutex<Option<Waker>>,
}

/// [`Group::state`]: the link is being polled.
const POLLING: u8 = 1;
/// [`Group::state`]: the connection was woken.
const CONNECTION: u8 = 2;
/// [`Group::state`]: what waits on the connection was woken.
const WAITER: u8 = 4;

impl Group {
    fn enter(&self, task: &Waker) {
        {
            let mut held = crate::locked(&self.task);
            if !held.as_ref().is_some_and(|t| t.will_wake(task)) {
                *held = Some(task.clone());
            }
        }
        self.state.fetch_or(POLLING, Ordering::AcqRel);
    }

    /// Whether `part` was woken, which it no longer is.
    fn take(&self, part: u8) -> bool {
        self.state.load(Ordering::Acquire) & part != 0
            && self.state.fetch_and(!part, Ordering::AcqRel) & part != 0
    }

    /// Ends the polling, `true`, unless a part was woken meanwhile.
    fn leave_unless_woken(&self) -> bool {
        self.state
            .compare_exchange(POLLING, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Ends the polling once what waits is ready. A connection woken meanwhile stays marked
    /// woken, polled by what next waits on it: what took the response's head polls the link
    /// for the body at once, a body for its next part when the client can take it, the next
    /// request when it comes.
    fn leave(&self) {
        self.state.fetch_and(!(POLLING | WAITER), Ordering::AcqRel);
    }

    fn wake(&self, part: u8) {
        let before = self.state.fetch_or(part, Ordering::AcqRel);
        // Polled now, it is polled again before the polling ends; woken before, the task
        // was woken then.
        if before & (POLLING | part) == 0 {
            self.wake_task();
        }
    }

    fn wake_task(&self) {
        if let Some(task) = crate::locked(&self.task).as_ref() {
            task.wake_by_ref();
        }
    }

    fn forget_task(&self) {
        *crate::locked(&self.task) = None;
    }
}

/// One part of a [`Group`], as a waker.
struct Part {
    group: Arc<Group>,
    part: u8,
}

impl std::task::Wake for Part {
    fn wake(self: Arc<Self>) {
        self.group.wake(self.part);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.group.wake(self.part);
    }
}

/// The proxy as one client connection sees it. Its requests go over one upstream connection
/// in turn (HTTP/1 answers one request at a time): taken from the pool, or opened, for the
/// first, and given back to the pool when the client's connection ends.
#[derive(Clone)]
pub struct ProxyConnection {
    held: Arc<Held>,
    /// The client's address, as `x-forwarded-for` gets it.
    client: HeaderValue,
}

/// The upstream connection a client connection holds between its requests, and what its
/// requests (one at a time) reuse: the record of their progress and the timer of the
/// upstream timeout.
struct Held {
    shared: Arc<Shared>,
    link: Mutex<Option<Link>>,
    progress: Arc<Progress>,
    /// Pushed later at each request: a later deadline costs no new place in the timer wheel.
    timer: Mutex<Option<Pin<Box<tokio::time::Sleep>>>>,
}

impl Held {
    fn take_timer(&self) -> Pin<Box<tokio::time::Sleep>> {
        let timer = crate::locked(&self.timer).take();
        timer.unwrap_or_else(|| Box::pin(tokio::time::sleep(self.shared.timeout)))
    }

    fn put_timer(&self, timer: Pin<Box<tokio::time::Sleep>>) {
        *crate::locked(&self.timer) = Some(timer);
    }

    fn take(&self) -> Option<Link> {
        crate::locked(&self.link).take()
    }

    /// Keeps `link` for the client connection's next request (the pool gets it if one is
    /// kept already); a closed one is dropped.
    fn give_back(&self, link: Link) {
        if link.is_closed() {
            return;
        }
        if !link.sender.is_ready() {
            self.shared.finish(link);
            return;
        }
        let mut held = crate::locked(&self.link);
        match held.as_ref() {
            None => *held = Some(link),
            Some(_) => {
                drop(held);
                self.shared.checkin(link);
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let link = self
            .link
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(link) = link {
            self.shared.checkin(link);
        }
    }
}

/// How many times a request that provably did not reach the upstream (its connection closed
/// before it was written) is sent; the last time over a new connection.
const ATTEMPTS: usize = 3;

/// What became of a request given to a [`Link`].
enum Sent<F> {
    /// The connection was closed before the request could be given to it.
    Closed,
    /// The response's head, or why none came.
    Answered(F),
}

impl ProxyConnection {
    /// Sends `req` and waits for the response's head, which comes with the connection its
    /// body comes over. A request goes out once: it is sent again only when hyper hands it
    /// back unwritten. A kept connection found closed before the request was given to it
    /// is skipped without counting an attempt.
    async fn send(
        &self,
        unsent: &mut Option<Request<Upload>>,
    ) -> Result<(Response<Incoming>, Link), BoxError> {
        let shared = &self.held.shared;
        let mut attempt = 1;
        while attempt <= ATTEMPTS {
            let reused = if attempt < ATTEMPTS {
                self.held.take().or_else(|| shared.checkout())
            } else {
                None
            };
            let fresh = reused.is_none();
            let mut link = match reused {
                Some(link) => link,
                // Boxed: a connection is rare, and its future would make every request's larger.
                None => Box::pin(shared.connect()).await?,
            };
            let sent = {
                let mut response = std::pin::pin!(None);
                std::future::poll_fn(|cx| {
                    link.poll_with(cx, |sender, cx| {
                        if response.is_none() {
                            match sender.poll_ready(cx) {
                                Poll::Pending => return Poll::Pending,
                                Poll::Ready(Err(_)) => return Poll::Ready(Sent::Closed),
                                Poll::Ready(Ok(())) => {
                                    let req = unsent.take().expect("sent once");
                                    response.set(Some(sender.try_send_request(req)));
                                }
                            }
                        }
                        let response = response.as_mut().as_pin_mut().expect("sent");
                        response.poll(cx).map(Sent::Answered)
                    })
                })
                .await
            };
            match sent {
                Sent::Closed => {
                    if fresh {
                        attempt += 1;
                    }
                }
                Sent::Answered(Ok(res)) => return Ok((res, link)),
                Sent::Answered(Err(mut e)) => match e.take_message() {
                    Some(back) => {
                        *unsent = Some(back);
                        attempt += 1;
                    }
                    None => return Err(e.into_error().into()),
                },
            }
        }
        Err("the upstream closed every connection the request was given to".into())
    }

    /// The request as it goes upstream: its target after the prefix, HTTP/1.1, its hop-by-hop
    /// headers dropped, the client appended to `x-forwarded-for`, a `Host`; `None` for a target
    /// that leaves the prefix.
    fn upstream_request(&self, req: Request<Incoming>) -> Option<Request<Upload>> {
        let shared = &self.held.shared;
        let (mut parts, body) = req.into_parts();
        parts.uri = match shared.upstream.target(parts.uri) {
            Ok(uri) => uri,
            Err(_) => return None,
        };
        // HTTP/1.1 to the upstream, whatever the client spoke.
        parts.version = http::Version::HTTP_11;
        drop_hop_by_hop(&mut parts.headers);
        forwarded_for(&mut parts.headers, &self.client);
        if let header::Entry::Vacant(host) = parts.headers.entry(header::HOST) {
            host.insert(shared.host.clone());
        }
        let progress = &self.held.progress;
        progress.restart();
        let body = Upload::new(body, Arc::clone(progress));
        Some(Request::from_parts(parts, body))
    }

    /// The request to the upstream, its answer back. The request stays in `req` (the
    /// future's one copy of it) until it is given to a connection.
    async fn forward(
        self,
        mut req: Option<Request<Upload>>,
    ) -> Result<Response<ProxyBody>, std::convert::Infallible> {
        let shared = &self.held.shared;
        let progress = &self.held.progress;
        let mut timer = self.held.take_timer();
        let answered = {
            // Polled where they are, not moved into the select.
            let sent = std::pin::pin!(self.send(&mut req));
            let idle = std::pin::pin!(progress.idle_for(shared.timeout, &mut timer));
            tokio::select! {
                biased;
                answered = sent => Some(answered),
                () = idle => None,
            }
        };
        self.held.put_timer(timer);
        Ok(match answered {
            Some(Ok((res, link))) => {
                let (mut parts, body) = res.into_parts();
                drop_hop_by_hop(&mut parts.headers);
                let timeout = shared.timeout;
                let body = Download::new(body, link, Arc::clone(&self.held), timeout);
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
        })
    }
}

/// When the request in flight on a client connection last made progress: its start, then
/// each part of its body taken by the upstream connection. The upstream's time to answer
/// counts from the last.
struct Progress {
    /// The client connection's start.
    epoch: tokio::time::Instant,
    /// Microseconds from `epoch` to the last progress.
    last_us: std::sync::atomic::AtomicU64,
}

impl Progress {
    fn new() -> Self {
        Self {
            epoch: tokio::time::Instant::now(),
            last_us: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// A request starts.
    fn restart(&self) {
        self.last_us
            .store(self.now_us(), std::sync::atomic::Ordering::Relaxed);
    }

    fn made(&self) {
        self.last_us
            .fetch_max(self.now_us(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Ends once nothing happened for `timeout`: no connection, no part of the body taken,
    /// no answer. `timer` is set to each deadline in turn.
    async fn idle_for(&self, timeout: Duration, timer: &mut Pin<Box<tokio::time::Sleep>>) {
        loop {
            let last =
                Duration::from_micros(self.last_us.load(std::sync::atomic::Ordering::Relaxed));
            let due = self.epoch + last + timeout;
            if tokio::time::Instant::now() >= due {
                return;
            }
            timer.as_mut().reset(due);
            timer.as_mut().await;
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

/// The upstream's response body on its way to the client, polling the connection it comes
/// over while it waits for a part. Its end gives the connection back to the client
/// connection for its next request; a body dropped before its end drops the connection.
/// One that sends nothing for the upstream timeout ends with an error, which cuts the
/// client's connection (nothing else can tell it the body is incomplete).
pub struct Download {
    inner: Incoming,
    /// The connection the body comes over, until the body ends.
    link: Option<Link>,
    held: Arc<Held>,
    timeout: Duration,
    /// Armed while a part is awaited.
    idle: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Download {
    fn new(inner: Incoming, link: Link, held: Arc<Held>, timeout: Duration) -> Self {
        Self {
            inner,
            link: Some(link),
            held,
            timeout,
            idle: None,
        }
    }

    /// The body ended: its connection serves the client connection's next request.
    fn give_back(&mut self) {
        if let Some(link) = self.link.take() {
            self.held.give_back(link);
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
        let inner = &mut this.inner;
        let polled = match &mut this.link {
            Some(link) => link.poll_with(cx, |_, cx| Pin::new(&mut *inner).poll_frame(cx)),
            None => Pin::new(inner).poll_frame(cx),
        };
        match polled {
            Poll::Ready(frame) => {
                match &frame {
                    Some(Ok(_)) if !this.inner.is_end_stream() => {}
                    Some(Ok(_)) | None => this.give_back(),
                    Some(Err(_)) => this.link = None,
                }
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
                        this.link = None;
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

impl Drop for Download {
    fn drop(&mut self) {
        // A body without content (an empty one, a `HEAD`'s) is never polled.
        if http_body::Body::is_end_stream(&self.inner) {
            self.give_back();
        }
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
        match self.upstream_request(req) {
            Some(req) => Box::pin(self.clone().forward(Some(req))),
            None => Box::pin(std::future::ready(Ok(text(
                StatusCode::BAD_REQUEST,
                "bad request target\n",
            )))),
        }
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

/// Whether `name` concerns one connection, not the message (RFC 9110, 7.6.1), never
/// forwarded either way: `connection`, `keep-alive`, `proxy-connection`, `proxy-authenticate`,
/// `proxy-authorization`, `te`, `trailer`, `transfer-encoding`, `upgrade`. Told apart by
/// length first: most names are none of them and cost one comparison.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    let name = name.as_str();
    match name.len() {
        2 => name == "te",
        7 => name == "trailer" || name == "upgrade",
        10 => name == "connection" || name == "keep-alive",
        16 => name == "proxy-connection",
        17 => name == "transfer-encoding",
        18 => name == "proxy-authenticate",
        19 => name == "proxy-authorization",
        _ => false,
    }
}

/// Drops the hop-by-hop headers, and those the `Connection` header names. Looks once before
/// it removes: most messages carry none, or only `Connection` with its usual options.
fn drop_hop_by_hop(headers: &mut HeaderMap) {
    let (mut connection, mut others) = (false, false);
    for name in headers.keys().filter(|name| is_hop_by_hop(name)) {
        match *name == header::CONNECTION {
            true => connection = true,
            false => others = true,
        }
    }
    if connection {
        let mut named: Vec<HeaderName> = Vec::new();
        for value in headers.get_all(header::CONNECTION) {
            for option in value.as_bytes().split(|&b| b == b',') {
                let option = option.trim_ascii();
                // The usual options, never header names worth a lookup.
                if option.is_empty()
                    || option.eq_ignore_ascii_case(b"close")
                    || option.eq_ignore_ascii_case(b"keep-alive")
                {
                    continue;
                }
                if let Ok(name) = HeaderName::from_bytes(option) {
                    named.push(name);
                }
            }
        }
        headers.remove(header::CONNECTION);
        for name in &named {
            headers.remove(name);
        }
    }
    if others {
        while let Some(name) = headers.keys().find(|name| is_hop_by_hop(name)).cloned() {
            headers.remove(&name);
        }
    }
}

/// Appends the client's address to `x-forwarded-for` (every line of it joined, in order).
/// One lookup of the name: a request without the header gets the address as it is.
fn forwarded_for(headers: &mut HeaderMap, client: &HeaderValue) {
    const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");
    let mut before = match headers.entry(XFF) {
        header::Entry::Vacant(entry) => {
            entry.insert(client.clone());
            return;
        }
        header::Entry::Occupied(entry) => entry,
    };
    let mut joined = Vec::new();
    for value in before.iter() {
        if !value.is_empty() {
            joined.extend_from_slice(value.as_bytes());
            joined.extend_from_slice(b", ");
        }
    }
    joined.extend_from_slice(client.as_bytes());
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        before.insert(value);
    }
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

    #[test]
    fn every_connection_line_goes_with_what_each_names() {
        // Only `Connection`, with its usual option.
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        h.insert("x-kept", HeaderValue::from_static("yes"));
        drop_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h["x-kept"], "yes");
        // Two lines, each naming a header; one also names a hop-by-hop header.
        let mut h = HeaderMap::new();
        h.append(header::CONNECTION, HeaderValue::from_static("close, x-one"));
        h.append(header::CONNECTION, HeaderValue::from_static("X-Two ,te"));
        for name in ["x-one", "x-two", "te", "x-three"] {
            h.insert(name, HeaderValue::from_static("1"));
        }
        drop_hop_by_hop(&mut h);
        assert_eq!(h.keys().collect::<Vec<_>>(), ["x-three"], "{h:?}");
    }
}
