//! The response body: the inner service's, or one the limiter (or a custom rejection) wrote.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt};
use pin_project_lite::pin_project;

/// The error type of [`ResponseBody`]: the inner body's error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// Body of responses passing through [`RateLimit`](crate::RateLimit): the inner service's
    /// body, the body of a rejection written by the limiter, or the body of a custom rejection
    /// ([`RateLimitLayer::on_limited`](crate::RateLimitLayer::on_limited)).
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
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
        f.debug_struct("ResponseBody").field("kind", &kind).finish()
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(crate) fn boxed(body: UnsyncBoxBody<Bytes, BoxError>) -> Self {
        Self {
            kind: Kind::Boxed { body },
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
        ResponseBody { kind }
    }
}

/// Boxes any body whose data is `Bytes` (an axum `Body`, `String`, `Full<Bytes>`...).
pub(crate) fn box_body<T>(body: T) -> UnsyncBoxBody<Bytes, BoxError>
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
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx).map_err(Into::into),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Boxed { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
            Kind::Boxed { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Boxed { body } => body.size_hint(),
        }
    }
}
