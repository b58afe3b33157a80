//! The front door stays true: every link of README.md and docs/ resolves inside the
//! repository (to a file, and to a heading for a `#fragment`), and every repository path
//! the text names in backticks (`crates/corvid-k8s/src/watcher/pods.rs`, with `{a,b}`
//! alternatives) exists. A file moved or renamed without its mention fails here. Needs no
//! root: part of the unprivileged lane.

use std::path::{Component, Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// README.md and every Markdown file under docs/.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let mut out = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut out);
    out
}

/// `path` with `.` and `..` resolved lexically; none if it climbs above its start.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

/// GitHub's anchor of a heading: lower case, spaces to dashes, punctuation dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings.
fn anchors(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            l.trim_start_matches('#')
                .strip_prefix(' ')
                .filter(|_| l.starts_with('#'))
        })
        .map(slug)
        .collect()
}

/// The targets of `[text](target)` links.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_string());
        }
    }
    out
}

/// The text without its fenced code blocks, whose backticks would pair with the prose's.
fn prose(text: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Repository paths named in backticks, each `{a,b}` alternative spelled out.
fn named_paths(text: &str) -> Vec<String> {
    const TOP: [&str; 5] = ["crates/", "scripts/", "docs/", "deploy/", "packaging/"];
    let mut out = Vec::new();
    for (i, part) in prose(text).split('`').enumerate() {
        if i % 2 == 0 || part.contains(|c: char| c.is_whitespace() || "*<$".contains(c)) {
            continue;
        }
        if TOP.iter().any(|t| part.starts_with(t)) {
            out.extend(expand(part));
        } else if part.starts_with("corvid") && part.contains("/src/") {
            // A crate's file named from its crate (`corvid-k8s/src/ids.rs`).
            out.extend(expand(&format!("crates/{part}")));
        }
    }
    out
}

/// `a/{b,c}.rs` as `a/b.rs` and `a/c.rs`.
fn expand(path: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (path.find('{'), path.find('}')) else {
        return vec![path.to_string()];
    };
    path[open + 1..close]
        .split(',')
        .flat_map(|alt| expand(&format!("{}{alt}{}", &path[..open], &path[close + 1..])))
        .collect()
}

#[test]
fn every_link_and_named_path_of_the_readme_and_docs_resolves_inside_the_repository() {
    let root = root();
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let shown = page
            .strip_prefix(&root)
            .unwrap_or(&page)
            .display()
            .to_string();
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            checked += 1;
            let (file, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                Some(page.clone())
            } else {
                normalize(&page.parent().unwrap().join(file))
            };
            let Some(target) = target.filter(|t| t.starts_with(&root)) else {
                broken.push(format!("{shown}: {link} leaves the repository"));
                continue;
            };
            if !target.exists() {
                broken.push(format!("{shown}: {link}: no such file"));
            } else if !fragment.is_empty() {
                let there = std::fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&there).iter().any(|a| a == fragment) {
                    broken.push(format!("{shown}: {link}: no such heading"));
                }
            }
        }
        for path in named_paths(&text) {
            checked += 1;
            if !root.join(path.trim_end_matches('/')).exists() {
                broken.push(format!("{shown}: `{path}` does not exist"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} of {checked}:\n{}",
        broken.len(),
        broken.join("\n")
    );
    println!("{checked} links and paths resolve");
    assert!(
        checked > 50,
        "only {checked} links and paths found: is the parser blind?"
    );
}

#[test]
fn the_checker_finds_links_anchors_and_paths() {
    assert_eq!(
        links("see [a](b.md#c) and [d](https://e)"),
        ["b.md#c", "https://e"]
    );
    assert_eq!(
        anchors("# corvid\n## Kubernetes benchmark\ntext"),
        ["corvid", "kubernetes-benchmark"]
    );
    assert_eq!(
        named_paths("in `crates/x/src/{a,b}.rs`, `corvid-y/src/c.rs`, `cargo test`, `crates/*/t`"),
        [
            "crates/x/src/a.rs",
            "crates/x/src/b.rs",
            "crates/corvid-y/src/c.rs"
        ]
    );
    assert_eq!(
        named_paths("```sh\ncargo test\n```\nsee `scripts/test.sh`"),
        ["scripts/test.sh"]
    );
    assert_eq!(normalize(Path::new("a/../../b")), None);
}
