use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY-free: build scripts are single threaded; the generator reads PROTOC.
    unsafe { env::set_var("PROTOC", protoc) };
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .file_descriptor_set_path(out_dir.join("kpx_descriptor.bin"))
        .compile_protos(&["kpx/v1/kpx.proto"], &["."])?;
    println!("cargo:rerun-if-changed=kpx/v1/kpx.proto");
    Ok(())
}
