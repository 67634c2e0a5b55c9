//! Request headers that are the host's alone.
//!
//! The host attaches credentials to the requests it makes for a connector
//! and names the server from the URL; a plugin that sets one of these
//! headers is refused, and so is a manifest or a credential placement that
//! names one.

/// Headers that carry credentials or name the server: set by the host
/// only. Lower case.
pub const RESERVED: [&str; 4] = ["authorization", "proxy-authorization", "cookie", "host"];

/// Whether `name` (in any case) is one of the [`RESERVED`] headers.
pub fn is_reserved(name: &str) -> bool {
    RESERVED.iter().any(|reserved| reserved.eq_ignore_ascii_case(name))
}

/// Whether `name` is a reserved header that carries a credential (every
/// reserved header but `Host`): a value there is a secret, whatever it
/// looks like.
pub fn carries_credentials(name: &str) -> bool {
    is_reserved(name) && !name.eq_ignore_ascii_case("host")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_in_any_case() {
        for name in ["Authorization", "PROXY-AUTHORIZATION", "cookie", "Host"] {
            assert!(is_reserved(name), "{name}");
        }
        assert!(!is_reserved("X-Api-Key") && !is_reserved("authorization2"));
        assert!(carries_credentials("Cookie") && !carries_credentials("HOST"));
    }
}
