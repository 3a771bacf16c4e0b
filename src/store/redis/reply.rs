//! Reading a script's reply: the integers every script answers with.

use redis::Value;

use crate::error::Error;

/// The integers of a reply that is an array of them (bulk strings holding integers read the
/// same); anything else is an [`Error::InvalidReply`] showing the reply.
pub(crate) fn ints(reply: Value) -> Result<Vec<i64>, Error> {
    match &reply {
        Value::Array(_) => redis::from_redis_value_ref::<Vec<i64>>(&reply).ok(),
        _ => None,
    }
    .ok_or_else(|| Error::InvalidReply(format!("expected an array of integers: {reply:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_arrays_of_integers_are_read() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(
            ints(Value::Array(vec![Value::Int(1), bulk("4")])).unwrap(),
            [1, 4]
        );
        for v in [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![Value::Nil; 4]),
            Value::Array(vec![bulk("x")]),
            Value::SimpleString("OK".into()),
        ] {
            assert!(
                matches!(ints(v.clone()), Err(Error::InvalidReply(_))),
                "{v:?}"
            );
        }
    }
}
