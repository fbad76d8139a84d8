//! kpx's table: its family and name.

pub const FAMILY: &str = "inet";
pub const TABLE: &str = "kpx";
