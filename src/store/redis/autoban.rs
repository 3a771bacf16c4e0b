//! One refusal counted toward an automatic ban, in Redis (`lua/autoban.lua`).

use std::sync::LazyLock;

use redis::Script;

use super::{keys, link, reply};
use crate::{
    error::Error,
    store::{
        offences::{BanTerms, Counted},
        KeyBuf, StoreKey,
    },
};

/// The script: the count, the ban, its escalation.
pub(crate) static AUTOBAN: LazyLock<Script> =
    prelude_script!("autoban.lua", after "gcra_state.lua");

/// The call counting one refusal of `key` under `terms`.
pub(crate) fn call(key: StoreKey<'_>, terms: &BanTerms, now_us: Option<u64>) -> redis::Cmd {
    let mut names = [KeyBuf::new(), KeyBuf::new(), KeyBuf::new(), KeyBuf::new()];
    let suffixes = [keys::BAN, keys::GCRA, keys::REFUSALS, keys::LAST_BAN];
    for (name, suffix) in names.iter_mut().zip(suffixes) {
        keys::write_key(key, suffix, name);
    }
    let mut cmd = link::evalsha(
        &AUTOBAN,
        4,
        |cmd| {
            for name in &names {
                cmd.arg(name.as_bytes());
            }
        },
        now_us,
    );
    cmd.arg(terms.after)
        .arg(terms.within_us)
        .arg(terms.for_us)
        .arg(terms.escalate_milli)
        .arg(u8::from(terms.shadow));
    cmd
}

/// Reads the script's reply: `{refusals, ban_us, offence}`.
pub(crate) fn counted(value: redis::Value) -> Result<Counted, Error> {
    let shown = format!("{value:?}");
    let bad = || Error::InvalidReply(format!("a count of refusals answered {shown}"));
    match reply::ints(value).map_err(|_| bad())?[..] {
        [refusals, ban_us, offence] => Ok(Counted {
            refusals: u32::try_from(refusals).map_err(|_| bad())?,
            ban_us: u64::try_from(ban_us).map_err(|_| bad())?,
            offence: u32::try_from(offence).map_err(|_| bad())?,
        }),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    #[test]
    fn replies_read_as_counts() {
        let v = |xs: &[i64]| Value::Array(xs.iter().map(|&x| Value::Int(x)).collect());
        let c = counted(v(&[3, 2_000_000, 1])).unwrap();
        assert_eq!((c.refusals, c.ban_us, c.offence), (3, 2_000_000, 1));
        assert!(counted(v(&[3, 2])).is_err());
        assert!(counted(v(&[-1, 0, 0])).is_err());
        assert!(counted(Value::Nil).is_err());
    }
}
