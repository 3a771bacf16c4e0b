//! A key's bytes as the in-process map holds them: inline while short, so that a key seen
//! again after its entry was swept comes back without an allocation.

/// Bytes held in place up to this length. A compact key is its limiter's namespace
/// (`rl:default`), the algorithm's name and the request's key: 20 to 40 bytes for an API key
/// of up to 20 characters, an IP address or a network. The whole key then takes 48 bytes in
/// the map's slot, less than a pointer to a heap copy and that copy.
const INLINE: usize = 46;

/// A map key's bytes.
#[derive(Clone)]
pub(crate) enum MapKey {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl MapKey {
    pub(crate) fn new(key: &[u8]) -> Self {
        if key.len() <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..key.len()].copy_from_slice(key);
            // `INLINE` < 256.
            Self::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            Self::Heap(key.into())
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Heap(bytes) => bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keys_are_inline_and_every_key_reads_back() {
        for len in [0, 1, 24, INLINE, INLINE + 1, 300] {
            let key: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let held = MapKey::new(&key);
            assert_eq!(held.as_bytes(), &key[..]);
            assert_eq!(
                matches!(held, MapKey::Inline { .. }),
                len <= INLINE,
                "{len}"
            );
        }
        assert_eq!(std::mem::size_of::<MapKey>(), 48);
    }
}
