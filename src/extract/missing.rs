//! What a layer does with a request that has no key.

/// What the layer does with a request whose [`KeyExtractor`](super::KeyExtractor) found no
/// key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// All keyless requests share one quota (a key no client can produce). The default: a
    /// misconfigured extractor (e.g. [`PeerIp`](crate::PeerIp) without connection info)
    /// still limits, and the first such request logs a warning.
    #[default]
    Shared,
    /// Keyless requests are not limited and get no rate-limit headers.
    Allow,
}
