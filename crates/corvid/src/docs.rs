//! `corvid generate-docs`: man pages and shell completions made from the command line's
//! own definition, so the package's documentation cannot drift from the binary.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::CommandFactory;

/// Arguments of `corvid generate-docs`.
#[derive(clap::Args)]
pub struct DocsArgs {
    /// The directory to write `man/*.1` and `completions/{bash,zsh,fish}` into.
    #[arg(long)]
    out: PathBuf,
}

/// Writes a man page per command (`corvid.1`, `corvid-controller.1`, `corvid-cni-add.1`
/// ...) and the completions of bash, zsh and fish.
pub fn run(a: DocsArgs) -> anyhow::Result<()> {
    let mut cli = crate::Cli::command();
    cli.build();
    let man = a.out.join("man");
    let completions = a.out.join("completions");
    for dir in [&man, &completions] {
        std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    }
    write_pages(&cli, &man, "corvid")?;
    for (shell, file) in [
        (clap_complete::Shell::Bash, "corvid"),
        (clap_complete::Shell::Zsh, "_corvid"),
        (clap_complete::Shell::Fish, "corvid.fish"),
    ] {
        let mut text = Vec::new();
        clap_complete::generate(shell, &mut cli.clone(), "corvid", &mut text);
        let path = completions.join(file);
        std::fs::write(&path, text).with_context(|| path.display().to_string())?;
    }
    Ok(())
}

/// The page of `cmd` as `name.1`, then those of its subcommands.
fn write_pages(cmd: &clap::Command, dir: &Path, name: &str) -> anyhow::Result<()> {
    let cmd = cmd.clone().name(name.to_string());
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut page)
        .with_context(|| format!("rendering {name}.1"))?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, page).with_context(|| path.display().to_string())?;
    // clap's generated `help` subcommands get no page of their own.
    let pages = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help");
    for sub in pages {
        write_pages(sub, dir, &format!("{name}-{}", sub.get_name()))?;
    }
    Ok(())
}
