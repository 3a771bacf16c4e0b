//! The response future: take a permit, then call the inner service only if one was free.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::{limiter::ConcurrencyLimiter, permit::Permit, Busy};
use crate::core::quiet::{self, Cause};
use crate::{
    error::{Error, ErrorChain},
    http::{headers::render_concurrency, Responder, ResponseBody},
    store::BoxFuture,
    store::FailurePolicy,
};

/// How to answer one request.
pub(crate) struct Answer {
    pub(crate) responder: Arc<Responder<Busy>>,
    pub(crate) limiter: ConcurrencyLimiter,
    pub(crate) grpc: bool,
}

pin_project! {
    /// Response future of [`ConcurrencyLimit`](super::ConcurrencyLimit). Dropping it gives
    /// back the permit it holds (or is taking).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
        answer: Answer,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        Acquiring {
            acquire: BoxFuture<'static, Result<Option<Permit>, Error>>,
            request: Option<(Request<B>, S)>,
        },
        Calling {
            #[pin]
            future: S::Future,
            permit: Option<Permit>,
        },
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(crate) fn acquiring(
        acquire: BoxFuture<'static, Result<Option<Permit>, Error>>,
        request: Request<B>,
        service: S,
        answer: Answer,
    ) -> Self {
        Self {
            state: State::Acquiring {
                acquire,
                request: Some((request, service)),
            },
            answer,
        }
    }

    pub(crate) fn unchecked(request: Request<B>, mut service: S, answer: Answer) -> Self {
        Self {
            state: State::Calling {
                future: service.call(request),
                permit: None,
            },
            answer,
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
                StateProj::Acquiring { acquire, request } => {
                    // An in-memory store answers at once: spend the task's budget, so a loop
                    // of such requests lets the runtime run other tasks.
                    let coop = ready!(tokio::task::coop::poll_proceed(cx));
                    let result = ready!(acquire.as_mut().poll(cx));
                    coop.made_progress();
                    let (req, mut service) = request
                        .take()
                        .expect("ResponseFuture polled after completion");
                    let answer = &*this.answer;
                    let limiter = &answer.limiter;
                    let permit = match result {
                        Ok(Some(permit)) => Some(permit),
                        Ok(None) => {
                            let busy = Busy::new(limiter);
                            let res = answer.responder.busy(
                                &busy,
                                limiter.policy_name(),
                                limiter.max_in_flight(),
                                answer.grpc,
                            );
                            return Poll::Ready(Ok(res.map(ResponseBody::written)));
                        }
                        Err(e) => {
                            if let Some(left_out) =
                                quiet::may_log(limiter.policy_name(), Cause::StoreFailed)
                            {
                                tracing::warn!(error = %ErrorChain(&e), policy = %limiter.policy_name(), on_store_error = ?limiter.failure_policy(), left_out, "concurrency limit: store failed");
                            }
                            // Under `Local`, an error reaching here was not about availability:
                            // refuse rather than let it through unlimited.
                            if limiter.failure_policy() != FailurePolicy::Open {
                                let res = answer.responder.unavailable(answer.grpc);
                                return Poll::Ready(Ok(res.map(ResponseBody::written)));
                            }
                            None
                        }
                    };
                    let future = service.call(req);
                    this.state.set(State::Calling { future, permit });
                }
                StateProj::Calling { future, permit } => {
                    // An error drops the permit with this future: it is given back.
                    let mut res = ready!(future.poll(cx))?;
                    let permit = permit.take();
                    if let Some(p) = &permit {
                        let free = u64::from(p.max_in_flight()).saturating_sub(p.in_flight());
                        render_concurrency(
                            this.answer.responder.style,
                            p.policy_name(),
                            p.max_in_flight(),
                            free,
                            res.headers_mut(),
                        );
                    }
                    return Poll::Ready(Ok(res.map(|body| ResponseBody::guarded(body, permit))));
                }
            }
        }
    }
}
