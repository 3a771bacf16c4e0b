//! The response future: decide, then call the inner service only if allowed.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::{body::ResponseBody, response::Responder};
use crate::{BoxFuture, Decision, Error, FailurePolicy};

pin_project! {
    /// Response future of [`RateLimit`](crate::RateLimit).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
        responder: Arc<Responder>,
        failure: FailurePolicy,
        grpc: bool,
        // The IETF `pk` parameter, when the layer writes one.
        partition_key: Option<String>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        Checking {
            check: Check,
            request: Option<(Request<B>, S)>,
        },
        Calling {
            #[pin]
            future: S::Future,
            decision: Option<Decision>,
        },
    }
}

/// The decision: already made in `call`, or on its way.
pub(crate) enum Check {
    Ready(Option<Result<Decision, Error>>),
    Pending(BoxFuture<'static, Result<Decision, Error>>),
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(crate) fn decided(
        result: Result<Decision, Error>,
        request: Request<B>,
        service: S,
        responder: Arc<Responder>,
        failure: FailurePolicy,
        grpc: bool,
        partition_key: Option<String>,
    ) -> Self {
        Self::with_check(
            Check::Ready(Some(result)),
            request,
            service,
            responder,
            (failure, grpc, partition_key),
        )
    }

    pub(crate) fn checking(
        check: BoxFuture<'static, Result<Decision, Error>>,
        request: Request<B>,
        service: S,
        responder: Arc<Responder>,
        failure: FailurePolicy,
        grpc: bool,
        partition_key: Option<String>,
    ) -> Self {
        Self::with_check(
            Check::Pending(check),
            request,
            service,
            responder,
            (failure, grpc, partition_key),
        )
    }

    fn with_check(
        check: Check,
        request: Request<B>,
        service: S,
        responder: Arc<Responder>,
        (failure, grpc, partition_key): (FailurePolicy, bool, Option<String>),
    ) -> Self {
        Self {
            state: State::Checking {
                check,
                request: Some((request, service)),
            },
            responder,
            failure,
            grpc,
            partition_key,
        }
    }

    pub(crate) fn unchecked(
        request: Request<B>,
        mut service: S,
        responder: Arc<Responder>,
    ) -> Self {
        Self {
            state: State::Calling {
                future: service.call(request),
                decision: None,
            },
            responder,
            failure: FailurePolicy::Open,
            grpc: false,
            partition_key: None,
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking { check, request } => {
                    let result = match check {
                        Check::Pending(check) => ready!(check.as_mut().poll(cx)),
                        Check::Ready(result) => {
                            // Decided without waiting: still spend the task's budget, so a
                            // loop of such requests lets the runtime run other tasks.
                            ready!(tokio::task::coop::poll_proceed(cx)).made_progress();
                            result
                                .take()
                                .expect("ResponseFuture polled after completion")
                        }
                    };
                    let (req, mut service) = request
                        .take()
                        .expect("ResponseFuture polled after completion");
                    let decision = match result {
                        // The limiter logged the decision (see `telemetry`).
                        Ok(d) if d.allowed => Some(d),
                        Ok(d) => {
                            let pk = this.partition_key.as_deref();
                            return Poll::Ready(Ok(this.responder.denied(&d, *this.grpc, pk)));
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, policy = ?this.failure, "rate limit: store failed");
                            // Under `Local`, an error reaching here was not about availability
                            // (or the local twin failed): reject rather than let it through.
                            if *this.failure != FailurePolicy::Open {
                                return Poll::Ready(Ok(this.responder.unavailable(*this.grpc)));
                            }
                            None
                        }
                    };
                    let future = service.call(req);
                    this.state.set(State::Calling { future, decision });
                }
                StateProj::Calling { future, decision } => {
                    let mut res = ready!(future.poll(cx))?;
                    if let Some(d) = decision.take() {
                        let pk = this.partition_key.as_deref();
                        this.responder.allowed(&d, &mut res, pk);
                    }
                    return Poll::Ready(Ok(res.map(ResponseBody::inner)));
                }
            }
        }
    }
}
