//! The gateway: an HTTP server that rate-limits every route, in front of a service
//! (`--upstream`) or, by itself, answering demo routes: `GET /` with `200 ok`,
//! `GET /status/{code}` with that status (100-599, else 400) and `GET /sleep/{ms}` with 200
//! after sleeping that long (at most 60,000 ms, else 400).
//!
//! Built from the repository's root with `cargo build --release --bin gateway` (into
//! `target/release/gateway`), run with `cargo run --bin gateway -- FLAGS`.
//!
//! ```text
//! gateway [--listen 127.0.0.1:3000] [--redis redis://HOST:PORT]
//!     [--redis-cluster redis://HOST:PORT,redis://HOST:PORT,...]
//!     [--redis-sentinel redis://HOST:PORT,redis://HOST:PORT,... --sentinel-master NAME]
//!     [--redis-ca FILE] [--redis-cert FILE --redis-key FILE] [--connect-timeout-ms N]
//!     [--lazy-connect]
//!     [--algorithm token-bucket|gcra|sliding-window|fixed-window] [--limit N] [--per 1s|60s|1m|1h|1w|1mo|1y]
//!     [--burst N] [--key global|ip|header:NAME] [--trusted-proxy CIDR]... [--ipv6-prefix N]
//!     [--on-redis-error open|closed|local] [--local-share N] [--timeout-ms N]
//!     [--headers ietf|legacy|both|none]
//!     [--plan KEY=N/PERIOD]... [--count-only LIST] [--cost N] [--settle-header NAME] [--concurrency N [--lease-ms M]]
//!     [--unit-lease-ms N] [--ban-after N [--ban-within DURATION] [--ban-for DURATION] [--ban-escalate F]]
//!     [--delay-up-to DURATION] [--prefix P] [--log error|warn|info|debug|trace] [--shadow] [--batch]
//!     [--no-limit] [--admin-listen ADDR [--admin-token TOKEN | --admin-token-file FILE]]
//!     [--allow LIST] [--deny LIST] [--config FILE] [--check-config FILE]
//!     [--region NAME --regions NAME=URL,NAME=URL,... [--region-share F]] [--drain-ms N]
//!     [--upstream http://HOST:PORT[/PREFIX] [--upstream-timeout-ms N]] [--threads N]
//!     [--rls-listen ADDR --rls-config PATH [--rls-algorithm fixed-window|gcra|sliding-window]]
//! gateway --help | --version
//! ```
//!
//! `--config FILE`: the limit settings in TOML, one key per flag with the flag's name
//! (dashes as underscores): `algorithm`, `limit`, `per`, `burst`, `key`, `trusted_proxy` (a
//! list), `ipv6_prefix`, `on_redis_error`, `local_share`, `timeout_ms`, `headers`, `plans` (a
//! table, `gold = "100/1m"`), `count_only`, `cost`, `concurrency`, `lease_ms`, `unit_lease_ms`,
//! `shadow`, `ban_after`, `ban_within`, `ban_for`, `ban_escalate`, `delay_up_to`, `allow` and
//! `deny` (lists). An absent key takes the flag's default; with
//! `--config`, any of these given as a flag (in the file or not) is refused at start-up; every
//! other flag stays a flag, and is refused in the file. The file is read again on `SIGHUP` and
//! when it changes (looked at every 50 ms), once it has settled: its size, modification time
//! and inode unchanged across two looks at least 100 ms apart, so a finished file is in force
//! within 1 s of its last write or of `SIGHUP` (a writer that needs its file read whole at
//! once writes another file and renames it into place). Looks, reads and checks run off the
//! threads that serve requests. Each read gives one stderr line: `config reloaded: FILE: limit
//! QUOTA` (followed by `, shadow on` when the file turns shadow mode on, and `, delay up to
//! DURATION` when it sets a delay), or
//! `config refused: REASON`, when the file is empty, is not a regular file (a FIFO,
//! a device), is over 8 MiB, does not parse or changes a setting
//! other than `limit`, `per`, `burst`, `plans`, `cost`, `shadow`, `delay_up_to`, `allow` and `deny` (the
//! algorithm, the key and the rest need a restart): the running limits stay. A reload takes
//! effect for the next request, drops no connection and keeps every counter (a key's state
//! is read under the new quota, see the guide's quotas per request).
//! `--check-config FILE` prints `ok` and exits 0 when the file would start the gateway, or
//! prints the error (the line and the field, for a value that does not read and for a
//! setting that cannot work alike) on stderr and exits 1. `GET /keys/{key}` shows a key under
//! the quota its checks get: its plan's, and the limits in force after a reload.
//!
//! `--allow LIST` and `--deny LIST` (comma-separated keys, addresses and CIDRs, e.g.
//! `vip,10.0.0.0/8,2001:db8::/32`): requests whose key, or whose client address (as `--key ip`
//! finds it, `--trusted-proxy` included, whatever `--key` is), is on the allow list are served
//! without a store call and without rate-limit fields; those on the deny list get 403. Deny
//! wins over allow, allow over a ban, a ban over the limit. Not with `--concurrency`, which
//! would still count allowed keys.
//!
//! `--plan KEY=N/PERIOD` (repeatable, with `--key header:NAME`) gives requests whose key is
//! KEY a quota of N per PERIOD; other keys get `--limit`/`--per`. Each KEY has one plan; with
//! `--algorithm sliding-window` or `fixed-window`, PERIOD is `--per`'s (a window takes only
//! quotas of its own period; `1mo` for calendar months, not `30d`). A plan the limiter would refuse stops the gateway at start-up.
//!
//! `--count-only LIST` (codes and classes, e.g. `401,403,5xx`): only responses whose status is
//! in LIST spend quota; the others give their units back before they are answered.
//!
//! `--cost N` (1): the units each request is charged (its first charge, which
//! `--settle-header` settles); a limit setting, reloadable in the `--config` file. A cost of 0,
//! or above what a rested key holds, is refused.
//!
//! `--settle-header NAME` (with `--upstream`): each request admitted at `--cost` is settled
//! to the whole number in the upstream's response header NAME, written to the store before
//! the response's headers are forwarded (the key's next request, on any gateway sharing the
//! store, sees it; the `RateLimit` field shows what is left after it). Below the cost the
//! difference is given back; above it, the excess is charged past the limit: a debt, and the
//! key's next request is refused with a `Retry-After` covering it. A missing header, or one
//! that is not a whole number (`-500`, `abc`, `1e9`, 20 digits, empty), keeps the first
//! charge and is logged at most once a second. With `--count-only`, an uncounted response
//! gives its whole charge back and a counted one is settled. Refused without `--upstream`,
//! with `--unit-lease-ms` and with `--regions`; a flag only (not in the `--config` file).
//!
//! `--concurrency N` (with `--lease-ms M`, default 30,000): at most N requests of one key in
//! flight at once across every instance sharing the store, on top of the rate limit; over it,
//! 429. A slot is held under a lease renewed while the request runs, so the slots of a
//! gateway that dies come back within M ms.
//!
//! `--unit-lease-ms N` (GCRA and token bucket): a hot key that is allowed is answered from
//! blocks of its units reserved in the store in one call, each handed out for at most N ms
//! after its reservation was sent; what is left goes back. The limit then holds in count,
//! shifted in time by at most N ms (see `UnitLease`).
//!
//! `--ban-after N` bans a key refused N times within `--ban-within DURATION` (default `60s`)
//! for `--ban-for DURATION` (default `300s`); a key banned again within a day of its last
//! ban's end is banned `--ban-escalate F` (default `2`, from 1 to 1000) times as long as its
//! last ban, at most a day (durations as `--per` reads them: `500ms`, `10s`, `5m`, `1h`, each
//! from 1 ms to a day). The ban is the one `PUT /bans/{key}` sets: in the store, so every
//! gateway sharing it answers the key `429` with `Retry-After` the time the ban has left;
//! `GET /keys/{key}` shows it as `banned_ms`, `DELETE /bans/{key}` lifts it. Refusals of a
//! banned key do not count; the count starts afresh when a ban starts. Refusals are counted
//! off the request path (a queue and one atomic store call each, see the library's
//! `AutoBan`): a ban starts about one store round trip after the refusal that brought it.
//! With `--shadow`, the would-be bans are logged, never set. Each ban is counted in
//! `ratelimit_bans_total{policy, reason="automatic"}` (`reason="operator"` for
//! `PUT /bans`) and logged at `info` with the key's digest. Refused at start-up: `--ban-after`
//! with `--regions`; `--ban-within`, `--ban-for` or `--ban-escalate` without `--ban-after`. In
//! the `--config` file as `ban_after`, `ban_within`, `ban_for`, `ban_escalate`; a reload
//! that changes them is refused (they need a restart).
//!
//! `--delay-up-to DURATION` (GCRA and the token bucket; durations as `--per` reads them,
//! `500ms`, `10s`, `5m`, `1h`, at most an hour): a request over the limit is served late, in
//! time with the limit, when its units come within DURATION; refused (429) otherwise, with
//! `Retry-After` the time until a request would wait no longer than DURATION. The place of a
//! delayed request is kept in the store with its check, so across gateways sharing the store
//! the served requests follow the limit exactly. A client that hangs up while it waits gives
//! its units back. At most the key's burst wait per key on each gateway, and 10,000 in all; a
//! request beyond either is refused. A waiting request holds its connection, and counts
//! toward `--concurrency` while it waits; on `SIGTERM` it is one of the requests in flight
//! that `--drain-ms` waits for. The start-up line `delay: a request over the limit waits
//! up to DURATION for its units, in time with the limit`; the metrics
//! `ratelimit_delayed_total{policy, outcome="served"|"abandoned"}` and
//! `ratelimit_waiting{policy}`. A limit setting: `delay_up_to` in the `--config` file,
//! reloadable (a reload may set, change or lift it). Refused at start-up (and in a reload):
//! with `--algorithm sliding-window` or `fixed-window`, with `--unit-lease-ms`, with
//! `--regions`. `--shadow` never delays.
//!
//! `--shadow` never rejects and changes nothing a client sees: every request is served, no
//! response gets a rate-limit field, and each over-limit request is logged ("would deny") at
//! `info`, counted (`decision="would_deny"`) and its key listed by `/top`.
//!
//! `--admin-listen ADDR` opens a second listener for operators, serving the library's console
//! (`tower_redis_ratelimit::admin`) (off by default; bind it to a
//! loopback or private address: it names keys), printed as `admin listening on http://ADDR`
//! after the `listening on` line:
//! - `GET /metrics`: the crate's metrics in the Prometheus text format, among them
//!   `ratelimit_decisions_total{policy, decision, source}` (`decision`: `allowed`, `denied`,
//!   `would_deny`, `unavailable`; `source`: `store`, `deny_cache`, `unit_lease`, `local`,
//!   `failure_policy`), every family with its `# HELP` and `# TYPE`, the decisions a
//!   dashboard reads present at 0 from the start, `ratelimit_store_latency_seconds` a
//!   histogram (100 µs to 5 s) counting every store call, failed and timed-out ones included,
//!   `ratelimit_breaker_open{policy}` (1 while the circuit breaker is open),
//!   `ratelimit_near_limit_total{policy}` (allowed decisions that left the key at or under
//!   20% of its capacity), `ratelimit_store_connected` and
//!   `ratelimit_store_connects_total{result}` (the Redis connection), and, with `--config`, `ratelimit_config_reloads_total{result="ok"|
//!   "refused"}`;
//! - `GET /top?n=N` (default 10): this instance's most denied keys since it started, as JSON,
//!   `[{"key": "...", "encoding": "utf8", "policy": "default", "denied": N, "would_deny": M},
//!   ...]` (a key that is not UTF-8 percent-encoded, with `"encoding": "percent"`), sorted by
//!   `denied + would_deny`, highest first; exact while fewer than 128 keys were denied.
//!   `GET /top?n=N&scope=fleet`: the same, summed over every gateway sharing the store (each
//!   gateway on Redis publishes its most denied keys every 2 s, counted for 10 s; this one
//!   as it is now); 503 when the store cannot be read; `scope=instance` is the default;
//! - `GET /keys/{key}`: the key's state, spending nothing, as JSON, `{"key": "...", "policy":
//!   "default", "limit": N, "remaining": N, "reset_ms": N, "banned_ms": N}` (`remaining` and
//!   `reset_ms` as a check of cost 0 would show them; `banned_ms` 0 when not banned);
//! - `DELETE /keys/{key}` (204): forgets what the key spent (not its ban) and frees its
//!   concurrency slots; every gateway sharing the store decides it afresh within 1 s;
//! - `PUT /bans/{key}?seconds=N` (1 to 86,400, else 400; 204): every gateway sharing the store
//!   answers the key 429 with `Retry-After` until the ban ends, within 1 s, and after a Redis
//!   that lost its data too: each gateway on Redis looks every second whether the store lost
//!   the limit's state (`ratelimit_store_resets_total`, one log line) and writes back the
//!   bans it knows, with the time each has left;
//!   `DELETE /bans/{key}` (204) lifts it, everywhere within 1 s;
//! - `GET /healthz`: `200` with body `ok` when the store answers within the store timeout
//!   (always, on the in-memory store), else `503` with a one-line reason;
//! - `GET /limits`: the limits in force, as JSON, `{"generation": N, "policies": [{"policy":
//!   "default", "algorithm": "gcra", "limit": N, "per_ms": N, "burst": N, "shadow": false},
//!   ...]}`: `generation` counts the reloads put in force, each plan is a policy of its own
//!   named `plan:KEY` (the key as `/top` names keys), `burst` is the algorithm's (the limit,
//!   for the windows).
//!
//! `{key}` is the bytes the key extractor produces, percent-encoded (any bytes: a key that is
//! not UTF-8 is named as `/top` shows it): a header's value with
//! `--key header:NAME`, the client address with `--key ip` (an IPv6 client as its network,
//! `2001:db8::/64`; a whole IPv6 address is taken to its network), `global` with `--key
//! global`. `--admin-token TOKEN` or `--admin-token-file FILE` (the token on the file's first
//! line, out of sight of `ps`): every admin request needs `Authorization: Bearer TOKEN` (the
//! scheme in any case), else 401; one of them is required when `--admin-listen` is not a
//! loopback address. Each change is logged once at `info` (`admin:` what, the key
//! percent-encoded so that no byte of it can write a line of its own, the peer's address).
//! The admin listener never shares the public one: without `--admin-listen`, none of this is
//! reachable. Each listener closes a connection whose request headers take over 10 s and
//! holds at most 512 (public) or 64 (admin) connections at once (more wait in the kernel's
//! queue), so a flood of idle connections on one cannot take the process's descriptors.
//! `--allow` and `--deny` entries are read as bytes (a key that is not UTF-8 can be listed).
//!
//! `--region NAME --regions NAME=URL,NAME=URL,...` (several regions, see the guide's chapter
//! "Several regions"): one limit per key across regions, each gateway deciding against its own
//! region's Redis (NAME's URL) and reaching the others only in the background. Every region's
//! Redis is listed, in the same order on every gateway; the first is the home, which keeps the
//! exact algorithm and grants the regions blocks of units. `--regions` replaces `--redis`
//! (both, or `--redis-cluster`/`--redis-sentinel`, are refused). `--region-share F` (0 < F ≤ 1,
//! default 1/the number of regions): the share of each key's limit a region decides from while
//! it cannot reach the others (logged, and the gauge `ratelimit_region_cut_off{region}` on
//! `/metrics`). Refused with `--regions`, as they do not work across regions yet:
//! `--algorithm sliding-window` and `fixed-window` (GCRA and the token bucket only), `--unit-lease-ms` (the
//! region's pool is a lease already), `--count-only` (refunds), `--concurrency`, `--batch`.
//! Not used across regions: the deny cache (a region's denial is not final, a refill may come).
//! Per region, not global: `--allow`/`--deny` (per gateway, as always). The admin listener's
//! `/keys` and `/bans` answer 503 (peeks, resets and bans are not supported across regions);
//! `GET /region` answers this region's state as JSON (`{"region", "home", "cut_off", "cuts",
//! "grants", "units_granted", "units_charged", "failed_grants"}`).
//!
//! `rediss://` URLs use TLS (the system's roots, or `--redis-ca`). Without `--lazy-connect`, a
//! gateway that cannot connect, authenticate or verify Redis exits non-zero within the connect
//! timeout, with one line on stderr naming the cause, before it listens.
//!
//! Every flag, with its default:
//!
//! - `--listen ADDR` (`127.0.0.1:3000`): where to serve.
//! - `--redis URL`: one Redis server (`redis://`, `rediss://` for TLS, `redis+unix://`;
//!   passwords and ACL users in the URL). `--redis-cluster URL,URL,...`: a Redis Cluster
//!   through any of its nodes. `--redis-sentinel URL,URL,... --sentinel-master NAME`: the
//!   primary the Sentinels name for NAME. Without any of them, the in-memory store.
//! - `--redis-ca FILE`: trust this CA instead of the system's roots (with any of the three);
//!   `--redis-cert FILE --redis-key FILE`: mutual TLS. `--connect-timeout-ms N` (3,000): the
//!   bound on each connection attempt. `--lazy-connect`: start without Redis (not with
//!   `--redis-cluster`); the failure policy answers until Redis does.
//! - `--algorithm gcra|token-bucket|sliding-window|fixed-window` (`gcra`), `--limit N` (10) and `--per
//!   DURATION` (`1s`; `ms`, `s`, `m`, `h`, `d`): N requests per DURATION (for the buckets:
//!   capacity N, refilled at N per DURATION); `--burst N`: another capacity. With
//!   `fixed-window`, `--per` also takes `1w`, `1mo` and `1y`: calendar weeks from Monday,
//!   months and years, in UTC on the store's clock (the `RateLimit` header's `t` and
//!   `Retry-After` count to the window's end, the policy's `w` is 7, 30 or 365 days); refused
//!   with another algorithm, and a reload cannot turn them into windows of a duration.
//! - `--key ip|global|header:NAME` (`ip`): per client address, one key for everybody, or
//!   per value of a header. `--trusted-proxy CIDR` (repeatable): read `X-Forwarded-For`
//!   from these proxies. `--ipv6-prefix N` (64): IPv6 clients grouped by their /N.
//! - `--on-redis-error open|closed|local` (`open`), `--local-share N` (1): the failure
//!   policy, and the number of instances a `local` limit is divided among.
//!   `--timeout-ms N` (100): the store timeout.
//! - `--headers ietf|legacy|both|none` (`ietf`): which rate-limit headers to send.
//! - `--prefix P` (`gateway`): the first part of every Redis key.
//! - `--log LEVEL` (`info`): the log level.
//! - `--batch`: exact batching of Redis calls. `--no-limit`: serve without the layer (to
//!   measure its overhead).
//! - `--upstream http://HOST:PORT[/PREFIX]`: stand in front of a service. Every request the
//!   limiter lets through goes to the upstream with its method, its path and query byte for
//!   byte (after PREFIX), its headers (hop-by-hop ones dropped, `x-forwarded-for` appended with
//!   the client's address; `host` added with the upstream's authority when the client sent
//!   none) and its body (its `content-length` kept), streamed both ways. A client connection
//!   keeps one upstream connection for its requests, taken from a pool of idle ones (at most
//!   256, each kept at most 60 s) or opened, and given back when the client's connection ends;
//!   a request goes out once, and is sent again (on another connection) only when the
//!   connection closed before any of it was written. The upstream's status, headers and body
//!   come back with the rate-limit fields added, and `--count-only` reads the upstream's
//!   status. A refused request never reaches the upstream. An upstream that cannot be reached
//!   answers 502; one that, for `--upstream-timeout-ms N` (30,000), neither takes any of the
//!   request (its connection, a part of its body) nor answers, 504: the time counts from the
//!   request's last progress, so a slow upload is not a timeout. A response body that sends
//!   nothing for that long has the client's connection cut (the body ends early). Printed at start-up as
//!   `upstream: http://HOST:PORT[/PREFIX]`. Under a PREFIX, a path with a `.` or `..`
//!   segment (`%2e` too) is refused with 400: the upstream could resolve it outside the
//!   prefix. Without `--upstream`, the demo routes.
//! - `--threads N` (one per CPU): the threads serving requests; with 1, one thread does
//!   everything, with no hand-offs between threads (the fastest on one core).
//! - `--drain-ms N` (10,000): on `SIGTERM` or `SIGINT`, the gateway stops accepting, lets the
//!   requests in flight finish (their concurrency slots go back as each ends) for at most N ms,
//!   then drops those still running (their slots go back to the store before it exits), and
//!   exits 0.
//! - `--help` prints the usage and a line per flag on stdout and exits 0; `--version` prints `gateway VERSION`.
//!
//! `SIGHUP` reloads `--config`'s file and `--rls-config`'s rules; without either it is logged
//! (at most once a second) and ignored, so that a fleet-wide reload signal leaves the other
//! gateways running.
//!
//! `--rls-listen ADDR --rls-config PATH [--rls-algorithm fixed-window|gcra|sliding-window]`:
//! Envoy's rate limit service beside the HTTP listener, on the same store (`--redis`,
//! `--prefix`), with `--on-redis-error`, `--timeout-ms` and `--local-share`: on one port,
//! gRPC `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over HTTP/2 cleartext
//! and `POST /json` (the request in proto3's JSON mapping, e.g. `{"domain": "edge",
//! "descriptors": [{"entries": [{"key": "api_key", "value": "k"}]}]}`, answered in the same
//! mapping with 200 for `"overallCode": "OK"`, 429 for `"OVER_LIMIT"`, 400 for a body that
//! does not read, 503 when the store fails under `--on-redis-error closed`, which gRPC
//! answers `UNAVAILABLE`). It prints `rls config: PATH: N domains`, then `rls listening on
//! http://ADDR` on stdout after the other listeners' lines. `PATH` is an
//! envoyproxy/ratelimit YAML file or a directory of `*.yaml`/`*.yml` files, read as
//! envoyproxy/ratelimit reads them (see `tower_redis_ratelimit::rate_limit::rls` for the
//! rules and the differences); it is read again on `SIGHUP` and when its files change and
//! have settled (looked at every 250 ms), each read giving one stderr line: `rls config
//! reloaded: PATH: N domains` or `rls config refused: REASON` (the rules in force stay);
//! every `SIGHUP` gives one, even when nothing changed. An unknown domain is answered `OK`
//! with no limits. `--rls-algorithm` defaults to `fixed-window` (the numbers an
//! envoyproxy/ratelimit user migrates from). `--rls-*` are flags, refused in the `--config`
//! file; `--rls-listen` without `--rls-config` (and the reverse) and `--rls-listen` with
//! `--regions` are refused at start-up. A descriptor's key in the store is its entries as
//! `key=value` joined by `,` (`%`, `,`, `=` escaped as `%25`, `%2C`, `%3D`), under the
//! policy named by its rule's path (`edge.api_key`; characters other than letters, digits,
//! `-`, `_`, `.`, `:` become `_` and a hash of the path is added). With `--admin-listen`, the
//! admin routes work on them by that policy: `GET /keys/api_key=k?policy=edge.api_key`
//! (the key percent-encoded in the path as any key is: `%2C` in a value is written `%252C`),
//! `DELETE /keys/...?policy=...`, `PUT /bans/...?policy=...&seconds=N`, `DELETE
//! /bans/...?policy=...` (404 for a policy no rule has; without `?policy=`, the HTTP
//! limiter's keys as before); `/top` (instance and fleet) lists their keys beside the HTTP
//! limiter's, with their policy; `/limits` lists each rule; `ratelimit_decisions_total` counts
//! each descriptor's decision with `policy` = the rule's path (a shadow rule's refusals as
//! `would_deny`).
//!
//! `GET /status/{code}` answers with that status; an informational 1xx other than 101 cannot
//! end an HTTP response, and hyper answers it with 500.
//!
//! Without `--redis` it uses the in-memory store. Try it:
//! `for i in $(seq 12); do curl -si 127.0.0.1:3000/ | head -1; done`.

mod admin;
mod args;
mod limiter;
mod limits;
mod proxy;
mod reload;
mod rls;
mod serve;
mod timer;

use self::{admin::*, args::*, limiter::*, limits::*, reload::*, serve::*};

use std::{
    collections::HashMap, net::SocketAddr, os::unix::ffi::OsStrExt, process::ExitCode, sync::Arc,
    time::Duration,
};

use axum::{
    extract::{ConnectInfo, Path},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tower_redis_ratelimit::{
    algorithm::{Algorithm, Calendar, FixedWindow},
    concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter},
    rate_limit::rls::{RlsAlgorithm, RlsService},
    rate_limit::{
        file::{self, from_toml, FileError, FileWatch, Look},
        AccessList, AutoBan, Delay, HeaderStyle, Limits, LiveLimits, StatusSet, UnitLease,
    },
    store::redis::{Batching, RegionalStore},
    store::{SlotStore, Store},
    telemetry::ErrorChain,
    ClientIp, ConfigError, FailurePolicy, Gcra, GlobalKey, HeaderKey, KeyExtractor, MemoryStore,
    Quota, RateLimitLayer, RateLimiter, RedisStore, SlidingWindow, TokenBucket,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The buckets of `ratelimit_store_latency_seconds`, in seconds: a store call on a local
/// network takes about a millisecond, a store timeout is 100 ms by default, a stall seconds.
const STORE_LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

async fn run(base: Args) -> Result<(), BoxError> {
    // The file as read at start-up; the watcher reports only changes from it.
    let mut file = base.config.as_ref().map(FileWatch::new);
    let args = match (&base.config, &mut file) {
        (Some(path), Some(file)) => {
            let text = file.read().map_err(|e| format!("--config {path}: {e}"))?;
            with_text(&base, path, &text)?
        }
        _ => base.clone(),
    };
    let (quota, algorithm) = check(&args)?;
    // Installed before the store connects and the limiter is built: the connection's
    // metrics, the descriptions and the series at 0 go to it.
    let metrics = match args.admin_listen {
        Some(_) => Some(metrics_recorder()?),
        None => None,
    };
    let Connected {
        store,
        slots,
        regional,
    } = connect_store(&args).await?;
    println!(
        "limit: {} per key ({}), key: {}, on store error: {:?}{}",
        quota_text(&quota, args.calendar),
        args.algorithm,
        args.key,
        args.on_error,
        if args.on_error == FailurePolicy::Local {
            format!(" (1/{} of the quota per instance)", args.local_share)
        } else {
            String::new()
        }
    );
    for (key, plan, given) in &args.plans {
        println!(
            "plan: key {key:?} gets {}",
            quota_text(plan, plan_calendar(given))
        );
    }
    let rls = match args.rls_listen {
        Some(addr) => Some(rls::prepare(&args, addr, Arc::clone(&store)).await?),
        None => None,
    };
    serve(
        base, args, file, store, slots, algorithm, metrics, regional, rls,
    )
    .await
}

/// `m`, locked: a panic while it was held left nothing half-done worth losing the gateway for
/// (each holder takes or puts one value).
pub(crate) fn locked<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The Prometheus recorder `/metrics` renders, installed for the process.
fn metrics_recorder() -> Result<PrometheusHandle, String> {
    PrometheusBuilder::new()
        // The store's latency as a histogram (per-instance quantiles cannot be summed across
        // a fleet), with buckets for store calls: 100 µs to 5 s.
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(
                tower_redis_ratelimit::telemetry::STORE_LATENCY.to_owned(),
            ),
            STORE_LATENCY_BUCKETS,
        )
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| format!("--admin-listen: {}", ErrorChain(&e)))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(Stop::Help) => {
            print!("{}", args::help());
            return ExitCode::SUCCESS;
        }
        Err(Stop::Version) => {
            println!("gateway {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(Stop::Refused(e)) => {
            if !e.is_empty() {
                eprintln!("error: {e}");
            }
            eprintln!("usage: {USAGE}");
            return ExitCode::from(2);
        }
    };
    // `--threads 1`: one thread serves everything, with no hand-offs between threads.
    let runtime = match args.threads {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    }
    .enable_all()
    .build();
    match runtime {
        Ok(runtime) => runtime.block_on(start(args)),
        Err(e) => {
            eprintln!("error: the runtime did not start: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn start(args: Args) -> ExitCode {
    if let Some(path) = &args.check_config {
        return check_config(&args, path);
    }
    tracing_subscriber::fmt()
        .with_max_level(args.log)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", ErrorChain(&*e));
            ExitCode::FAILURE
        }
    }
}
