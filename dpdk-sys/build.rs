//! Probes the system DPDK with pkg-config, generates bindings with bindgen and compiles the
//! fast-path shim with the same cflags. Links DPDK's shared libraries: EAL then loads the
//! PMDs (net_ring, net_null, PCI drivers...) from the system driver directory by itself.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const MIN_VERSION: &str = "22.11";
const HELP: &str = "install DPDK's development files: `apt-get install -y libdpdk-dev dpdk pkg-config libclang-14-dev` \
                    (or run scripts/install-deps.sh), or build pvswitch without DPDK: `cargo build --no-default-features`";

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=shim.c");
    for var in ["PKG_CONFIG", "PKG_CONFIG_PATH", "PKG_CONFIG_LIBDIR", "PKG_CONFIG_SYSROOT_DIR"] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    // Version check and the raw cflags. pkg-config's crate API drops flags such as
    // `-include rte_config.h` and `-march=...`, which DPDK's headers need, so ask the tool.
    let version_ok = Command::new("pkg-config")
        .args([&format!("--atleast-version={MIN_VERSION}"), "libdpdk"])
        .status()
        .unwrap_or_else(|e| panic!("dpdk-sys: cannot run pkg-config ({e}); {HELP}"));
    if !version_ok.success() {
        let found = Command::new("pkg-config")
            .args(["--modversion", "libdpdk"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        match found {
            Some(v) => panic!("dpdk-sys: DPDK {v} found by pkg-config, but >= {MIN_VERSION} is needed; {HELP}"),
            None => panic!("dpdk-sys: pkg-config cannot find libdpdk (DPDK >= {MIN_VERSION}); {HELP}"),
        }
    }
    let out = Command::new("pkg-config").args(["--cflags", "libdpdk"]).output().expect("pkg-config --cflags");
    assert!(out.status.success(), "dpdk-sys: `pkg-config --cflags libdpdk` failed; {HELP}");
    let cflags: Vec<String> =
        String::from_utf8(out.stdout).expect("utf-8 cflags").split_whitespace().map(String::from).collect();

    // The shim first: its static archive must precede the DPDK shared libraries on the link line.
    let mut build = cc::Build::new();
    build.file("shim.c").include(".").opt_level(3).warnings(true);
    for f in &cflags {
        build.flag(f);
    }
    build.compile("pvs_dpdk_shim");

    // Link flags (-L, -l) for the shared libraries.
    pkg_config::Config::new()
        .atleast_version(MIN_VERSION)
        .probe("libdpdk")
        .unwrap_or_else(|e| panic!("dpdk-sys: pkg-config libdpdk: {e}; {HELP}"));

    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_args(&cflags)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .allowlist_function("pvs_.*")
        .allowlist_function("rte_eal_.*")
        .allowlist_function("rte_eth_.*")
        .allowlist_function("rte_pktmbuf_.*")
        .allowlist_function("rte_mempool_.*")
        .allowlist_function("rte_dev_probe|rte_dev_remove|rte_dev_name")
        .allowlist_function("rte_socket_id|rte_socket_count|rte_lcore_count")
        .allowlist_function("rte_thread_register|rte_thread_unregister")
        .allowlist_function("rte_strerror")
        .allowlist_type("rte_mbuf|rte_mempool|rte_eth_conf|rte_eth_dev_info|rte_eth_stats")
        .allowlist_type("rte_eth_rxconf|rte_eth_txconf|rte_eth_link")
        .allowlist_var("RTE_ETH_.*|RTE_MAX_ETHPORTS|RTE_MBUF_DEFAULT_.*|RTE_PKTMBUF_HEADROOM|RTE_DEV_NAME_MAX_LEN")
        .allowlist_var("SOCKET_ID_ANY|LCORE_ID_ANY|RTE_MEMPOOL_NAMESIZE|RTE_ETH_NAME_MAX_LEN")
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false)
        .generate()
        .unwrap_or_else(|e| {
            panic!("dpdk-sys: bindgen on wrapper.h failed: {e} (needs libclang: apt-get install -y libclang-14-dev)")
        });
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    bindings.write_to_file(out_dir.join("bindings.rs")).expect("write bindings.rs");
}
