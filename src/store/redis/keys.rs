//! The Redis key layout: every key a [`RedisStore`](super::RedisStore) reads or writes, and the
//! functions that name them. Nothing outside this file spells a key.
//!
//! Every key of one check starts with the check's **base key** `{NS:KEY}`: `NS` is the
//! limiter's namespace (`prefix:policy`), `KEY` the request's key as stored (below). The
//! braces are a Redis Cluster hash tag, so all of a check's keys land on one slot and one
//! script can touch them all. Times are microseconds on the server's clock (`TIME`); every
//! key is written with an expiry.
//!
//! | key | type: content | written by | expires |
//! |---|---|---|---|
//! | `{NS:KEY}:g` | string: GCRA's theoretical arrival time (TAT); while the key is banned, `TAT:BAN`, the TAT (`0` for a rested key) and a copy of the ban's end (`:x`), so that GCRA's check reads one key | `gcra.lua`, `gcra_batch.lua`, `gcra_reserve.lua`, `gcra_refund.lua` and `gcra_settle.lua` (keeping the ban's copy); the ban's copy: `ban.lua` (whatever the limiter's algorithm), kept by `reset.lua` on a reset, taken off by `forget.lua` on an unban | when the TAT passes (the key is rested again) and the ban has ended |
//! | `{NS:KEY}:gr` | string: the refund ledger of `:g` (`until floor`, then `at moved_at back until` per refund) | `gcra_refund.lua`, `gcra_settle.lua`; `reset.lua` (a floor at the reset's time, for one burst's worth of the key's time) | when every charge a refund moved has drained (`until`) |
//! | `{NS:KEY}:b` | hash: token bucket, `n` whole tokens, `t` when the last one was credited | `token_bucket.lua`, `token_bucket_reserve.lua`, `token_bucket_schedule.lua`, `token_bucket_refund.lua`, `token_bucket_settle.lua` | when the bucket is full again |
//! | `{NS:KEY}:br` | string: the refund ledger of `:b` (as `:gr`) | `token_bucket_refund.lua`, `token_bucket_settle.lua`, `reset.lua` | as `:gr` |
//! | `{NS:KEY}:w` | string: a fixed window, `ID COUNT`: the units admitted in the current window and its id (a time inside it: its start, or just after the reset that zeroed it) | `fixed_window.lua`, `fixed_window_refund.lua`, `fixed_window_settle.lua`; `reset.lua` (count 0, a new id, its expiry kept) | when the window ends |
//! | `{NS:KEY}:l2` | sorted set: sliding-window log, one member `TOTAL:SEQ` per admitted check, scored by its time | `sliding_window.lua`, `sliding_window_refund.lua`, `sliding_window_settle.lua` | a window after the newest member |
//! | `{NS:KEY}:m2` | hash: the log's totals, `a` admitted, `r` expired, `l` newest member's time, `s` last sequence number | `sliding_window.lua`, `sliding_window_refund.lua`, `sliding_window_settle.lua`; `reset.lua` (nothing in use, `l` and `s` kept) | with its log |
//! | `{NS:KEY}:q:NAME` | string: the TAT of limit `NAME` of a multi-limit | `multi_gcra.lua`, `gcra_refund.lua`; for budgets `multi_gcra_settle.lua` (refunds and settlements) | as `:g` |
//! | `{NS:KEY}:qr:NAME` | string: the refund ledger of `:q:NAME` | `gcra_refund.lua`, `multi_gcra_settle.lua`, `reset.lua` | as `:gr` |
//! | `{NS:KEY}:rf:ID` | string `1`: a refund or a settlement with this id ran (on a cluster only, whose client may send a call again) | `gcra_refund.lua`, `token_bucket_refund.lua`, `fixed_window_refund.lua`, each `*_settle.lua` | 30 s |
//! | `{NS:KEY}:x` | string: when the key's ban ends (read by every check, reservation and peek of the key, whatever its algorithm but a custom one; GCRA's check and its batch form read the copy in `:g` instead) | `ban.lua`; deleted by `forget.lua` on an unban | when the ban ends |
//! | `{NS:KEY}:ab` | string: the key's refusals counted toward an automatic ban in the current window (a policy with `RateLimiterBuilder::ban_after`) | `autoban.lua` (`INCR`; deleted when a ban starts, by it or by `ban.lua`) | when the window (`within`) ends, from the window's first refusal |
//! | `{NS:KEY}:al` | string: the key's last automatic ban, `DURATION:OFFENCE` (µs, and which ban of the key it was), read to escalate the next | `autoban.lua` | a day after that ban ends |
//! | `{NS:KEY}:c` | sorted set: concurrency holders, scored by the deadline of its time to live | `semaphore_acquire.lua`, `semaphore_renew.lua`, `semaphore_release.lua` | the latest deadline |
//! | `{NS:KEY}:cx` | sorted set: holders released while a renewal of theirs got no answer, scored by the end of their guard | `semaphore_release.lua` (read by `semaphore_renew.lua`) | the latest guard |
//! | `{NS:#epoch}:c`, on a cluster `{NS:#epoch:N}:c` (`N` chosen per hash slot) | hash: `e` when this server's slots began, `p` no new holder before | `semaphore_epoch.lua` (in acquire and renew) | a day after the last call |
//! | `{NS:#epoch}:m` | string: the limit's marker, a token set by the first instance that found none (an instance that finds another token than the one it saw knows the store lost the limit's state) | `store_marker.lua` (`RateLimiter::notice_reset`) | a day after the last look |
//! | `{NS:#epoch}:t` | hash: each instance's top keys (field the instance's id, value its snapshot) | `top_publish.lua` (`RateLimiter::publish_top_keys`; read by `top_read.lua`) | 10 s after the last publication |
//! | `{NS:#epoch}:tp` | sorted set: each instance, scored by when it last published (ms); an instance silent for 10 s is dropped from both | `top_publish.lua` | as `:t` |
//! | `{NS:KEY}:rp` | hash, in each region's Redis (several regions): the key's pool, `u1`/`e1` and `u2`/`e2` two blocks' units and expiry, `o` units owed to the home, `s` units asked for since `t`, `a0`..`a31` a ring of what the region admitted, `n` the latest time a script saw | `regional_spend.lua`, `regional_fill.lua` | a pool lifetime after the last check |
//! | `{NS:KEY}:rm` | string `1`, in each region's Redis: a refill of the pool is in flight, or the home had nothing to grant | `regional_spend.lua`, `regional_fill.lua` | the refill's deadline, or until the home has a unit |
//! | `{NS:KEY}:rd` | hash, in the home region's Redis: each region's last demand, field the region's index, `WANT:TIME` | `regional_grant_gcra.lua`, `regional_grant_bucket.lua` | a few lead times after the last grant |
//! | `{NS:KEY}:rs` | string, in each region's Redis: the TAT of the GCRA at the region's share, used while the region is cut off | `regional_spend.lua` | when the TAT passes |
//! | `{NS:KEY}:u` | hash: what an upstream said, `p` paused until, `r` units left in its window, `e` the window's end, `q` a call learns the next window until, `b` units sent blind since `s`, `n` and `w` its rate (units per window), `t` the next free place in its pace, `x` the rate was estimated from a 429, `a` calls answered without a word since `c` | `upstream_take.lua`, `upstream_learn.lua`, `upstream_settle.lua` | a minute past the pause, the window and the pace |
//! | `{NS:KEY}:ut` | hash: the same as `:u` for the upstream's token budget (counted in tokens; `t` also moved by settlements) | `upstream_take.lua`, `upstream_learn.lua`, `upstream_settle.lua` | a minute past the pause, the window and the pace |
//! | `{NS:KEY}SUFFIX` | a custom algorithm's (its [`key_suffixes`](crate::algorithm::Scripted::key_suffixes)) | its script | its script's |
//!
//! A ban is in force in both `:x` and `:g` or in neither: `ban.lua` writes both, an unban
//! deletes `:x` and takes the copy off `:g`, a reset deletes `:g`'s TAT and keeps the copy, and a
//! script that writes a plain TAT into `:g` (a check, a reservation) does so only when no ban is
//! in force. Several regions (`RegionalStore`) take no bans, so their scripts read `:g` as a
//! plain TAT (a ban's copy there is an error naming the key).
//!
//! `KEY` as stored, always UTF-8: text as it is, unless longer than the limiter's bound or
//! starting with `#` (then `#` and its SHA-1 in hex, so no client key can spell the forms
//! below); bytes that are not UTF-8 as `#` and their SHA-1; an IP address `#ip:ADDR`, a
//! network `#ip:ADDR/BITS`, a number `#n:N`; no key (the quota keyless requests share) `#`.
//! No client key is stored as `#epoch`.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, LazyLock, RwLock},
};

use crate::{
    extract::{Key, Out, Repr},
    store::StoreKey,
};

/// GCRA's TAT.
pub(crate) const GCRA: &str = ":g";
/// GCRA's refund ledger.
pub(crate) const GCRA_LEDGER: &str = ":gr";
/// The token bucket.
pub(crate) const BUCKET: &str = ":b";
/// The token bucket's refund ledger.
pub(crate) const BUCKET_LEDGER: &str = ":br";
/// A fixed window's id and count.
pub(crate) const WINDOW: &str = ":w";
/// The sliding-window log.
pub(crate) const LOG: &str = ":l2";
/// The sliding-window log's totals.
pub(crate) const LOG_TOTALS: &str = ":m2";
/// A multi-limit's TAT of one limit, before the limit's name.
pub(crate) const LIMIT: &str = ":q:";
/// A multi-limit's refund ledger of one limit, before the limit's name.
pub(crate) const LIMIT_LEDGER: &str = ":qr:";
/// A refund's marker, before the refund's id.
pub(crate) const REFUND_MARKER: &str = ":rf:";
/// The key's ban: when it ends.
pub(crate) const BAN: &str = ":x";
/// The key's refusals counted toward an automatic ban.
pub(crate) const REFUSALS: &str = ":ab";
/// The key's last automatic ban, for the next one's escalation.
pub(crate) const LAST_BAN: &str = ":al";
/// Concurrency holders.
pub(crate) const HOLDERS: &str = ":c";
/// Holders released while a renewal of theirs got no answer.
pub(crate) const RELEASED: &str = ":cx";
/// What an upstream said.
pub(crate) const UPSTREAM: &str = ":u";
/// What an upstream said of its token budget (the same hash as `:u`, counted in tokens).
pub(crate) const UPSTREAM_TOKENS: &str = ":ut";
/// Several regions: the key's pool of granted units in a region's Redis.
pub(crate) const REGION_POOL: &str = ":rp";
/// Several regions: a refill of the pool is in flight.
pub(crate) const REGION_MARKER: &str = ":rm";
/// Several regions: each region's last demand, at the home.
pub(crate) const REGION_DEMAND: &str = ":rd";
/// Several regions: the TAT of the region's share, while it is cut off.
pub(crate) const REGION_SHARE: &str = ":rs";

/// Writes `key`'s base key, `{NS:KEY}`.
pub(crate) fn write_base(key: StoreKey<'_>, out: &mut impl Out) {
    out.put(b"{");
    out.put(key.namespace().as_bytes());
    out.put(b":");
    match key.key() {
        Some(k) => write_stored(k, key.max_len(), out),
        // No client key is stored as `#`: keys starting with `#` are stored hashed.
        None => out.put(b"#"),
    }
    out.put(b"}");
}

/// Writes the key `suffix` (one of the constants above, with a name or an id after the
/// ones that take one) of `key`'s base key.
pub(crate) fn write_key(key: StoreKey<'_>, suffix: &str, out: &mut impl Out) {
    write_base(key, out);
    out.put(suffix.as_bytes());
}

/// The names of a check's keys in Redis, for the limiters' `storage_key`: the only way code
/// outside this module learns a Redis key name.
impl StoreKey<'_> {
    /// The base key as text: what a rate limiter's state is stored under (see
    /// [`RateLimiter::storage_key`](crate::RateLimiter::storage_key)).
    pub(crate) fn redis_base_key(&self) -> String {
        let mut out = Vec::new();
        write_base(*self, &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The concurrency holders' key as text (see
    /// [`ConcurrencyLimiter::storage_key`](crate::concurrency::ConcurrencyLimiter::storage_key)).
    pub(crate) fn redis_holders_key(&self) -> String {
        let mut out = Vec::new();
        write_key(*self, HOLDERS, &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// The epoch marker of `namespace`'s concurrency holders: `{NS:#epoch}:c` on one server; on a
/// cluster `{NS:#epoch:N}:c`, with `N` chosen so that the marker falls in `slot`, the holders'
/// hash slot (one script then reaches both).
pub(crate) fn write_epoch(namespace: &str, slot: Option<u16>, out: &mut impl Out) {
    out.put(b"{");
    out.put(namespace.as_bytes());
    out.put(b":#epoch");
    if let Some(slot) = slot {
        out.put(b":");
        write_u64(u64::from(slot_tags(namespace)[usize::from(slot)]), out);
    }
    out.put(b"}");
    out.put(HOLDERS.as_bytes());
}

/// The marker of `namespace`'s state: `{NS:#epoch}:m`.
pub(crate) fn write_marker(namespace: &str, out: &mut impl Out) {
    out.put(b"{");
    out.put(namespace.as_bytes());
    out.put(b":#epoch}:m");
}

/// The fleet's top keys of `namespace`: each instance's snapshot, `{NS:#epoch}:t`, and when
/// each last published, `{NS:#epoch}:tp`.
pub(crate) fn write_tops(namespace: &str, snapshots: &mut impl Out, published: &mut impl Out) {
    snapshots.put(b"{");
    snapshots.put(namespace.as_bytes());
    snapshots.put(b":#epoch}:t");
    published.put(b"{");
    published.put(namespace.as_bytes());
    published.put(b":#epoch}:tp");
}

/// For each cluster hash slot, a number `n` such that the tag `namespace:#epoch:n` falls in
/// that slot. Found once per namespace (about 170,000 CRCs).
fn slot_tags(namespace: &str) -> Arc<[u32]> {
    static TAGS: LazyLock<RwLock<HashMap<String, Arc<[u32]>>>> = LazyLock::new(RwLock::default);
    let known = TAGS.read().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = known.get(namespace) {
        return Arc::clone(found);
    }
    drop(known);
    let mut tags = TAGS.write().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = tags.get(namespace) {
        return Arc::clone(found);
    }
    let mut prefix = crc16::State::<crc16::XMODEM>::new();
    prefix.update(namespace.as_bytes());
    prefix.update(b":#epoch:");
    let mut found = vec![u32::MAX; 16_384];
    let mut missing = found.len();
    let mut n = 0u32;
    while missing > 0 {
        let mut crc = prefix;
        crc.update(n.to_string().as_bytes());
        let slot = &mut found[usize::from(crc.get() % 16_384)];
        if *slot == u32::MAX {
            *slot = n;
            missing -= 1;
        }
        n += 1;
    }
    let found: Arc<[u32]> = found.into();
    tags.insert(namespace.to_owned(), Arc::clone(&found));
    found
}

/// The Redis Cluster slot of a key: CRC16 of its hash tag (all of a check's keys share it).
pub(crate) fn slot(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key)) % 16_384
}

/// The hash tag of `key`: what is between the first `{` and the next `}` when not empty, else
/// the whole key.
fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    match key[open + 1..].iter().position(|&b| b == b'}') {
        Some(len) if len > 0 => &key[open + 1..open + 1 + len],
        _ => key,
    }
}

/// Writes `key` as it appears in a Redis key (see the module docs), hashing text longer than
/// `max_len`.
fn write_stored(key: &Key<'_>, max_len: usize, out: &mut impl Out) {
    match key.repr() {
        Repr::Text(t) if t.len() <= max_len && !t.starts_with('#') => out.put(t.as_bytes()),
        Repr::Text(t) => write_sha1(t.as_bytes(), out),
        Repr::Bytes(b) => write_sha1(b, out),
        Repr::Ip(ip) => {
            out.put(b"#ip:");
            write_ip(*ip, out);
        }
        Repr::Net(ip, bits) => {
            out.put(b"#ip:");
            write_ip(*ip, out);
            out.put(b"/");
            write_u64(u64::from(*bits), out);
        }
        Repr::Number(n) => {
            out.put(b"#n:");
            write_u64(*n, out);
        }
    }
}

/// `#` and the SHA-1 of `bytes` in hex.
fn write_sha1(bytes: &[u8], out: &mut impl Out) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = sha1_smol::Sha1::from(bytes).digest().bytes();
    let mut hex = [0u8; 41];
    hex[0] = b'#';
    for (i, b) in digest.iter().enumerate() {
        hex[1 + 2 * i] = HEX[usize::from(b >> 4)];
        hex[2 + 2 * i] = HEX[usize::from(b & 15)];
    }
    out.put(&hex);
}

fn write_u64(mut n: u64, out: &mut impl Out) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.put(&digits[i..]);
}

/// The address in its standard text form, without allocating.
fn write_ip(ip: IpAddr, out: &mut impl Out) {
    use std::io::Write;
    // The longest IPv6 text form is 45 bytes.
    let mut buf = [0u8; 48];
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    let _ = write!(cursor, "{ip}");
    let len = cursor.position() as usize;
    out.put(&buf[..len]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(key: Key<'_>) -> String {
        let mut out = Vec::new();
        write_stored(&key, 128, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn stored_forms_never_collide_across_kinds() {
        let v4: IpAddr = "203.0.113.7".parse().unwrap();
        assert_eq!(stored(Key::from("203.0.113.7")), "203.0.113.7");
        assert_eq!(stored(Key::ip(v4)), "#ip:203.0.113.7");
        assert_eq!(stored(Key::number(42)), "#n:42");
        assert_eq!(stored(Key::from("42")), "42");
        let v6: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        assert_eq!(stored(Key::network(v6, 64)), "#ip:2001:db8:1:2::/64");
        assert_eq!(stored(Key::network(v4, 24)), "#ip:203.0.113.0/24");
        assert_eq!(stored(Key::network(v4, 32)), "#ip:203.0.113.7");
        // Text that looks like one of those forms is hashed.
        let forged = stored(Key::from("#ip:203.0.113.7"));
        assert!(forged.starts_with('#') && forged.len() == 41, "{forged}");
        assert_eq!(stored(Key::from("x".repeat(200))).len(), 41);
        // Mapped addresses are their IPv4 address.
        let mapped: IpAddr = "::ffff:203.0.113.7".parse().unwrap();
        assert_eq!(Key::ip(mapped), Key::ip(v4));
        assert_eq!(Key::bytes(&b"abc"[..]), Key::from("abc"));
        // Bytes that are not UTF-8: stored as their hash, so every Redis key is UTF-8.
        let bin = stored(Key::bytes(&[0xff, 0x80][..]));
        assert!(bin.starts_with('#') && bin.len() == 41, "{bin}");
        assert_ne!(bin, stored(Key::bytes(&[0xff, 0x81][..])));
    }

    #[test]
    fn keys_of_a_check_share_its_base_and_its_slot() {
        let k = Key::from("user-42");
        let key = StoreKey::bounded("rl:default", Some(&k), 128);
        assert_eq!(key.redis_base_key(), "{rl:default:user-42}");
        assert_eq!(key.redis_holders_key(), "{rl:default:user-42}:c");
        let mut gcra = Vec::new();
        write_key(key, GCRA, &mut gcra);
        assert_eq!(gcra, b"{rl:default:user-42}:g");
        assert_eq!(slot(&gcra), slot(key.redis_base_key().as_bytes()));
        let keyless = StoreKey::bounded("rl:default", None, 128);
        assert_eq!(keyless.redis_base_key(), "{rl:default:#}");
        let long = "k".repeat(129);
        let long = Key::from(long.as_str());
        assert_eq!(
            StoreKey::bounded("rl:default", Some(&long), 128)
                .redis_base_key()
                .len(),
            "{rl:default:#}".len() + 40
        );
    }

    #[test]
    fn slots_match_redis_cluster() {
        // CLUSTER KEYSLOT values from a real Redis 7.0.
        let k = str::as_bytes;
        assert_eq!(slot(k("foo")), 12182);
        assert_eq!(slot(k("{user1000}.following")), 3443);
        assert_eq!(slot(k("{user1000}.followers")), 3443);
        assert_eq!(slot(k("{rl:a}:g")), slot(k("{rl:a}:l")));
    }

    #[test]
    fn hash_tags() {
        let k = str::as_bytes;
        assert_eq!(hash_tag(k("{rl:a}:l")), b"rl:a");
        assert_eq!(hash_tag(k("x{rl:a}")), b"rl:a");
        assert_eq!(hash_tag(k("{}x")), b"{}x");
        assert_eq!(hash_tag(k("plain")), b"plain");
        assert_eq!(hash_tag(b""), b"");
    }

    #[test]
    fn each_cluster_slot_has_an_epoch_marker_of_its_own() {
        let tags = slot_tags("rl:concurrency");
        assert_eq!(tags.len(), 16_384);
        for (s, n) in tags.iter().enumerate().step_by(97) {
            let tag = format!("{{rl:concurrency:#epoch:{n}}}:c");
            assert_eq!(usize::from(slot(tag.as_bytes())), s, "{tag}");
        }
        let k = Key::from("user-42");
        let key = StoreKey::bounded("rl:concurrency", Some(&k), 128);
        let holders = key.redis_holders_key();
        let mut marker = Vec::new();
        write_epoch(
            "rl:concurrency",
            Some(slot(holders.as_bytes())),
            &mut marker,
        );
        assert_eq!(slot(&marker), slot(holders.as_bytes()));
        let mut one = Vec::new();
        write_epoch("rl:concurrency", None, &mut one);
        assert_eq!(one, b"{rl:concurrency:#epoch}:c");
    }
}
