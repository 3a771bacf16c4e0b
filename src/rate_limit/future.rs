//! The response future: decide, then call the inner service only if allowed.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
    time::Duration,
};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::{body::ResponseBody, counting::CountFn, response::Responder};
use crate::{limiter::Engine, BoxFuture, Decision, Error, FailurePolicy, Key};

pin_project! {
    /// Response future of [`RateLimit`](crate::RateLimit).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
        responder: Arc<Responder>,
        answer: Answer,
    }
}

/// How to answer one request, besides the decision.
pub(crate) struct Answer {
    /// The policy's policy on store errors.
    pub(crate) failure: FailurePolicy,
    /// The policy's shadow mode: a denial goes on to the inner service.
    pub(crate) shadow: Option<Arc<Engine>>,
    pub(crate) grpc: bool,
    /// The IETF `pk` parameter, when the layer writes one.
    pub(crate) partition_key: Option<String>,
    /// When the layer counts only some responses: how to give the others' units back.
    pub(crate) refund: Option<Refund>,
}

/// What giving back an uncounted response's units takes.
pub(crate) struct Refund {
    pub(crate) policy: Arc<Engine>,
    pub(crate) key: Option<Key<'static>>,
    pub(crate) count: Arc<CountFn>,
}

impl Answer {
    /// For a request that is not checked.
    fn unchecked() -> Self {
        Self {
            failure: FailurePolicy::Open,
            shadow: None,
            grpc: false,
            partition_key: None,
            refund: None,
        }
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
        Refunding {
            refund: BoxFuture<'static, Result<bool, Error>>,
            response: Option<(S::Response, Decision)>,
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
        answer: Answer,
    ) -> Self {
        Self::with_check(
            Check::Ready(Some(result)),
            request,
            service,
            responder,
            answer,
        )
    }

    pub(crate) fn checking(
        check: BoxFuture<'static, Result<Decision, Error>>,
        request: Request<B>,
        service: S,
        responder: Arc<Responder>,
        answer: Answer,
    ) -> Self {
        Self::with_check(Check::Pending(check), request, service, responder, answer)
    }

    fn with_check(
        check: Check,
        request: Request<B>,
        service: S,
        responder: Arc<Responder>,
        answer: Answer,
    ) -> Self {
        Self {
            state: State::Checking {
                check,
                request: Some((request, service)),
            },
            responder,
            answer,
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
            answer: Answer::unchecked(),
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
                    let answer = &*this.answer;
                    let decision = match result {
                        // The limiter logged the decision (see `telemetry`).
                        Ok(d) if d.allowed => Some(d),
                        Ok(d) => match &answer.shadow {
                            Some(policy) => {
                                policy.shadow_denied(&d);
                                Some(d)
                            }
                            None => {
                                let pk = answer.partition_key.as_deref();
                                return Poll::Ready(Ok(this.responder.denied(&d, answer.grpc, pk)));
                            }
                        },
                        Err(e) => {
                            tracing::warn!(error = %e, policy = ?answer.failure, "rate limit: store failed");
                            // Under `Local`, an error reaching here was not about availability
                            // (or the local twin failed): reject rather than let it through.
                            // In shadow mode, never.
                            if answer.failure != FailurePolicy::Open && answer.shadow.is_none() {
                                return Poll::Ready(Ok(this.responder.unavailable(answer.grpc)));
                            }
                            None
                        }
                    };
                    let future = service.call(req);
                    this.state.set(State::Calling { future, decision });
                }
                StateProj::Calling { future, decision } => {
                    let mut res = ready!(future.poll(cx))?;
                    let Some(d) = decision.take() else {
                        return Poll::Ready(Ok(res.map(ResponseBody::inner)));
                    };
                    // Not counted: give the units back before answering.
                    let uncounted = this.answer.refund.take().and_then(|r| {
                        let charge = *d.charge()?;
                        (!(r.count)(res.status(), res.headers())).then_some((r, charge))
                    });
                    if let Some((r, charge)) = uncounted {
                        let refund: BoxFuture<'static, _> = Box::pin(async move {
                            r.policy.refund(r.key.as_ref(), &charge, None).await
                        });
                        this.state.set(State::Refunding {
                            refund,
                            response: Some((res, d)),
                        });
                        continue;
                    }
                    let pk = this.answer.partition_key.as_deref();
                    this.responder.allowed(&d, &mut res, pk);
                    return Poll::Ready(Ok(res.map(ResponseBody::inner)));
                }
                StateProj::Refunding { refund, response } => {
                    let given = ready!(refund.as_mut().poll(cx));
                    let (mut res, mut d) = response
                        .take()
                        .expect("ResponseFuture polled after completion");
                    if let Ok(true) = given {
                        // The units are back; a quota full again resets now. Otherwise the
                        // reset time stays the charge's, an upper bound.
                        d.remaining = d.limit.min(d.remaining + u64::from(d.cost));
                        if d.remaining == d.limit {
                            d.reset_after = Duration::ZERO;
                        }
                    }
                    let pk = this.answer.partition_key.as_deref();
                    this.responder.allowed(&d, &mut res, pk);
                    return Poll::Ready(Ok(res.map(ResponseBody::inner)));
                }
            }
        }
    }
}
