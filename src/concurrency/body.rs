//! The response body: holds the request's slot until it ends or is dropped.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::{rate_limit::ResponseBody as Inner, BoxError, Permit};

pin_project! {
    /// Body of responses passing through [`ConcurrencyLimit`](crate::ConcurrencyLimit): the
    /// inner service's body, holding the request's slot until the last frame (or an error)
    /// has been read or the body is dropped; or the body of a refusal written by the layer.
    pub struct ResponseBody<B> {
        #[pin]
        body: Inner<B>,
        permit: Option<Permit>,
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody")
            .field("body", &self.body)
            .field("permit", &self.permit)
            .finish()
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body, holding `permit`.
    pub(crate) fn held(body: B, permit: Option<Permit>) -> Self {
        Self {
            body: Inner::inner(body),
            permit,
        }
    }

    /// A body written by the layer (a refusal), holding nothing.
    pub(crate) fn unheld(body: Inner<B>) -> Self {
        Self { body, permit: None }
    }
}

/// An empty body holding nothing, so layers that write their own responses (e.g. tower-http's
/// `TimeoutLayer`) compose with the limiter.
impl<B> Default for ResponseBody<B> {
    fn default() -> Self {
        Self::unheld(Inner::default())
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
        let mut this = self.project();
        let frame = this.body.as_mut().poll_frame(cx);
        let done = match &frame {
            Poll::Ready(None | Some(Err(_))) => true,
            Poll::Ready(Some(Ok(_))) => this.body.is_end_stream(),
            Poll::Pending => false,
        };
        if done {
            // The response is over: give the slot back now, not when the body is dropped.
            drop(this.permit.take());
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
