use std::path::{Path, PathBuf};
use std::{env, fs};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY-free: build scripts are single threaded; the generator reads PROTOC.
    unsafe { env::set_var("PROTOC", &protoc) };
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["kpx/v1/kpx.proto", ADMIN_CONTROL_PLANE, ADMIN_NODE], &["."])?;
    for file in ["kpx/v1/kpx.proto", ADMIN_CONTROL_PLANE, ADMIN_NODE, "kpx/admin/v1/trace.proto"] {
        println!("cargo:rerun-if-changed={file}");
    }
    // One descriptor set per server, so each one's reflection describes only what it serves.
    own_descriptor_set(&protoc, ADMIN_CONTROL_PLANE, &out_dir.join("control_plane_descriptor.bin"))?;
    own_descriptor_set(&protoc, ADMIN_NODE, &out_dir.join("node_descriptor.bin"))?;
    xds_descriptor_set(&protoc, &out_dir.join("xds_descriptor.bin"))?;
    Ok(())
}

const ADMIN_CONTROL_PLANE: &str = "kpx/admin/v1/controlplane.proto";
const ADMIN_NODE: &str = "kpx/admin/v1/node.proto";

/// The descriptor set of `file` and everything it imports.
fn own_descriptor_set(protoc: &Path, file: &str, out: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let status = std::process::Command::new(protoc)
        .arg("--include_imports")
        .arg(format!("--descriptor_set_out={}", out.display()))
        .arg("-I")
        .arg(".")
        .arg(file)
        .status()?;
    if !status.success() {
        return Err(format!("protoc could not compile {file}").into());
    }
    Ok(())
}

/// The descriptor set of Envoy's ADS service and everything it imports, for gRPC
/// reflection: envoy-types ships the `.proto` files but not their descriptors, so
/// they are compiled here from the envoy-types sources cargo already downloaded.
fn xds_descriptor_set(protoc: &Path, out: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let protos = envoy_types_protos()?;
    let include = protoc_bin_vendored::include_path()?;
    let mut cmd = std::process::Command::new(protoc);
    cmd.arg("--include_imports").arg(format!("--descriptor_set_out={}", out.display()));
    for dir in ["data-plane-api", "xds", "protoc-gen-validate", "googleapis", "cel-spec/proto"] {
        cmd.arg("-I").arg(protos.join(dir));
    }
    cmd.arg("-I").arg(include).arg("envoy/service/discovery/v3/ads.proto");
    let status = cmd.status()?;
    if !status.success() {
        return Err(format!("protoc could not compile Envoy's ads.proto from {}", protos.display()).into());
    }
    Ok(())
}

/// `<cargo home>/registry/src/<any registry>/envoy-types-<locked version>/proto`.
fn envoy_types_protos() -> Result<PathBuf, Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let lock = fs::read_to_string(manifest.join("..").join("Cargo.lock"))?;
    let version = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"envoy-types\""))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = \"")))
        .map(|v| v.trim_end_matches('"').to_owned())
        .ok_or("envoy-types is not in Cargo.lock")?;
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let registries = cargo_home.join("registry").join("src");
    for registry in fs::read_dir(&registries)? {
        let candidate = registry?.path().join(format!("envoy-types-{version}")).join("proto");
        if candidate.is_dir() {
            println!("cargo:rerun-if-changed={}", candidate.display());
            return Ok(candidate);
        }
    }
    Err(format!("envoy-types-{version} sources not found under {}", registries.display()).into())
}
