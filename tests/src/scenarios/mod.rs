//! Scenarios written once and run by several test files or inside the IPVS VM: the
//! behaviour suite per backend ([`behaviour`]), faults under continuous traffic
//! ([`faults`]), rolling updates ([`rolling_update`]) and what only IPVS has ([`ipvs`]).

pub mod behaviour;
pub mod faults;
pub mod ipvs;
pub mod rolling_update;
