//! A check's keys and arguments as a batched check carries them to the batching task: the
//! keys in one buffer, the arguments inline. One allocation per check instead of one per key,
//! one for the list of keys and one for the arguments; these buffers are freed on another
//! thread (the batching task's), where every allocation costs the most.

/// Up to 4 arguments inline; more on the heap.
pub(crate) struct Args {
    inline: [u64; 4],
    len: usize,
    heap: Vec<u64>,
}

impl Args {
    pub(crate) fn new(args: &[u64]) -> Self {
        let mut inline = [0; 4];
        match inline.get_mut(..args.len()) {
            Some(head) => {
                head.copy_from_slice(args);
                Self {
                    inline,
                    len: args.len(),
                    heap: Vec::new(),
                }
            }
            None => Self {
                inline,
                len: 0,
                heap: args.to_vec(),
            },
        }
    }

    pub(crate) fn as_slice(&self) -> &[u64] {
        if self.heap.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }
}

/// A check's keys, one after the other in one buffer.
#[derive(Default)]
pub(crate) struct Keys {
    bytes: Vec<u8>,
    /// Where each key ends in `bytes`: the first 4 inline, the others on the heap.
    ends: [usize; 4],
    more_ends: Vec<usize>,
    len: usize,
}

impl Keys {
    /// Appends `key`.
    pub(crate) fn push(&mut self, key: &[u8]) {
        self.bytes.extend_from_slice(key);
        match self.ends.get_mut(self.len) {
            Some(end) => *end = self.bytes.len(),
            None => self.more_ends.push(self.bytes.len()),
        }
        self.len += 1;
    }

    /// How many keys there are.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The keys, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let ends = self.ends[..self.len.min(4)]
            .iter()
            .chain(&self.more_ends)
            .copied();
        let starts = std::iter::once(0).chain(ends.clone());
        starts.zip(ends).map(|(start, end)| &self.bytes[start..end])
    }

    /// The first key; empty when there is none.
    pub(crate) fn first(&self) -> &[u8] {
        self.iter().next().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_back_as_pushed() {
        for n in [0, 1, 3, 4, 5, 9] {
            let want: Vec<Vec<u8>> = (0..n)
                .map(|i| format!("{{k:{i}}}:{}", "x".repeat(i)).into_bytes())
                .collect();
            let mut keys = Keys::default();
            for k in &want {
                keys.push(k);
            }
            assert_eq!(keys.len(), n);
            assert_eq!(keys.iter().collect::<Vec<_>>(), want, "{n} keys");
            assert_eq!(keys.first(), want.first().map_or(&b""[..], |k| &k[..]));
        }
        let mut empty_key = Keys::default();
        empty_key.push(b"");
        empty_key.push(b"b");
        assert_eq!(empty_key.iter().collect::<Vec<_>>(), [&b""[..], b"b"]);
    }

    #[test]
    fn arguments_come_back_as_given() {
        for n in [0, 1, 3, 4, 5, 11] {
            let want: Vec<u64> = (0..n).map(|i| i * 1_000_003).collect();
            assert_eq!(Args::new(&want).as_slice(), &want[..], "{n} arguments");
        }
    }
}
