//! Usage-based limits: budgets of units known only after the work is done (a language model's
//! tokens, the bytes a download served, a query's complexity), charged on an estimate and
//! settled to the real figure.
//!
//! # Charging an estimate
//!
//! A request is admitted on a first charge: its [`cost`](crate::RateLimitLayer::cost), a fixed
//! estimate or one read from the request (a `max_tokens` the client sent, a declared size).
//! The estimate is what decides admission, so make it honest: too low lets a burst of large
//! requests in at once (each then owes its excess, see [debts](#debts)); too high refuses
//! requests that would have fit, until their settlements give the difference back.
//!
//! # Settling
//!
//! Once the figure is known, the charge is settled to it in one atomic store call, on every
//! instance sharing the store ([`RateLimiter::settle`](crate::RateLimiter::settle), answered
//! by [`Settled`](crate::rate_limit::Settled)):
//!
//! - **below the estimate**, the difference is given back, at most what the charge still
//!   holds (a bucket that has refilled since the check has nothing left to give);
//! - **above it**, the difference is charged at once, past the limit if need be: a debt;
//! - a charge settles **once**; a second settlement answers `Settled::NoCharge`.
//!
//! The layer takes the figure from one of these, each built on the same path:
//!
//! | source | builder method | when it settles |
//! |---|---|---|
//! | a response header | [`settle_from_header`](crate::RateLimitLayer::settle_from_header) | once the inner service's response head is ready, before the response is returned: the key's next request sees it |
//! | the handler's handle | [`settle_from_handle`](crate::RateLimitLayer::settle_from_handle), [`Usage`](crate::rate_limit::Usage) | whenever the handler calls [`Usage::settle`](crate::rate_limit::Usage::settle), also after the response has started streaming |
//! | a trailer of the response body | [`settle_from_trailer`](crate::RateLimitLayer::settle_from_trailer) | when the streamed body yields its trailers, before they go on: a client that read the whole body sees it |
//!
//! Whichever settles first wins; with [`count_if`](crate::RateLimitLayer::count_if), a
//! response that does not count gives its whole charge back instead. A header that is missing
//! leaves the estimate; one that does not read as a whole number (`-500`, `abc`, `1e9`, an
//! empty or a too-large value) leaves it too, and is logged at most once a second per policy.
//! A handle dropped without settling leaves the estimate. A store that fails a settlement
//! fails it whole (the estimate stands) and the response is returned all the same.
//!
//! Which algorithms settle: GCRA, the token bucket, the sliding window, the fixed window and
//! budgets ([`MultiLimit::budgets`](crate::algorithm::MultiLimit::budgets), below), on a
//! `RedisStore` or a `MemoryStore`. A `MultiLimit` built with `new`, a custom script, a
//! `RegionalStore` and unit leases cannot: a layer asked to settle them is a
//! [`ConfigError`](crate::ConfigError) when it is built.
//!
//! # Debts
//!
//! A charge settled above the limit is a debt: the key's next requests are refused until it is
//! paid back, each with a `Retry-After` covering it. With GCRA and the token bucket the key's
//! time moves on by the excess (at most 100 full quotas of it, so a broken figure holds a key
//! for at most about a hundred windows); a fixed window counts the excess in the current
//! window, a sliding window logs it now, and either debt ends with its window.
//!
//! For example, 100 tokens a minute, ten requests admitted at once on an estimate of 10 each,
//! each settling to 50: 500 spent of 100, a debt of 400 tokens, four minutes before the key's
//! next request of 10 fits (its `Retry-After` says 246 s).
//!
//! # A model proxy: requests and tokens per minute per API key
//!
//! Two budgets on one key, decided together
//! ([`MultiLimit::budgets`](crate::algorithm::MultiLimit::budgets)): 60 requests a minute
//! (each request costs 1, [`LimitCost::Fixed`](crate::algorithm::LimitCost::Fixed)) and 90,000
//! tokens a minute (each request admitted on an estimate of 1,000,
//! [`LimitCost::Request`](crate::algorithm::LimitCost::Request), then settled to the tokens the
//! upstream says it used, which the handler copies into a response header). A request is
//! admitted only when both budgets have room, in one atomic store call; a request refused by
//! either spends neither; the settlement moves the tokens alone (a debt of tokens makes the
//! key's next request wait, whatever requests it has left).
//!
//! ```no_run
//! use axum::{
//!     http::HeaderName,
//!     response::IntoResponse,
//!     routing::post,
//!     Router,
//! };
//! use tower_redis_ratelimit::{
//!     algorithm::{LimitCost, MultiLimit},
//!     HeaderKey, Quota, RateLimitLayer, RateLimiter, RedisStore,
//! };
//!
//! /// The header the handler writes the upstream's usage in.
//! const USAGE: HeaderName = HeaderName::from_static("x-usage-tokens");
//!
//! # async fn call_model(prompt: String) -> (String, u64) { (prompt, 0) }
//! async fn complete(prompt: String) -> impl IntoResponse {
//!     // The upstream's answer and its usage block (`usage.total_tokens`).
//!     let (answer, total_tokens) = call_model(prompt).await;
//!     ([(USAGE, total_tokens.to_string())], answer)
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let budgets = MultiLimit::budgets([
//!     ("requests", Quota::per_minute(60), LimitCost::Fixed(1)),
//!     ("tokens", Quota::per_minute(90_000), LimitCost::Request),
//! ])?;
//! let limiter = RateLimiter::builder(store, budgets)
//!     .policy_name("model")
//!     .build()?;
//! let app = Router::new()
//!     .route("/v1/chat/completions", post(complete))
//!     .layer(
//!         RateLimitLayer::new(limiter, HeaderKey::new("x-api-key")?)
//!             // The request's cost: the tokens' estimate (the requests budget takes 1).
//!             .cost(|_| 1_000)
//!             .settle_from_header(USAGE)?,
//!     );
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! The usage header stays on the response for the client to read; a proxy that must not
//! forward it removes it outside the layer. For a streamed answer, whose usage comes at its
//! end, either put the figure in a trailer of the body and build the layer with
//! [`settle_from_trailer`](crate::RateLimitLayer::settle_from_trailer), or take the
//! [`Usage`](crate::rate_limit::Usage) handle in the handler (`Extension<Usage>` in axum) and
//! settle from the task that streams the body when the upstream's last chunk says how many
//! tokens it used: the settlement does not wait for the response, and the key's next request
//! sees it once it is made.
//!
//! Both budgets appear in the `RateLimit-Policy` and `RateLimit` fields, each as its own item
//! under its name (`requests`, `tokens`): a client sees both. `Retry-After` covers the longer
//! wait. A `count_if` that does not count a response gives each budget its own cost back (one
//! request, the estimate's tokens).
//!
//! Two layers, one per budget, work too (the outer one counting every answer but a `429` so
//! that a request the inner one refuses gets its request back), but they decide one after the
//! other: the decision takes two store calls and, between them, another instance may see a
//! request charged to one budget and not yet to the other.
