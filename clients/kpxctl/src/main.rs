//! `kpxctl`: the Services, endpoints, nodes and rules of kpx, and how a
//! packet will be treated, from either admin API. Tables for people,
//! `-o json` for scripts; exit 1 with a clear message when a server cannot
//! be reached, 2 for bad usage.

mod commands;
mod table;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "kpxctl",
    version,
    about = "See inside kpx: Services, endpoints, nodes, rules, packet traces"
)]
pub struct Cli {
    /// The control plane's gRPC URL (services, endpoints, nodes, sources, trace --node).
    #[arg(long, global = true, default_value = "http://127.0.0.1:18000")]
    pub control_plane: String,
    /// A node agent's admin gRPC URL (rules, state, status, trace without --node).
    #[arg(long, global = true, default_value = "http://127.0.0.1:18001")]
    pub agent: String,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value = "table")]
    pub output: Output,
    /// For https:// URLs: the CA (PEM) that signs the server's certificate.
    #[arg(long = "tls-ca", global = true)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// For https:// URLs: this client's certificate (PEM), e.g. one carrying the control
    /// plane's `--admin-identity`.
    #[arg(long = "tls-cert", global = true, requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The key of `--tls-cert` (PEM).
    #[arg(long = "tls-key", global = true, requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Every Service the control plane serves.
    Services,
    /// A Service's endpoints per port, for every view (or for one node's view).
    Endpoints {
        /// namespace/name or cluster/namespace/name.
        service: String,
        /// Show the view this node is sent.
        #[arg(long)]
        node: Option<String>,
    },
    /// Connected nodes: what each ACKed, its last NACK, pending resources, lag; with a
    /// node name, its version of every resource against the current one.
    Nodes { node: Option<String> },
    /// The control plane's sources and whether they synced.
    Sources,
    /// What the clusterset imports (Multi-Cluster Services): ClusterSetIPs, the clusters
    /// that export and import each name, conflicts, exports that are not valid.
    Imports,
    /// The rules a node agent programmed, exactly as the kernel holds them.
    Rules,
    /// What a node agent accepted, with versions.
    State,
    /// A node agent's connection and apply status.
    Status,
    /// How a packet to ADDRESS:PORT[/PROTO] will be treated, and why.
    Trace {
        /// ADDRESS:PORT, [IPv6]:PORT, optionally /tcp, /udp or /sctp.
        destination: String,
        /// Trace on this node with the views the control plane sends it (else: ask --agent).
        #[arg(long)]
        node: Option<String>,
        /// The client's address (default: a client outside the cluster).
        #[arg(long)]
        source: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kpxctl: cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(commands::run(&cli)) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kpxctl: {e:#}");
            ExitCode::from(1)
        }
    }
}
