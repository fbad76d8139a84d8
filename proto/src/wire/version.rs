//! Content-hash versions: the same bytes give the same version on every
//! control-plane replica and after every restart.

use xxhash_rust::xxh3::xxh3_128;

/// The version of an encoded resource: 32 hex digits of its XXH3-128 hash.
pub fn content_version(encoded: &[u8]) -> String {
    format!("{:032x}", xxh3_128(encoded))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_bytes_same_version_and_different_bytes_differ() {
        assert_eq!(content_version(b"abc"), content_version(b"abc"));
        assert_ne!(content_version(b"abc"), content_version(b"abd"));
        assert_eq!(content_version(b"").len(), 32);
    }
}
