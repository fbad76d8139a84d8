//! Multi-Cluster Services (KEP-1645, `multicluster.x-k8s.io`): what the clusterset's
//! ServiceImports are, computed from every cluster's ServiceExports and the Services they
//! name ([`resolve`]: the import, each export's validity and conflicts), and the
//! addresses of the ClusterSetIP imports ([`allocate`]).

pub mod allocate;
pub mod resolve;
