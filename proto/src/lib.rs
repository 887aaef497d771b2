//! The wire contract: generated prost messages and tonic services for package `tether.v1`.
//!
//! Only this crate knows the generated types' layout; conversions to domain types live next to
//! those types and reject bad input there.

#[allow(clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("tether.v1");
}

pub use v1::*;

/// The worker session's protocol this build speaks (`Hello.protocol`, `HelloAck.protocol`).
/// Raise it with a change a peer must know about; raise [`OLDEST_PROTOCOL`] when this build
/// stops talking to peers older than that.
pub const PROTOCOL_VERSION: u32 = 2;

/// The oldest peer protocol this build still talks to.
pub const OLDEST_PROTOCOL: u32 = 2;

/// Whether a peer (`"worker"` or `"brain"`) that says it speaks `theirs` can talk to this
/// build, which talks to peers from `oldest` on; if not, which side to upgrade, in words.
/// Only the newer side can tell: a peer newer than this build is taken (it refuses this one
/// if it must).
pub fn compatible(peer: &str, theirs: u32, oldest: u32) -> Result<(), String> {
    // Peers from before the version was said speak 1.
    let theirs = theirs.max(1);
    if theirs < oldest {
        return Err(format!(
            "the {peer} speaks session protocol {theirs} and this {me} talks to {oldest} and later: upgrade the {peer} to this {me}'s version ({})",
            env!("CARGO_PKG_VERSION"),
            me = if peer == "worker" { "brain" } else { "worker" },
        ));
    }
    Ok(())
}

pub mod log;

/// Proto3's JSON mapping for 64-bit integers: written as decimal strings, because JavaScript
/// (and jq) hold integers exactly only up to 2^53 and would round ids above it; read from a
/// string or, as proto3 parsers also accept, a number. Every 64-bit field of the generated
/// messages goes through it (`build.rs`).
pub mod json64 {
    use std::borrow::Cow;
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<T: Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        Unsigned(u64),
        Signed(i64),
        Text(String),
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr + TryFrom<u64> + TryFrom<i64>,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        let out_of_range = |n: &dyn Display| D::Error::custom(format!("{n} is out of range"));
        match Given::deserialize(d) {
            Ok(Given::Unsigned(n)) => T::try_from(n).map_err(|_| out_of_range(&n)),
            Ok(Given::Signed(n)) => T::try_from(n).map_err(|_| out_of_range(&n)),
            Ok(Given::Text(s)) => s.trim().parse().map_err(|e| {
                D::Error::custom(format!("{s:?} is not a whole number in range: {e}"))
            }),
            Err(_) => Err(D::Error::custom(
                "expected a 64-bit integer, as a decimal string like \"42\"",
            )),
        }
    }

    /// The JSON Schema of such a field: a string of digits.
    pub struct Int64;

    impl schemars::JsonSchema for Int64 {
        fn schema_name() -> Cow<'static, str> {
            "Int64".into()
        }

        fn inline_schema() -> bool {
            true
        }

        fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
            schemars::json_schema!({
                "type": "string",
                "pattern": "^-?[0-9]+$",
                "description": "A 64-bit integer in decimal, as a string (proto3's JSON mapping)"
            })
        }
    }

    #[cfg(test)]
    mod tests {
        #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
        struct Ids {
            #[serde(with = "super")]
            call: u64,
            #[serde(with = "super")]
            at: i64,
        }

        #[test]
        fn wide_integers_are_strings_and_read_from_either() {
            let ids = Ids {
                call: 117_722_876_144_320_515,
                at: -3,
            };
            let json = serde_json::to_string(&ids).unwrap();
            assert_eq!(json, r#"{"call":"117722876144320515","at":"-3"}"#);
            assert_eq!(serde_json::from_str::<Ids>(&json).unwrap(), ids);
            let numbers: Ids = serde_json::from_str(r#"{"call":7,"at":-3}"#).unwrap();
            assert_eq!(numbers, Ids { call: 7, at: -3 });
            for bad in [
                r#"{"call":"-1","at":"0"}"#,
                r#"{"call":"x","at":"0"}"#,
                r#"{"call":1.5,"at":"0"}"#,
                r#"{"call":"18446744073709551616","at":"0"}"#,
            ] {
                let e = serde_json::from_str::<Ids>(bad).unwrap_err().to_string();
                assert!(!e.is_empty(), "{bad}");
            }
            let e = serde_json::from_str::<Ids>(r#"{"call":"x","at":"0"}"#)
                .unwrap_err()
                .to_string();
            assert!(e.contains("\"x\" is not a whole number"), "{e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::compatible;

    #[test]
    fn an_older_peer_than_this_build_talks_to_is_told_to_upgrade() {
        assert!(compatible("worker", 3, 2).is_ok());
        assert!(compatible("worker", 9, 2).is_ok(), "the newer side judges");
        let e = compatible("worker", 1, 2).unwrap_err();
        assert!(e.contains("upgrade the worker"), "{e}");
        assert!(e.contains("protocol 1") && e.contains("2 and later"), "{e}");
        let e = compatible("brain", 0, 2).unwrap_err();
        assert!(e.contains("upgrade the brain"), "{e}");
        assert!(e.contains("this worker talks to 2"), "{e}");
        // One from before the version was said speaks 1.
        assert!(compatible("brain", 0, 1).is_ok());
    }
}
