//! The response future: decide, then call the inner service only if allowed.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
    time::Duration,
};

use http::{HeaderMap, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::{
    counting::CountFn,
    engine::RateEngine,
    usage::{read_figure, FromTrailer, Held, SettleFrom, Usage},
};
use crate::core::quiet::{self, Cause};
use crate::{
    decision::{Decision, Settled},
    error::{Error, ErrorChain},
    http::{OnTrailers, PolicyField, Responder, ResponseBody, Stamp},
    store::BoxFuture,
    store::FailurePolicy,
};

pin_project! {
    /// Response future of [`RateLimit`](crate::rate_limit::RateLimit).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

/// How to answer one request, besides the decision.
pub(crate) struct Answer {
    /// What the policy does when the store fails.
    pub(crate) failure: FailurePolicy,
    /// The policy's shadow mode: a denial goes on to the inner service.
    pub(crate) shadow: Shadow,
    pub(crate) grpc: bool,
    /// The IETF `pk` parameter, when the layer writes one.
    pub(crate) partition_key: Option<String>,
    /// When the layer counts only some responses or settles charges: what that takes.
    pub(crate) after: Option<AfterResponse>,
    /// Whether a request that goes on carries its decision in its extensions.
    pub(crate) extension: bool,
}

impl Answer {
    /// Holds the charge of a request that goes on for what comes after its response, and
    /// puts the decision and the [`Usage`] handle in its extensions, when asked to.
    fn expose<B>(&self, result: &Result<Decision, Error>, request: &mut Request<B>) {
        let going = result.as_ref().ok().filter(|d| d.goes_on(self.shadow));
        if let (true, Some(d)) = (self.extension, going) {
            request.extensions_mut().insert(d.clone());
        }
        if let Some(after) = &self.after {
            if let Some(d) = going {
                after.held.hold(d);
            }
            // A request let through without a decision gets a handle holding no charge.
            if after.settle.as_ref().is_some_and(|s| s.handle) {
                request.extensions_mut().insert(Usage::new(&after.held));
            }
        }
    }
}

/// A policy's shadow mode, as the response sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shadow {
    /// Enforcing: a denial is answered by the limiter.
    Off,
    /// Every request goes on, and its response gets no rate-limit field.
    Quiet,
    /// Every request goes on, and its response gets the fields of its decision.
    WithHeaders,
}

impl Decision {
    /// Whether the request goes on: allowed, or denied by a limit in shadow mode (a ban is
    /// enforced in shadow mode too).
    pub(super) fn goes_on(&self, shadow: Shadow) -> bool {
        self.allowed || (shadow != Shadow::Off && !self.banned)
    }
}

impl Shadow {
    pub(crate) fn of(engine: &RateEngine) -> Self {
        match (engine.shadow(), engine.shadow_headers) {
            (false, _) => Shadow::Off,
            (true, false) => Shadow::Quiet,
            (true, true) => Shadow::WithHeaders,
        }
    }
}

/// What a request's charge needs once its response head is ready: given back whole when
/// the response does not count, settled to the figure of its usage header.
pub(crate) struct AfterResponse {
    pub(crate) held: Arc<Held>,
    pub(crate) count: Option<Arc<CountFn>>,
    pub(crate) settle: Option<Arc<SettleFrom>>,
}

/// What the work on a charge did to the decision's units, for the response's fields.
enum Adjust {
    Nothing,
    /// Units given back.
    Back(u64),
    /// Units charged past the first charge.
    Up(u64),
}

impl AfterResponse {
    /// What settles the charge from the response body's trailer, when the layer does.
    fn trailer_hook(&self) -> Option<Box<dyn OnTrailers>> {
        let name = self.settle.as_ref()?.trailer.clone()?;
        let held = Arc::clone(&self.held);
        Some(Box::new(FromTrailer { held, name }))
    }

    /// The work a response with this head asks for: the refund of a response that does not
    /// count, or the settlement to the figure of its usage header. `None` when there is
    /// none: the charge stands (no header, a figure that does not read: logged quietly), or
    /// the handle already settled it.
    fn on_head(
        self,
        status: StatusCode,
        headers: &HeaderMap,
    ) -> Option<BoxFuture<'static, Adjust>> {
        let held = self.held;
        if !held.is_held() {
            return None;
        }
        if self.count.is_some_and(|count| !count(status, headers)) {
            return Some(Box::pin(async move {
                match held.refund().await {
                    Ok(units) if units > 0 => Adjust::Back(units),
                    _ => Adjust::Nothing,
                }
            }));
        }
        let name = self.settle.as_ref()?.header.as_ref()?;
        match read_figure(headers.get_all(name).iter())? {
            Ok(actual) => Some(Box::pin(async move {
                match held.settle(actual).await {
                    Ok(Settled::GaveBack { units, given: true }) => Adjust::Back(units),
                    Ok(Settled::Charged { units }) => Adjust::Up(units),
                    // A store error was logged (quietly) where it happened.
                    _ => Adjust::Nothing,
                }
            })),
            Err(why) => {
                held.unreadable(name, headers.get(name), why);
                None
            }
        }
    }
}

/// What the inner service's response gets.
enum OnResponse {
    /// Nothing: the request was not checked, or the store failed and the policy let it
    /// through.
    Nothing,
    /// These headers, rendered when the decision was made (the common case).
    Stamp(Stamp),
    /// The headers of this decision, once the units of a response that does not count are
    /// given back or its charge settled (several limits, a denial let through in shadow
    /// mode, counting by response, settling).
    Decided(Box<Decided>),
}

/// A decision kept until the inner service answers.
struct Decided {
    decision: Decision,
    /// Whether the response gets the decision's fields (not in quiet shadow mode).
    headers: bool,
    responder: Arc<Responder<Decision>>,
    partition_key: Option<String>,
    after: Option<AfterResponse>,
    /// What the response body does with its trailers.
    trailer: Option<Box<dyn OnTrailers>>,
}

/// Where a decision leads.
enum Next {
    /// The limiter answers: a rejection, or the store failed and the policy is closed.
    Answer(Response<ResponseBody<Infallible>>),
    /// The inner service answers.
    Call(OnResponse),
}

/// A decision on its way from a store that must be waited for, with everything needed once
/// it comes.
struct Waiting<S, B> {
    check: BoxFuture<'static, Result<Decision, Error>>,
    request: Request<B>,
    service: S,
    responder: Arc<Responder<Decision>>,
    answer: Answer,
    field: PolicyField,
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        /// Decided in `call`, answered by the limiter.
        Answered {
            response: Option<Response<ResponseBody<Infallible>>>,
        },
        /// Boxed: a store that must be waited for takes far longer than the allocation, and
        /// the future of the answers at hand stays small.
        Checking {
            pending: Option<Box<Waiting<S, B>>>,
        },
        Calling {
            #[pin]
            future: S::Future,
            then: Option<OnResponse>,
            // Decided without waiting: spend the task's budget before the inner service runs.
            budget: bool,
        },
        /// The charge given back or settled before the response goes out.
        Settling {
            work: BoxFuture<'static, Adjust>,
            response: Option<(S::Response, Box<Decided>)>,
        },
    }
}

/// What to do with `result`, the decision on a request under `answer`; `field` is the
/// policy's own `RateLimit-Policy` member.
fn next_step(
    result: Result<Decision, Error>,
    answer: Answer,
    responder: &Arc<Responder<Decision>>,
    field: &PolicyField,
) -> Next {
    let d = match result {
        // The limiter counted and reported the decision (see `telemetry`).
        Ok(d) if d.goes_on(answer.shadow) => d,
        Ok(d) => {
            let pk = answer.partition_key.as_deref();
            return Next::Answer(responder.denied_with(&d, answer.grpc, pk, Some(field)));
        }
        Err(e) => {
            if let Some(left_out) = quiet::may_log(field.name(), Cause::StoreFailed) {
                tracing::warn!(error = %ErrorChain(&e), policy = %field.name(), on_store_error = ?answer.failure, left_out, "rate limit: store failed");
            }
            // Under `Local`, an error reaching here was not about availability (or the local
            // twin failed): reject rather than let it through. In shadow mode, never.
            if answer.failure != FailurePolicy::Open && answer.shadow == Shadow::Off {
                return Next::Answer(responder.unavailable(answer.grpc));
            }
            return Next::Call(OnResponse::Nothing);
        }
    };
    let headers = answer.shadow != Shadow::Quiet && !(d.allowed && responder.denials_only);
    if answer.after.is_none() {
        if !headers {
            return Next::Call(OnResponse::Nothing);
        }
        let pk = answer.partition_key.as_deref();
        if let Some(stamp) = Stamp::of(responder.style, &d, pk, Some(field)) {
            return Next::Call(OnResponse::Stamp(stamp));
        }
    }
    Next::Call(OnResponse::Decided(Box::new(Decided {
        decision: d,
        headers,
        responder: Arc::clone(responder),
        partition_key: answer.partition_key,
        after: answer.after,
        trailer: None,
    })))
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    /// Decided in `call`: the answer is made now, and an allowed request's inner call
    /// started on `service` (driven to readiness).
    pub(crate) fn decided(
        result: Result<Decision, Error>,
        mut request: Request<B>,
        service: &mut S,
        responder: &Arc<Responder<Decision>>,
        answer: Answer,
        field: &PolicyField,
    ) -> Self {
        answer.expose(&result, &mut request);
        let state = match next_step(result, answer, responder, field) {
            Next::Answer(response) => State::Answered {
                response: Some(response),
            },
            Next::Call(then) => State::Calling {
                future: service.call(request),
                then: Some(then),
                budget: true,
            },
        };
        Self { state }
    }

    /// Admitted in `call` without a decision (see `RateEngine::decide_lean`): the inner call
    /// started on `service` (driven to readiness), its response given `stamp`'s fields.
    #[inline(always)]
    pub(crate) fn admitted(request: Request<B>, service: &mut S, stamp: Option<Stamp>) -> Self {
        Self {
            state: State::Calling {
                future: service.call(request),
                then: Some(stamp.map_or(OnResponse::Nothing, OnResponse::Stamp)),
                budget: true,
            },
        }
    }

    pub(crate) fn checking(
        check: BoxFuture<'static, Result<Decision, Error>>,
        request: Request<B>,
        service: S,
        responder: Arc<Responder<Decision>>,
        answer: Answer,
        field: PolicyField,
    ) -> Self {
        let pending = Box::new(Waiting {
            check,
            request,
            service,
            responder,
            answer,
            field,
        });
        Self {
            state: State::Checking {
                pending: Some(pending),
            },
        }
    }

    /// Refused before any limit (the deny list): the limiter answers `response`.
    pub(crate) fn refused(response: Response<ResponseBody<Infallible>>) -> Self {
        Self {
            state: State::Answered {
                response: Some(response),
            },
        }
    }

    pub(crate) fn unchecked(request: Request<B>, service: &mut S) -> Self {
        Self {
            state: State::Calling {
                future: service.call(request),
                then: Some(OnResponse::Nothing),
                budget: false,
            },
        }
    }
}

const DONE: &str = "ResponseFuture polled after completion";

/// What an answer of the inner service under a kept decision still needs.
enum After<R> {
    /// Nothing: it is the response.
    Ready(Response<ResponseBody<R>>),
    /// Its units given back (it does not count) or its charge settled first, then its
    /// fields.
    Settle(BoxFuture<'static, Adjust>, Response<R>, Box<Decided>),
}

impl Decided {
    /// Finishes `res` under this decision: its fields, after the refund of a response that
    /// does not count or the settlement of its charge when there is one.
    fn after_head<R>(mut self: Box<Self>, res: Response<R>) -> After<R> {
        let after = self.after.take();
        self.trailer = after.as_ref().and_then(AfterResponse::trailer_hook);
        match after.and_then(|a| a.on_head(res.status(), res.headers())) {
            Some(work) => After::Settle(work, res, self),
            None => After::Ready(self.finish(res)),
        }
    }

    /// The decision once units are back or charged: units back are left again, and a quota
    /// full again resets now (otherwise the reset time stays the check's, an upper bound);
    /// units charged are not left (the reset time stays the check's).
    fn adjust(&mut self, adjust: Adjust) {
        let d = &mut self.decision;
        match adjust {
            Adjust::Nothing => {}
            Adjust::Back(units) => {
                d.remaining = d.capacity.min(d.remaining.saturating_add(units));
                if d.remaining == d.capacity {
                    d.reset_after = Duration::ZERO;
                }
            }
            Adjust::Up(units) => d.remaining = d.remaining.saturating_sub(units),
        }
    }

    /// The response: the decision's fields on `res`, its body reading its trailers when the
    /// layer settles from one.
    fn finish<R>(mut self: Box<Self>, mut res: Response<R>) -> Response<ResponseBody<R>> {
        self.stamp(&mut res);
        let trailer = self.trailer.take();
        res.map(|body| ResponseBody::inner(body).on_trailers(trailer))
    }

    /// Writes the decision's fields on `res`, unless in quiet shadow mode.
    fn stamp<R>(&self, res: &mut Response<R>) {
        if self.headers {
            let pk = self.partition_key.as_deref();
            self.responder.allowed(&self.decision, res, pk);
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
                StateProj::Answered { response } => {
                    // Decided without waiting: still spend the task's budget, so a loop of
                    // such requests lets the runtime run other tasks.
                    ready!(tokio::task::coop::poll_proceed(cx)).made_progress();
                    let res = response.take().expect(DONE);
                    return Poll::Ready(Ok(res.map(ResponseBody::written)));
                }
                StateProj::Checking { pending } => {
                    let result = ready!(pending.as_mut().expect(DONE).check.as_mut().poll(cx));
                    let p = *pending.take().expect(DONE);
                    let Waiting {
                        mut request,
                        mut service,
                        responder,
                        answer,
                        field,
                        ..
                    } = p;
                    answer.expose(&result, &mut request);
                    match next_step(result, answer, &responder, &field) {
                        Next::Answer(res) => {
                            return Poll::Ready(Ok(res.map(ResponseBody::written)));
                        }
                        Next::Call(then) => {
                            let future = service.call(request);
                            this.state.set(State::Calling {
                                future,
                                then: Some(then),
                                budget: false,
                            });
                        }
                    }
                }
                StateProj::Calling {
                    future,
                    then,
                    budget,
                } => {
                    if *budget {
                        ready!(tokio::task::coop::poll_proceed(cx)).made_progress();
                        *budget = false;
                    }
                    let mut res = ready!(future.poll(cx))?;
                    // The common answers finished here, the response moved once.
                    let decided = match then.take().expect(DONE) {
                        OnResponse::Nothing => {
                            return Poll::Ready(Ok(res.map(ResponseBody::inner)));
                        }
                        OnResponse::Stamp(stamp) => {
                            stamp.apply(res.headers_mut());
                            return Poll::Ready(Ok(res.map(ResponseBody::inner)));
                        }
                        OnResponse::Decided(decided) => decided,
                    };
                    match decided.after_head(res) {
                        After::Ready(res) => return Poll::Ready(Ok(res)),
                        After::Settle(work, res, decided) => {
                            this.state.set(State::Settling {
                                work,
                                response: Some((res, decided)),
                            });
                        }
                    }
                }
                StateProj::Settling { work, response } => {
                    let adjust = ready!(work.as_mut().poll(cx));
                    let (res, mut decided) = response.take().expect(DONE);
                    decided.adjust(adjust);
                    return Poll::Ready(Ok(decided.finish(res)));
                }
            }
        }
    }
}
