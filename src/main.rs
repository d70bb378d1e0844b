//! cnikit: one binary, many CNI plugins. Dispatch on argv[0] (busybox style):
//! a symlink named `bridge` runs the bridge plugin, and so on. Called as
//! `cnikit`, the first argument picks a plugin or an admin subcommand.

use cnikit::cni::Builtins;
use cnikit::netlink::linger::DeferredClose;
use cnikit::{admin, cni, plugins};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;

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
    if let Some(code) = run_plugin(argv0) {
        std::process::exit(code);
    }
    if let [_, name] = args.as_slice() {
        if let Some(code) = name.to_str().and_then(run_plugin) {
            std::process::exit(code);
        }
    }
    std::process::exit(admin::main(args));
}

/// Runs the plugin called `name` for this process's CNI call and returns the
/// exit code; None when no plugin has that name.
fn run_plugin(name: &str) -> Option<i32> {
    // The call's netfilter sockets: closed after the reply by a child nobody
    // waits for, so that their close does not hold up this process's exit.
    let sockets_closed_after_reply = DeferredClose::new();
    let plugins = Arc::new(plugins::Registry::new(&sockets_closed_after_reply));
    let plugin = plugins.by_name(name)?;
    if std::env::var_os("CNI_COMMAND").is_none() {
        // What the reference plugins print when run by hand.
        println!("CNI {name} plugin (cnikit {})", env!("CARGO_PKG_VERSION"));
        println!(
            "CNI protocol versions supported: {}",
            cni::Version::all_joined()
        );
        return Some(0);
    }
    let ctx = cni::Context::new(plugins.clone());
    Some(cni::runner::main(name, plugin, ctx, || {
        sockets_closed_after_reply.hand_off()
    }))
}
