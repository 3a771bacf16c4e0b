//! Ids unique across every instance sharing a store: concurrency permits' holders, refund markers.

use std::{
    collections::hash_map::RandomState,
    hash::{BuildHasher, Hasher},
    sync::{
        atomic::{AtomicU64, Ordering},
        OnceLock,
    },
    time::{SystemTime, UNIX_EPOCH},
};

/// 128 random bits for this process, then a counter: `<32 hex digits>:<counter in hex>`.
///
/// The random part comes from the standard library's hash keys (seeded from the operating
/// system's random source), mixed with the process id and the time, so two instances (or two
/// runs of one) never pick the same prefix; the counter keeps one instance's ids apart.
pub(crate) fn next() -> String {
    static INSTANCE: OnceLock<u128> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let instance = *INSTANCE.get_or_init(|| {
        let half = |salt: u64| {
            let mut h = RandomState::new().build_hasher();
            h.write_u64(salt);
            h.write_u32(std::process::id());
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            h.write_u128(now.as_nanos());
            h.finish()
        };
        (u128::from(half(1)) << 64) | u128::from(half(2))
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{instance:032x}:{n:x}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_distinct_and_share_the_instance_part() {
        let (a, b) = (super::next(), super::next());
        assert_ne!(a, b);
        assert_eq!(a[..33], b[..33]);
        assert_eq!(a.as_bytes()[32], b':');
    }
}
