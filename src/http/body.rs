//! The response body of every middleware of this crate: the inner service's, or one the
//! limiter (or a custom rejection) wrote, with a guard held until the body ends.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt};
use pin_project_lite::pin_project;

/// The error type of [`ResponseBody`]: the inner body's error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed body, as custom rejections give them.
pub(crate) type BoxBody = UnsyncBoxBody<Bytes, BoxError>;

/// What a body holds until it ends: a concurrency permit, given back when the response is
/// over (its last frame read, an error, or the body dropped).
pub(crate) trait Guard: Send + Sync {}

impl<T: Send + Sync> Guard for T {}

/// What a body does with its trailers before it passes them on: the work it returns (a
/// settlement from a trailer) is done before the trailers frame is, so the client has the end
/// of the body only once it is done.
pub(crate) trait OnTrailers: Send {
    fn on_trailers(&mut self, trailers: &HeaderMap)
        -> Option<crate::store::BoxFuture<'static, ()>>;
}

/// A body's trailers hook, and the work it started with the trailers frame it holds back.
struct Trailers {
    hook: Box<dyn OnTrailers>,
    pending: Option<(crate::store::BoxFuture<'static, ()>, Frame<Bytes>)>,
}

pin_project! {
    /// Body of responses passing through this crate's middleware
    /// ([`RateLimit`](crate::rate_limit::RateLimit), [`ConcurrencyLimit`](crate::concurrency::ConcurrencyLimit)): the
    /// inner service's body, the body of a rejection written by the limiter, or the body of
    /// a custom rejection ([`RateLimitLayer::on_limited`](crate::RateLimitLayer::on_limited)).
    /// Behind a concurrency limit, the inner service's body holds the request's permit until
    /// its last frame (or an error) has been read, or it is dropped.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
        guard: Option<Box<dyn Guard>>,
        trailers: Option<Box<Trailers>>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
        Boxed { #[pin] body: UnsyncBoxBody<Bytes, BoxError> },
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "inner",
            Kind::Full { .. } => "limiter",
            Kind::Boxed { .. } => "custom",
        };
        f.debug_struct("ResponseBody")
            .field("kind", &kind)
            .field("guarded", &self.guard.is_some())
            .field("reads_trailers", &self.trailers.is_some())
            .finish()
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
            guard: None,
            trailers: None,
        }
    }

    /// The inner service's body, holding `guard` until it ends.
    pub(crate) fn guarded(body: B, guard: Option<impl Guard + 'static>) -> Self {
        Self {
            kind: Kind::Inner { body },
            guard: guard.map(|g| Box::new(g) as Box<dyn Guard>),
            trailers: None,
        }
    }

    /// This body, with `hook` run on its trailers before they are passed on.
    pub(crate) fn on_trailers(mut self, hook: Option<Box<dyn OnTrailers>>) -> Self {
        self.trailers = hook.map(|hook| {
            Box::new(Trailers {
                hook,
                pending: None,
            })
        });
        self
    }

    pub(crate) fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            guard: None,
            trailers: None,
        }
    }

    pub(crate) fn boxed(body: BoxBody) -> Self {
        Self {
            kind: Kind::Boxed { body },
            guard: None,
            trailers: None,
        }
    }
}

impl ResponseBody<std::convert::Infallible> {
    /// A body the limiter wrote (it holds no inner body), as the body of any inner service's
    /// responses: rejections are built before the inner service's body type matters.
    pub(crate) fn written<B>(self) -> ResponseBody<B> {
        let kind = match self.kind {
            Kind::Inner { body } => match body {},
            Kind::Full { data } => Kind::Full { data },
            Kind::Boxed { body } => Kind::Boxed { body },
        };
        ResponseBody {
            kind,
            guard: self.guard,
            trailers: None,
        }
    }
}

/// Boxes any body whose data is `Bytes` (an axum `Body`, `String`, `Full<Bytes>`...).
pub(crate) fn box_body<T>(body: T) -> BoxBody
where
    T: Body<Data = Bytes> + Send + 'static,
    T::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// An empty body, so layers that write their own responses (e.g. tower-http's `TimeoutLayer`)
/// compose with the limiter.
impl<B> Default for ResponseBody<B> {
    fn default() -> Self {
        Self::full(Bytes::new())
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let mut kind = this.kind;
        if let Some(t) = this.trailers.as_deref_mut() {
            if let Some(frame) = t.poll_pending(cx) {
                return frame.map(|f| Some(Ok(f)));
            }
        }
        let frame = match kind.as_mut().project() {
            KindProj::Inner { body } => body.poll_frame(cx).map_err(Into::into),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Boxed { body } => body.poll_frame(cx),
        };
        let frame = match (frame, this.trailers.as_deref_mut()) {
            (Poll::Ready(Some(Ok(f))), Some(t)) if f.is_trailers() => t.hold(f, cx),
            (frame, _) => frame,
        };
        if this.guard.is_some() {
            let done = match &frame {
                Poll::Ready(None | Some(Err(_))) => true,
                Poll::Ready(Some(Ok(_))) => kind.is_end_stream(),
                Poll::Pending => false,
            };
            if done {
                // The response is over: let go of the guard now, not when the body is dropped.
                drop(this.guard.take());
            }
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        let held = self.trailers.as_ref().is_some_and(|t| t.pending.is_some());
        !held && self.kind.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.kind.size_hint()
    }
}

impl Trailers {
    /// Runs the hook on the trailers frame `f`: with work to do, holds the frame back until
    /// it is done.
    fn hold(
        &mut self,
        f: Frame<Bytes>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let work = f.trailers_ref().and_then(|t| self.hook.on_trailers(t));
        let Some(work) = work else {
            return Poll::Ready(Some(Ok(f)));
        };
        self.pending = Some((work, f));
        // Just held: `poll_pending` has a frame to give.
        let polled = self.poll_pending(cx);
        polled.map_or(Poll::Ready(None), |p| p.map(|f| Some(Ok(f))))
    }

    /// The held trailers frame once the work on it is done; `None` when none is held.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Option<Poll<Frame<Bytes>>> {
        let (work, _) = self.pending.as_mut()?;
        if work.as_mut().poll(cx).is_pending() {
            return Some(Poll::Pending);
        }
        self.pending.take().map(|(_, f)| Poll::Ready(f))
    }
}

impl<B: Body> Kind<B> {
    fn is_end_stream(&self) -> bool {
        match self {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
            Kind::Boxed { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Boxed { body } => body.size_hint(),
        }
    }
}
