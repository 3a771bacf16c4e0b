use http::request::Parts;

use super::{Key, KeyExtractor};

/// One key for every request: a global quota for the whole service (e.g. to protect a
/// downstream that can take N requests per second in total).
///
/// ```
/// use tower_redis_ratelimit::{GlobalKey, KeyExtractor};
/// let req = http::Request::get("/").body(()).unwrap();
/// assert_eq!(GlobalKey.extract(&req.into_parts().0).unwrap().to_string(), "global");
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    fn extract<'a>(&self, _: &'a Parts) -> Option<Key<'a>> {
        Some(Key::text("global"))
    }
}
