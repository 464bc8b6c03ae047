//! The build script: kubelet's protocols (the `.proto` files beside this one, written for this
//! project from the published APIs) compiled into Rust by protox and tonic-prost-build, so no
//! machine needs `protoc`. Only with the `plugin` feature: the runtime's own build runs
//! nothing here and links none of it. NRI's messages and ttrpc's envelope
//! (src/nri/proto/*.proto, for accel-nri-plugin) are compiled here too, messages only.
//!
//! Each group is compiled into its own directory under OUT_DIR, as two of kubelet's packages
//! share a name across protocols (`v1`: PodResources and DRA health; `v1beta1`: the device
//! plugin and DRA health) and prost names its files by package. All files together are also
//! kept as one encoded descriptor set, which src/kubelet/wire.rs reads to pin every field
//! number.

fn main() {
    println!("cargo:rerun-if-changed=src/kubelet/proto");
    println!("cargo:rerun-if-changed=src/nri/proto");
    #[cfg(feature = "plugin")]
    protocols::compile();
    #[cfg(feature = "plugin")]
    protocols::compile_nri();
}

#[cfg(feature = "plugin")]
mod protocols {
    use std::path::PathBuf;

    const DIR: &str = "src/kubelet/proto";

    /// A directory under OUT_DIR and the files compiled into it.
    const GROUPS: &[(&str, &[&str])] = &[
        ("deviceplugin", &["deviceplugin.proto"]),
        ("pluginregistration", &["pluginregistration.proto"]),
        ("dra", &["dra.proto", "dra_v1beta1.proto"]),
        (
            "dra_health",
            &[
                "dra_health.proto",
                "dra_health_v1beta1.proto",
                "dra_health_v1alpha1.proto",
            ],
        ),
        ("podresources", &["podresources.proto"]),
        ("cri", &["cri.proto"]),
    ];

    pub fn compile() {
        let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
        for (group, files) in GROUPS {
            let fds = protox::compile(*files, [DIR]).unwrap_or_else(|e| panic!("{e:?}"));
            let dir = out.join(group);
            std::fs::create_dir_all(&dir).expect("OUT_DIR is writable");
            tonic_prost_build::configure()
                .build_transport(false)
                .emit_rerun_if_changed(false)
                .out_dir(&dir)
                .compile_fds(fds)
                .unwrap_or_else(|e| panic!("{group}: {e}"));
        }
        let all: Vec<&str> = GROUPS.iter().flat_map(|(_, f)| f.iter().copied()).collect();
        let mut compiler = protox::Compiler::new([DIR]).unwrap_or_else(|e| panic!("{e:?}"));
        compiler
            .include_imports(true)
            .open_files(all)
            .unwrap_or_else(|e| panic!("{e:?}"));
        std::fs::write(
            out.join("kubelet.fds"),
            compiler.encode_file_descriptor_set(),
        )
        .expect("OUT_DIR is writable");
    }

    /// NRI's plugin protocol and ttrpc's envelope (src/nri/proto): messages only, into
    /// OUT_DIR/nri; accel-nri-plugin frames and dispatches them itself (src/nri/ttrpc.rs).
    pub fn compile_nri() {
        let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
        let fds = protox::compile(["nri.proto", "ttrpc.proto"], ["src/nri/proto"])
            .unwrap_or_else(|e| panic!("{e:?}"));
        let dir = out.join("nri");
        std::fs::create_dir_all(&dir).expect("OUT_DIR is writable");
        tonic_prost_build::configure()
            .build_transport(false)
            .build_client(false)
            .build_server(false)
            .emit_rerun_if_changed(false)
            .out_dir(&dir)
            .compile_fds(fds)
            .unwrap_or_else(|e| panic!("nri: {e}"));
    }
}
