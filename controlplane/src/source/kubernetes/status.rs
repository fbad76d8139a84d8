//! What an API server's refusal means, whatever form it came in.
//!
//! A real kube-apiserver answers a request for a group/version it does not serve (a CRD
//! not installed) with a plain-text `404 page not found`, not a `Status` object; kube-rs
//! gives that answer the reason "Failed to parse error data", and kube-core's
//! `Status::is_not_found()` looks at the reason before the code, so it says no. The code
//! is what the API server meant.

use kube::core::Status;

/// A 404 in any form: the object, its namespace or its whole kind is not there.
pub fn is_not_found(status: &Status) -> bool {
    status.code == 404 || status.is_not_found()
}

/// A 403 in any form: RBAC does not allow it.
pub fn is_forbidden(status: &Status) -> bool {
    status.code == 403 || status.is_forbidden()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_text_404_is_not_found_as_a_status_404_is() {
        // What kube-rs makes of `404 page not found` in text/plain (its own words).
        let plain = Status::failure("404 page not found\n", "Failed to parse error data").with_code(404);
        assert!(!plain.is_not_found(), "kube-core's own check misses it (if it learns, drop this helper)");
        assert!(is_not_found(&plain));
        let status = Status::failure("serviceexports not found", "NotFound").with_code(404);
        assert!(is_not_found(&status));
        let forbidden = Status::failure("forbidden", "Failed to parse error data").with_code(403);
        assert!(is_forbidden(&forbidden) && !is_not_found(&forbidden));
        let conflict = Status::failure("conflict", "Conflict").with_code(409);
        assert!(!is_not_found(&conflict) && !is_forbidden(&conflict));
    }
}
