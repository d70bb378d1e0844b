//! cnikit: one binary, many CNI plugins. Dispatch on argv[0] (busybox style):
//! a symlink named `bridge` runs the bridge plugin, and so on. Called as
//! `cnikit`, the first argument picks a plugin or an admin subcommand.

use cnikit::{admin, cni, plugins};
use std::ffi::OsStr;
use std::path::Path;

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let argv0 = args
        .first()
        .map(Path::new)
        .and_then(Path::file_name)
        .and_then(OsStr::to_str)
        .unwrap_or("cnikit");

    // `dhcp daemon FLAGS…`: the reference's invocation of its lease daemon, through the
    // plugin's link (`cnikit dhcp daemon` goes through the admin commands).
    if argv0 == "dhcp" && args.get(1).and_then(|a| a.to_str()) == Some("daemon") {
        let flags: Vec<String> = args[2..]
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        std::process::exit(cnikit::dhcp::daemon::main(&flags));
    }
    // The plugin path comes first and touches nothing else: no clap, no allocation
    // of admin state, because it runs once per pod.
    if let Some(plugin) = plugins::by_name(argv0) {
        std::process::exit(run_plugin(argv0, plugin));
    }
    if let [_, name] = args.as_slice() {
        if let Some(plugin) = name.to_str().and_then(plugins::by_name) {
            std::process::exit(run_plugin(name.to_str().unwrap_or(argv0), plugin));
        }
    }
    std::process::exit(admin::main(args));
}

fn run_plugin(name: &str, plugin: &'static dyn cni::Plugin) -> i32 {
    if std::env::var_os("CNI_COMMAND").is_none() {
        // What the reference plugins print when run by hand.
        println!("CNI {name} plugin (cnikit {})", env!("CARGO_PKG_VERSION"));
        println!(
            "CNI protocol versions supported: {}",
            cni::Version::all_joined()
        );
        return 0;
    }
    cni::runner::main(name, plugin, cni::Context::new(plugins::by_name))
}
