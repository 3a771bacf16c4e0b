//! `--upstream URL`: the gateway as a reverse proxy. Every request the limiter lets through goes
//! to the upstream with its method, its path and query byte for byte (after the upstream's
//! path prefix), its headers (hop-by-hop ones dropped, `x-forwarded-for` appended with the
//! client's address) and its body, streamed both ways over pooled connections; the upstream's
//! status, headers and body come back, and the limiter adds its fields. An upstream that
//! cannot be reached answers 502; one whose response headers take longer than the timeout,
//! 504.

use std::{net::SocketAddr, time::Duration};

use axum::{
    body::Body,
    extract::{ConnectInfo, Request, State},
    response::{IntoResponse, Response},
};
use http::{
    header::{self, HeaderMap, HeaderName, HeaderValue},
    uri::{Authority, PathAndQuery, Scheme},
    StatusCode, Uri,
};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};

/// The headers that concern one connection, not the request (RFC 9110, 7.6.1), never
/// forwarded either way.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Where requests go: `http://HOST[:PORT][/PREFIX]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    authority: Authority,
    /// The path prefix, without a trailing `/` (empty for none).
    prefix: String,
}

impl Upstream {
    /// Reads `--upstream`'s URL: `http://`, a host and an optional port, an optional path
    /// prefix; no query, no fragment, no user.
    pub fn parse(url: &str) -> Result<Self, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("{url:?} is not a URL ({e})"))?;
        if uri.scheme() != Some(&Scheme::HTTP) {
            return Err(format!("{url:?}: only http:// upstreams are served"));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| format!("{url:?} names no host"))?;
        if authority.as_str().contains('@') {
            return Err(format!("{url:?}: no user in the URL"));
        }
        if authority.host().is_empty() {
            return Err(format!("{url:?} names no host"));
        }
        let path = uri.path_and_query().map_or("", PathAndQuery::as_str);
        if path.contains('?') || url.contains('#') {
            return Err(format!("{url:?}: a prefix takes no query nor fragment"));
        }
        Ok(Self {
            authority,
            prefix: path.trim_end_matches('/').to_owned(),
        })
    }

    /// The upstream, as the start-up line shows it.
    pub fn describe(&self) -> String {
        format!("http://{}{}", self.authority, self.prefix)
    }

    /// The upstream's URI for a request to `path_and_query`, byte for byte after the prefix.
    fn uri(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(self.authority.clone())
            .path_and_query(format!("{}{path_and_query}", self.prefix))
            .build()
    }
}

/// What the proxy handler holds: the upstream, a pooled client, the timeout.
#[derive(Clone)]
pub struct Proxy {
    upstream: Upstream,
    client: Client<HttpConnector, Body>,
    timeout: Duration,
}

impl Proxy {
    pub fn new(upstream: Upstream, timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Self {
            upstream,
            client,
            timeout,
        }
    }
}

/// Drops the hop-by-hop headers, and those the `Connection` header names.
fn drop_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(&named) {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

/// Appends the client's address to `x-forwarded-for`.
fn forwarded_for(headers: &mut HeaderMap, client: SocketAddr) {
    const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");
    let ip = client.ip().to_string();
    let value = match headers.get(&XFF).map(HeaderValue::as_bytes) {
        Some(before) if !before.is_empty() => {
            let mut v = before.to_vec();
            v.extend_from_slice(b", ");
            v.extend_from_slice(ip.as_bytes());
            HeaderValue::from_bytes(&v)
        }
        _ => HeaderValue::from_str(&ip),
    };
    if let Ok(value) = value {
        headers.insert(XFF, value);
    }
}

/// Every route, with `--upstream`: the request to the upstream, its answer back.
pub async fn forward(
    State(proxy): State<Proxy>,
    ConnectInfo(client): ConnectInfo<SocketAddr>,
    req: Request,
) -> Response {
    let (mut parts, body) = req.into_parts();
    let path_and_query = parts.uri.path_and_query().map_or("/", PathAndQuery::as_str);
    parts.uri = match proxy.upstream.uri(path_and_query) {
        Ok(uri) => uri,
        Err(_) => return (StatusCode::BAD_REQUEST, "bad request target\n").into_response(),
    };
    // HTTP/1.1 to the upstream, whatever the client spoke.
    parts.version = http::Version::HTTP_11;
    drop_hop_by_hop(&mut parts.headers);
    forwarded_for(&mut parts.headers, client);
    let sent = proxy.client.request(Request::from_parts(parts, body));
    match tokio::time::timeout(proxy.timeout, sent).await {
        Ok(Ok(res)) => {
            let (mut parts, body) = res.into_parts();
            drop_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, Body::new(body))
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "upstream unreachable");
            (StatusCode::BAD_GATEWAY, "upstream unreachable\n").into_response()
        }
        Err(_) => {
            tracing::debug!(
                timeout_ms = proxy.timeout.as_millis() as u64,
                "upstream timed out"
            );
            (StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n").into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls_are_read_or_refused() {
        let u = Upstream::parse("http://127.0.0.1:8080/api/").unwrap();
        assert_eq!(u.describe(), "http://127.0.0.1:8080/api");
        assert_eq!(
            u.uri("/v1/x?a=%2F&b").unwrap().to_string(),
            "http://127.0.0.1:8080/api/v1/x?a=%2F&b"
        );
        let bare = Upstream::parse("http://backend").unwrap();
        assert_eq!(bare.uri("/").unwrap().to_string(), "http://backend/");
        for bad in [
            "https://backend",
            "backend:80",
            "http://",
            "http://u:p@backend",
            "http://backend/?q=1",
            "http://backend/#f",
            "ftp://backend",
        ] {
            assert!(Upstream::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hop_by_hop_headers_go_and_the_client_is_appended() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-private"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert("x-kept", HeaderValue::from_static("yes"));
        h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.7"));
        drop_hop_by_hop(&mut h);
        forwarded_for(&mut h, "10.0.0.2:5000".parse().unwrap());
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h["x-kept"], "yes");
        assert_eq!(h["x-forwarded-for"], "203.0.113.7, 10.0.0.2");
    }
}
