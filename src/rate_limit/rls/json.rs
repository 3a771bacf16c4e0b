//! The request and the response in proto3's JSON mapping, as envoyproxy/ratelimit's `/json`
//! takes and gives them.

use serde_json::{json, Map, Value};

use super::proto::{
    Code, Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse, UInt64Value, Unit,
};

/// A [`RateLimitRequest`] from its JSON (field names in lowerCamelCase or as the proto
/// writes them; a 64-bit `hitsAddend` of a descriptor as a number or a string):
/// `{"domain": "edge", "descriptors": [{"entries": [{"key": "api_key", "value": "k"}]}]}`.
///
/// # Errors
///
/// What does not read: not JSON, a field that is not the request's, a value of the wrong type.
pub fn json_request(body: &[u8]) -> Result<RateLimitRequest, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let top = object(&value, "the request")?;
    let mut request = RateLimitRequest::default();
    for (name, v) in top {
        match name.as_str() {
            "domain" => request.domain = text(v, "domain")?,
            "descriptors" => {
                for d in list(v, "descriptors")? {
                    request.descriptors.push(descriptor(d)?);
                }
            }
            "hitsAddend" | "hits_addend" => {
                request.hits_addend = u32::try_from(whole(v, "hitsAddend")?)
                    .map_err(|_| "hitsAddend: over 4294967295".to_owned())?
            }
            other => return Err(format!("unknown field {other:?} in the request")),
        }
    }
    Ok(request)
}

fn descriptor(value: &Value) -> Result<RateLimitDescriptor, String> {
    let mut d = RateLimitDescriptor::default();
    for (name, v) in object(value, "a descriptor")? {
        match name.as_str() {
            "entries" => {
                for e in list(v, "entries")? {
                    let mut entry = Entry::default();
                    for (name, v) in object(e, "an entry")? {
                        match name.as_str() {
                            "key" => entry.key = text(v, "key")?,
                            "value" => entry.value = text(v, "value")?,
                            other => return Err(format!("unknown field {other:?} in an entry")),
                        }
                    }
                    d.entries.push(entry);
                }
            }
            "hitsAddend" | "hits_addend" => {
                d.hits_addend = Some(UInt64Value {
                    value: whole(v, "hitsAddend")?,
                })
            }
            // A caller's own limit: read as the protocol allows, not used.
            "limit" => {
                object(v, "limit")?;
            }
            other => return Err(format!("unknown field {other:?} in a descriptor")),
        }
    }
    Ok(d)
}

fn object<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>, String> {
    v.as_object()
        .ok_or_else(|| format!("{what} must be an object"))
}

fn list<'a>(v: &'a Value, what: &str) -> Result<&'a Vec<Value>, String> {
    v.as_array().ok_or_else(|| format!("{what} must be a list"))
}

fn text(v: &Value, what: &str) -> Result<String, String> {
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{what} must be a string"))
}

/// A whole number written as a number or, as proto3's JSON writes 64-bit ones, a string.
fn whole(v: &Value, what: &str) -> Result<u64, String> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("{what} must be a whole number from 0"))
}

/// A [`RateLimitResponse`] in JSON, as proto3's mapping writes it: lowerCamelCase names,
/// enums by name, durations as `"42s"`, fields at their default left out:
/// `{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","currentLimit":
/// {"requestsPerUnit":1,"unit":"MINUTE"},"durationUntilReset":"42s"}]}`.
pub fn json_response(response: &RateLimitResponse) -> String {
    let mut top = Map::new();
    if let Some(code) = code_name(response.overall_code) {
        top.insert("overallCode".into(), json!(code));
    }
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|s| {
            let mut m = Map::new();
            if let Some(code) = code_name(s.code) {
                m.insert("code".into(), json!(code));
            }
            if let Some(limit) = &s.current_limit {
                let mut l = Map::new();
                if !limit.name.is_empty() {
                    l.insert("name".into(), json!(limit.name));
                }
                if limit.requests_per_unit != 0 {
                    l.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
                }
                if let Some(unit) = unit_name(limit.unit) {
                    l.insert("unit".into(), json!(unit));
                }
                m.insert("currentLimit".into(), Value::Object(l));
            }
            if s.limit_remaining != 0 {
                m.insert("limitRemaining".into(), json!(s.limit_remaining));
            }
            if let Some(d) = &s.duration_until_reset {
                m.insert(
                    "durationUntilReset".into(),
                    json!(format!("{}s", d.seconds)),
                );
            }
            Value::Object(m)
        })
        .collect();
    if !statuses.is_empty() {
        top.insert("statuses".into(), Value::Array(statuses));
    }
    Value::Object(top).to_string()
}

fn code_name(code: i32) -> Option<&'static str> {
    match Code::try_from(code).ok()? {
        Code::Unknown => None,
        Code::Ok => Some("OK"),
        Code::OverLimit => Some("OVER_LIMIT"),
    }
}

fn unit_name(unit: i32) -> Option<&'static str> {
    Some(match Unit::try_from(unit).ok()? {
        Unit::Unknown => return None,
        Unit::Second => "SECOND",
        Unit::Minute => "MINUTE",
        Unit::Hour => "HOUR",
        Unit::Day => "DAY",
        Unit::Week => "WEEK",
        Unit::Month => "MONTH",
        Unit::Year => "YEAR",
    })
}
