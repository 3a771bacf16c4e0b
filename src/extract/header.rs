use http::{header::HeaderName, request::Parts};

use super::KeyExtractor;
use crate::ConfigError;

/// The value of a request header, e.g. an API key.
///
/// Missing or empty header: no key. A value that is not UTF-8 is keyed by its hash, so every
/// byte string gets a stable key. Clients choose this value: combine it with authentication,
/// or a client can spread its requests over many made-up keys.
///
/// ```
/// use tower_redis_ratelimit::{HeaderKey, KeyExtractor};
///
/// let by_api_key = HeaderKey::new("x-api-key")?;
/// let req = http::Request::get("/").header("x-api-key", "k-123").body(()).unwrap();
/// assert_eq!(by_api_key.extract(&req.into_parts().0).as_deref(), Some("k-123"));
/// # Ok::<(), tower_redis_ratelimit::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys by the header `name`; an invalid header name is rejected (field `header`).
    pub fn new(name: &str) -> Result<Self, ConfigError> {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ConfigError::new("header", format!("{name:?} is not a header name")))?;
        Ok(Self { name })
    }

    /// The header name.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }
}

impl KeyExtractor for HeaderKey {
    fn extract(&self, parts: &Parts) -> Option<String> {
        let value = parts.headers.get(&self.name)?.as_bytes();
        if value.is_empty() {
            return None;
        }
        Some(match std::str::from_utf8(value) {
            Ok(s) => s.to_owned(),
            Err(_) => format!("#bin:{}", sha1_smol::Sha1::from(value).digest()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: &[u8]) -> Option<String> {
        let req = http::Request::get("/")
            .header("x-api-key", http::HeaderValue::from_bytes(value).unwrap())
            .body(())
            .unwrap();
        HeaderKey::new("x-api-key")
            .unwrap()
            .extract(&req.into_parts().0)
    }

    #[test]
    fn values() {
        assert_eq!(key(b"abc").as_deref(), Some("abc"));
        assert_eq!(key(b""), None);
        let bin = key(&[0xff, 0xfe]).unwrap();
        assert!(bin.starts_with("#bin:"));
        assert_eq!(key(&[0xff, 0xfe]).unwrap(), bin);
        assert_ne!(key(&[0xff, 0xfd]).unwrap(), bin);
        assert_eq!(HeaderKey::new("bad header").unwrap_err().field(), "header");
    }
}
