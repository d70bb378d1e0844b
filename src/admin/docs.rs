//! `cnikit man --dir DIR` and `cnikit completions SHELL`: man pages and shell
//! completions generated from the clap definitions, so they can never
//! disagree with what the binary accepts. The Debian package ships both
//! (contrib/debian/build runs these commands).

use clap::Command;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The shells whose completion scripts are generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Write `cnikit.1` and one page per subcommand (`cnikit-ipamd-daemon.1`, …)
/// into `dir`, creating it; prints each file written.
pub fn man(cmd: Command, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    for page in pages(&cmd) {
        let path = write_page(page, dir)?;
        println!("{}", path.display());
    }
    Ok(())
}

/// The command and all its visible subcommands, depth first, each named
/// as its page is (`cnikit-ipamd-daemon`).
fn pages(cmd: &Command) -> Vec<Command> {
    let mut out = vec![cmd.clone()];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        out.extend(pages(sub));
    }
    out
}

fn write_page(cmd: Command, dir: &Path) -> Result<PathBuf, String> {
    let man = clap_mangen::Man::new(cmd)
        .manual("cnikit manual")
        .source(format!("cnikit {}", env!("CARGO_PKG_VERSION")));
    let path = dir.join(man.get_filename());
    let mut text = Vec::new();
    man.render(&mut text)
        .map_err(|e| format!("cannot render {}: {e}", path.display()))?;
    // Pages are public documentation: 0644 whatever the umask; an existing
    // page is replaced, never written through a link.
    let _ = std::fs::remove_file(&path);
    let mut file = std::fs::File::options()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    file.write_all(&text)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// The completion script for `shell`, on stdout.
pub fn completions(cmd: Command, shell: Shell) -> Result<(), String> {
    std::io::stdout()
        .write_all(&completion_script(cmd, shell))
        .map_err(|e| format!("cannot write the completions: {e}"))
}

fn completion_script(mut cmd: Command, shell: Shell) -> Vec<u8> {
    let generator = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut out = Vec::new();
    clap_complete::generate(generator, &mut cmd, "cnikit", &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_page_per_subcommand_named_by_its_path() {
        let mut cmd = super::super::command().disable_help_subcommand(true);
        cmd.build();
        let names: Vec<String> = pages(&cmd)
            .iter()
            .map(|c| clap_mangen::Man::new(c.clone()).get_filename())
            .collect();
        for want in [
            "cnikit.1",
            "cnikit-install.1",
            "cnikit-net.1",
            "cnikit-doctor.1",
            "cnikit-man.1",
            "cnikit-completions.1",
            "cnikit-ipamd.1",
            "cnikit-ipamd-daemon.1",
            "cnikit-ipamd-leases.1",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("help")), "{names:?}");
    }

    #[test]
    fn pages_render_with_their_options() {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = super::super::command().disable_help_subcommand(true);
        cmd.build();
        let daemon = pages(&cmd)
            .into_iter()
            .find(|c| c.get_display_name() == Some("cnikit-ipamd-daemon"))
            .expect("daemon page");
        let path = write_page(daemon, dir.path()).unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.contains(".TH cnikit-ipamd-daemon 1"), "{text}");
        assert!(text.contains("reclaim\\-previous\\-boot"), "{text}");
    }

    #[test]
    fn completions_know_the_subcommands() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let text = completion_script(super::super::command(), shell);
            let text = String::from_utf8(text).unwrap();
            assert!(
                text.contains("doctor") && text.contains("leases"),
                "{shell:?}"
            );
        }
    }
}
