//! Machine-readable output. The key names are a contract: scripts rely on them.

use serde::Serialize;

pub fn to_string<T: Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).expect("model structs always serialize")
}
