use http::{header::HeaderName, request::Parts};

use super::{Key, KeyExtractor};
use crate::error::ConfigError;

/// The value of a request header, e.g. an API key.
///
/// Missing or empty header: no key. The value is borrowed from the request (no allocation);
/// any bytes are a key, UTF-8 or not, and a long one is stored as its hash. Clients choose
/// this value: combine it with authentication, or a client can spread its requests over many
/// made-up keys.
///
/// ```
/// use tower_redis_ratelimit::{HeaderKey, KeyExtractor};
///
/// let by_api_key = HeaderKey::new("x-api-key")?;
/// let req = http::Request::get("/").header("x-api-key", "k-123").body(()).unwrap();
/// assert_eq!(by_api_key.extract(&req.into_parts().0).unwrap().to_string(), "k-123");
/// # Ok::<(), tower_redis_ratelimit::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys by the header `name`; an invalid header name is rejected (field `header`).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `header` when `name` is not a valid HTTP header name.
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
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>> {
        let value = parts.headers.get(&self.name)?.as_bytes();
        (!value.is_empty()).then(|| Key::bytes(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: &[u8]) -> Option<Key<'static>> {
        let req = http::Request::get("/")
            .header("x-api-key", http::HeaderValue::from_bytes(value).unwrap())
            .body(())
            .unwrap();
        HeaderKey::new("x-api-key")
            .unwrap()
            .extract(&req.into_parts().0)
            .map(Key::into_owned)
    }

    #[test]
    fn values() {
        assert_eq!(key(b"abc"), Some(Key::from("abc")));
        assert_eq!(key(b""), None);
        // Bytes that are not UTF-8 are a key of their own.
        let bin = key(&[0xff, 0xfe]).unwrap();
        assert_eq!(bin.as_bytes(), Some(&[0xff, 0xfe][..]));
        assert_ne!(key(&[0xff, 0xfd]).unwrap(), bin);
        assert_eq!(HeaderKey::new("bad header").unwrap_err().field(), "header");
    }
}
