//! A custom algorithm's calls ([`Scripted`]): its checks only (it reads no ban, gives nothing
//! back, cannot be read without a check; a reset deletes its keys). Its scripts are built (and
//! hashed) once per source, on first use, and kept for the life of the process, so that every
//! check of a custom algorithm is an `EVALSHA` with no hashing, as a built-in's is.

use std::{
    collections::HashMap,
    sync::{LazyLock, OnceLock, RwLock},
};

use redis::Script;

use super::{batch_form, reply, Args, Calls, Keys, ResetCall, ScriptCall};
use crate::{
    algorithm::{Outcome, Scripted},
    decision::Charge,
    error::Error,
    store::redis::batch::Layout,
    store::Pace,
};

impl<'a> Calls<'a> for &'a dyn Scripted {
    fn check(self, cost: u32) -> ScriptCall<'a> {
        let scripts = scripts(self);
        ScriptCall {
            script: &scripts.single,
            batch: self.batchable().then(|| scripts.batch()),
            keys: Keys::Suffixes(self.key_suffixes()),
            args: Args::List(self.args(cost)),
            marker: None,
            ban: false,
            time_last: false,
            layout: Layout::Generic,
        }
    }

    fn parse(self, _cost: u32, reply: redis::Value) -> Result<Outcome, Error> {
        self.parse_reply(&reply::ints(reply)?)
    }

    fn refund(self, _: &Charge, _: bool) -> Result<Option<ScriptCall<'a>>, Error> {
        Err(Error::Unsupported("a custom script cannot give units back"))
    }

    fn settle(
        self,
        _charge: &Charge,
        _actual: u32,
        _resendable: bool,
    ) -> Result<Option<ScriptCall<'a>>, Error> {
        Err(super::not_settled())
    }

    fn peek(self) -> Result<ScriptCall<'a>, Error> {
        Err(Error::Unsupported(
            "a custom algorithm cannot be read without a check",
        ))
    }

    fn reset(self) -> ResetCall<'a> {
        ResetCall::Delete(self.key_suffixes())
    }

    fn reserve(self, _cost: u32, _up_to: u32) -> Result<ScriptCall<'a>, Error> {
        Err(super::not_reserved())
    }

    fn schedule(self, _cost: u32, _budget_us: u64, _pace: Pace) -> Result<ScriptCall<'a>, Error> {
        Err(super::not_scheduled())
    }
}

/// A custom algorithm's script, and its batch form once asked for.
pub(crate) struct CustomScripts {
    pub(crate) single: Script,
    batch: OnceLock<Script>,
    source: &'static str,
}

impl CustomScripts {
    /// The batch form (see `lua/batch.lua`), built on first use.
    pub(crate) fn batch(&'static self) -> &'static Script {
        self.batch.get_or_init(|| batch_form("", self.source))
    }
}

/// The scripts of `scripted`'s source. Sources are `&'static str`, so there are as many as the
/// program has custom algorithms: each is built once and never freed. Looked up by the
/// source's address and length (no hashing of the text per check); the same text at two
/// addresses is two entries with one SHA-1, which Redis loads once.
fn scripts(scripted: &dyn Scripted) -> &'static CustomScripts {
    type Known = HashMap<(usize, usize), &'static CustomScripts>;
    static KNOWN: LazyLock<RwLock<Known>> = LazyLock::new(RwLock::default);
    let source = scripted.source();
    let id = (source.as_ptr() as usize, source.len());
    if let Some(found) = KNOWN.read().unwrap_or_else(|e| e.into_inner()).get(&id) {
        return found;
    }
    let mut known = KNOWN.write().unwrap_or_else(|e| e.into_inner());
    known.entry(id).or_insert_with(|| {
        Box::leak(Box::new(CustomScripts {
            single: Script::new(source),
            batch: OnceLock::new(),
            source,
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct S(&'static str);

    impl Scripted for S {
        fn source(&self) -> &'static str {
            self.0
        }
        fn key_suffixes(&self) -> &[&'static str] {
            &[":x"]
        }
        fn args(&self, cost: u32) -> Vec<u64> {
            vec![cost.into()]
        }
    }

    #[test]
    fn one_script_per_source() {
        const SOURCE: &str = "return { 1, 0, 0, 0 }";
        let a = scripts(&S(SOURCE));
        assert!(std::ptr::eq(a, scripts(&S(SOURCE))));
        assert_eq!(a.single.get_hash(), Script::new(SOURCE).get_hash());
        assert!(std::ptr::eq(a.batch(), a.batch()));
        assert_ne!(a.batch().get_hash(), a.single.get_hash());
        let other = scripts(&S("return { 0, 0, -1, 0 }"));
        assert_ne!(other.single.get_hash(), a.single.get_hash());
    }
}
