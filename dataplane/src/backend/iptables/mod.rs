pub mod names;
pub mod runner;
