//! What both binaries' processes share: the command line and logs ([`cli`]), TLS
//! ([`tls`]), gRPC reflection and health ([`grpc`]), the allocator ([`memory`]) and the
//! lock helper ([`sync`]).

pub mod cli;
pub mod grpc;
pub mod memory;
pub mod sync;
pub mod tls;
