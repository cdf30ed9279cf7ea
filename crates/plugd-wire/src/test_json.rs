//! Test-only `proptest` strategies for the JSON that plugins send, and whole
//! JSON-RPC frames, for the property tests of plugd-host, plugd-dialects and
//! plugd-agent (feature `test-util`): values
//! biased towards the keys and strings a parser looks at, so properties reach
//! past "not an object".

use proptest::prelude::*;
use serde_json::{Value, json};

/// Any JSON value (depth ≤ 4) whose object keys are drawn from `keys` or
/// random, and whose strings are drawn from `strings` or random.
pub fn json_with(
    keys: &'static [&'static str],
    strings: &'static [&'static str],
) -> BoxedStrategy<Value> {
    let string = prop_oneof![
        proptest::sample::select(strings).prop_map(str::to_owned),
        any::<String>(),
        "[a-z_0-9\"\\\\ {}:]{0,10}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        (-1e6f64..1e6).prop_map(|f| json!(f)),
        string.prop_map(Value::String),
    ];
    let key = prop_oneof![
        3 => proptest::sample::select(keys).prop_map(str::to_owned),
        1 => "[a-z_]{0,8}",
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
    .boxed()
}

/// A JSON-RPC frame: usually a notification whose method is one of
/// `methods`, sometimes with an id (a request) or a result instead of the
/// method (a response); params, id and result are drawn from [`json_with`].
pub fn jsonrpc_frame(
    methods: &'static [&'static str],
    keys: &'static [&'static str],
    strings: &'static [&'static str],
) -> BoxedStrategy<Value> {
    (
        proptest::sample::select(methods),
        json_with(keys, strings),
        prop::option::weighted(0.2, json_with(keys, strings)),
        prop::option::weighted(0.1, json_with(keys, strings)),
    )
        .prop_map(|(method, params, id, result)| {
            let mut m = serde_json::Map::new();
            m.insert("jsonrpc".into(), json!("2.0"));
            m.insert("method".into(), json!(method));
            m.insert("params".into(), params);
            if let Some(id) = id {
                m.insert("id".into(), id);
            }
            if let Some(result) = result {
                m.remove("method");
                m.insert("result".into(), result);
            }
            Value::Object(m)
        })
        .boxed()
}
