//! The tower service.

use std::{
    fmt,
    marker::PhantomData,
    ops::ControlFlow,
    sync::{atomic::AtomicBool, Arc},
    task::{Context, Poll},
};

use http::{request::Parts, Request, Response};
use tower_service::Service;

use super::{
    config::{Config, Policy, Selected},
    engine::{AtOnce, Quoted, RateEngine},
    future::{AfterResponse, Answer, ResponseFuture, Shadow},
    lists::Listed,
    live::LiveLimits,
    usage::{Held, Usage},
};
use crate::{
    decision::{Admitted, Decision},
    error::Error,
    extract::{Key, KeyExtractor},
    http::{forbidden, is_grpc, key_of, Keyed, PolicyField, Responder, ResponseBody, Stamp},
    store::BoxFuture,
    store::FailurePolicy,
};

static WARNED_UNKEYED: AtomicBool = AtomicBool::new(false);

/// The service made by [`RateLimitLayer`](crate::RateLimitLayer).
pub struct RateLimit<S, K, A> {
    inner: S,
    config: Arc<Config<K>>,
    /// The default policy's algorithm, as in the layer's type.
    _algorithm: PhantomData<fn() -> A>,
}

impl<S, K, A> RateLimit<S, K, A> {
    pub(crate) fn new(inner: S, config: Arc<Config<K>>) -> Self {
        Self {
            inner,
            config,
            _algorithm: PhantomData,
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K, A> Clone for RateLimit<S, K, A> {
    fn clone(&self) -> Self {
        Self::new(self.inner.clone(), Arc::clone(&self.config))
    }
}

impl<S: fmt::Debug, K, A> fmt::Debug for RateLimit<S, K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("layer", &self.config)
            .finish()
    }
}

impl<S, K, A, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, K, A>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The limit depends on the request's key, so the decision is made in `call`.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // Decided here (the common case): the inner service, ready, is called here too, and
        // needs no clone.
        let (inner, config) = (&mut self.inner, &*self.config);
        let responder = &config.responder;
        let (parts, body) = req.into_parts();
        let guard = config.live.as_ref().map(LiveLimits::load);
        let live = guard.as_deref().map(Arc::as_ref);
        match config.listed(live, &parts) {
            Listed::Denied => {
                let grpc = is_grpc(&parts.headers);
                return ResponseFuture::refused(forbidden(responder.problem_details, grpc));
            }
            Listed::Allowed => {
                let req = uncharged(config, parts, body);
                return ResponseFuture::unchecked(req, inner);
            }
            Listed::No => {}
        }
        let cost = config.cost.as_ref().map_or(1, |f| f(&parts));
        let selected = match config.policy_for(&parts) {
            Selected::Policy(policy) if cost > 0 => policy,
            Selected::Policy(_) | Selected::Bypass => {
                let req = uncharged(config, parts, body);
                return ResponseFuture::unchecked(req, inner);
            }
            Selected::Foreign(id) => {
                let req = Request::from_parts(parts, body);
                return foreign(id, req, inner, config);
            }
        };
        let field = &selected.field;
        let policy = &selected.engine;
        // The key borrows from the request head: decide what can be decided at once before
        // the head goes back into the request.
        let key = match key_for(config, &parts) {
            Keyed::Limited(key) => key,
            Keyed::Unlimited => {
                let req = uncharged(config, parts, body);
                return ResponseFuture::unchecked(req, inner);
            }
        };
        let quoted = config.quota_for(live, selected, key.as_ref(), &parts);
        drop(guard);
        let answer = |grpc| answer_of(config, policy, key.as_ref(), grpc);
        // Answered without waiting (deny cache, in-memory store): no boxed future.
        if let Some(result) = decide_at_once(config, policy, key.as_ref(), cost, quoted.as_deref())
        {
            let result = match result {
                Ok(AtOnce::Admitted(a)) => {
                    drop(key);
                    let stamp = admitted_fields(responder, policy, field, &a);
                    return ResponseFuture::admitted(
                        Request::from_parts(parts, body),
                        inner,
                        stamp,
                    );
                }
                Ok(AtOnce::Decided(d)) => Ok(d),
                Err(e) => Err(e),
            };
            let answer = match answer_at_once(config, selected, key.as_ref(), &result, &parts) {
                ControlFlow::Continue(answer) => answer,
                ControlFlow::Break(refused) => return refused,
            };
            drop(key);
            let req = Request::from_parts(parts, body);
            return ResponseFuture::decided(result, req, inner, responder, answer, field);
        }
        let answer = answer(is_grpc(&parts.headers));
        let check = check_later(policy, key, cost, quoted);
        let req = Request::from_parts(parts, body);
        // Called once the decision comes: take the service that was driven to readiness and
        // leave a fresh clone in its place.
        let clone = inner.clone();
        let inner = std::mem::replace(inner, clone);
        let responder = Arc::clone(responder);
        ResponseFuture::checking(check, req, inner, responder, answer, field.clone())
    }
}

/// How a request (its head, `parts`) of `key` that the `selected` policy decided at once
/// (`result`) is answered, other than an admission without its decision: a refusal, answered
/// here with nothing kept for the response (`Break`), or the answer to make of the decision.
/// Apart from the call, so that the path of an admission stays short.
#[inline(never)]
fn answer_at_once<S, K, B>(
    config: &Config<K>,
    selected: &Policy,
    key: Option<&Key<'_>>,
    result: &Result<Decision, Error>,
    parts: &Parts,
) -> ControlFlow<ResponseFuture<S, B>, Answer>
where
    S: Service<Request<B>>,
{
    let policy = &selected.engine;
    if let Some(d) = result
        .as_ref()
        .ok()
        .filter(|d| !d.goes_on(Shadow::of(policy)))
    {
        let grpc = is_grpc(&parts.headers);
        let pk = config.partition_key(policy, key);
        let res = (config.responder).denied_with(d, grpc, pk.as_deref(), Some(&selected.field));
        return ControlFlow::Break(ResponseFuture::refused(res));
    }
    // Only an answer the limiter writes itself depends on the protocol.
    let grpc = !matches!(result, Ok(d) if d.allowed) && is_grpc(&parts.headers);
    ControlFlow::Continue(answer_of(config, policy, key, grpc))
}

/// The check of a request of `key` in a store that must be waited for.
fn check_later(
    policy: &Arc<RateEngine>,
    key: Option<Key<'_>>,
    cost: u32,
    quoted: Option<Arc<Quoted>>,
) -> BoxFuture<'static, Result<Decision, Error>> {
    let key = key.map(Key::into_owned);
    let policy = Arc::clone(policy);
    Box::pin(async move { policy.check(key.as_ref(), cost, quoted.as_deref()).await })
}

/// The key of the request of `parts`, as the layer's key extractor and its setting for
/// requests without one say.
fn key_for<'a, K: KeyExtractor>(config: &'a Config<K>, parts: &'a Parts) -> Keyed<'a> {
    key_of(
        &*config.key,
        config.missing_key,
        parts,
        &WARNED_UNKEYED,
        "rate limit",
    )
}

/// What `policy` decides for a request of `key` without waiting (see
/// [`RateEngine::decide`]): an admission without its decision when the layer needs none.
fn decide_at_once<K>(
    config: &Config<K>,
    policy: &RateEngine,
    key: Option<&Key<'_>>,
    cost: u32,
    quoted: Option<&Quoted>,
) -> Option<Result<AtOnce, Error>> {
    match config.lean() {
        true => policy.decide_lean(key, cost, quoted),
        false => policy
            .decide(key, cost, quoted)
            .map(|r| r.map(AtOnce::Decided)),
    }
}

/// The fields of an admission `a` of `policy`, unless its responses get none (on denials
/// only, or in quiet shadow mode).
fn admitted_fields(
    responder: &Responder<Decision>,
    policy: &RateEngine,
    field: &PolicyField,
    a: &Admitted,
) -> Option<Stamp> {
    let fields = !responder.denials_only && Shadow::of(policy) != Shadow::Quiet;
    fields.then(|| Stamp::admitted(responder.style, a, field))
}

/// The request of `parts` and `body`, passed on without a charge: with a [`Usage`] handle
/// that settles nothing when the layer hands handles out, unless an outer layer's is there.
fn uncharged<K, B>(config: &Config<K>, mut parts: Parts, body: B) -> Request<B> {
    if config.settle.as_ref().is_some_and(|s| s.handle) && parts.extensions.get::<Usage>().is_none()
    {
        parts.extensions.insert(Usage::inert());
    }
    Request::from_parts(parts, body)
}

/// How the answer to a request of `key` decided under `policy` is made.
fn answer_of<K>(
    config: &Config<K>,
    policy: &Arc<RateEngine>,
    key: Option<&Key<'_>>,
    grpc: bool,
) -> Answer {
    Answer {
        failure: policy.core.failure,
        shadow: Shadow::of(policy),
        grpc,
        partition_key: config.partition_key(policy, key),
        after: (config.count.is_some() || config.settle.is_some()).then(|| AfterResponse {
            held: Arc::new(Held::new(policy, key)),
            count: config.count.clone(),
            settle: config.settle.clone(),
        }),
        extension: config.extension,
    }
}

/// The answer to a request that `classify` put under another layer's policy: 503, decided
/// under no policy.
fn foreign<S, K, ReqBody>(
    id: super::config::PolicyId,
    req: Request<ReqBody>,
    inner: &mut S,
    config: &Config<K>,
) -> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    tracing::error!(
        ?id,
        "rate limit: classify returned a policy handle of another layer; answering 503"
    );
    let e = Error::InvalidInput("a policy handle of another layer");
    let answer = Answer {
        failure: FailurePolicy::Closed,
        shadow: Shadow::Off,
        grpc: is_grpc(req.headers()),
        partition_key: None,
        after: None,
        extension: false,
    };
    let field = &config.policies[0].field;
    ResponseFuture::decided(Err(e), req, inner, &config.responder, answer, field)
}
