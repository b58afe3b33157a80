//! Property-based fuzzing of what a Kurma runtime reads from outside: configurations,
//! interface templates, add/del argument lists and plugin results, and image archives
//! (random entry lists with climbing paths and links, and valid images cut or flipped).
//! Property: a clear error or a valid value, never a panic; a refused image leaves
//! nothing, and no archive writes outside its destination.
//!
//! 2,000 cases by default (archives: 500); `CORVID_FUZZ_CASES` for a longer run.

#[path = "../../corvid/tests/support/fuzz.rs"]
#[macro_use]
mod fuzz;

use std::path::Path;

use corvid_kurma::aci;
use corvid_kurma::config::{self, Config};
use corvid_kurma::invoke::{self, Action, Call};
use proptest::prelude::*;
use serde_json::{json, Value};

fn cases(default: u32) -> ProptestConfig {
    fuzz_config!(default)
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "pod_networks", "podNetworks", "name", "aci", "default", "containerInterface",
            "type", "ipam", "failurePolicy", "restartPlugins", "pluginTimeout", "keyring",
            "insecureRegistries", "discoveryBaseUrl", "insecureDiscovery", "cniVersion",
        ])
        .prop_map(str::to_string),
        1 => "[a-zA-Z_]{0,8}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1e6f64..1e6).prop_map(|f| json!(f)),
        prop_oneof![
            prop::sample::select(vec![
                "net",
                "file:///x.aci",
                "docker://r/x",
                "http://h/x",
                "eth{{num}}",
                "eth0",
                "k{{uuid}}",
                "{{random 4}}",
                "{{nope}}",
                "{{",
                "continue",
                "fail",
                "",
            ])
            .prop_map(str::to_string),
            "\\PC{0,12}",
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// One archive entry: a path, and a file, directory, symlink or hard link.
#[derive(Debug, Clone)]
enum Kind {
    File(Vec<u8>),
    Dir,
    Symlink(String),
    Hardlink(String),
}

fn entry_path() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "manifest",
            "rootfs",
            "rootfs/bin",
            "rootfs/bin/x",
            "rootfs/etc/passwd",
            "extra",
            "rootfs/../escape",
            "/abs",
            "rootfs/a/../../b",
            "rootfs/./c",
            "./manifest",
        ])
        .prop_map(str::to_string),
        "rootfs/[a-z./]{1,12}",
    ]
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..40).prop_map(Kind::File),
        Just(Kind::File(
            br#"{"acKind":"ImageManifest","name":"x","app":{"exec":["/bin/x"]}}"#.to_vec()
        )),
        Just(Kind::Dir),
        prop_oneof![
            prop::sample::select(vec!["/etc", "../../..", "bin/x", "../x", "/", "x"])
                .prop_map(str::to_string),
            "[a-z./]{1,10}",
        ]
        .prop_map(Kind::Symlink),
        prop::sample::select(vec![
            "rootfs/bin/x",
            "manifest",
            "../x",
            "/etc/passwd",
            "rootfs/../x"
        ])
        .prop_map(|t| Kind::Hardlink(t.to_string())),
    ]
}

/// A tar of the entries, paths written raw (the tar crate would refuse the bad ones).
fn archive(entries: &[(String, Kind)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (path, kind) in entries {
        let mut h = tar::Header::new_old();
        let name = path.as_bytes();
        let n = name.len().min(99);
        h.as_old_mut().name[..n].copy_from_slice(&name[..n]);
        h.set_mode(0o755);
        let body: &[u8] = match kind {
            Kind::File(b) => {
                h.set_entry_type(tar::EntryType::Regular);
                b
            }
            Kind::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                &[]
            }
            Kind::Symlink(t) | Kind::Hardlink(t) => {
                h.set_entry_type(if matches!(kind, Kind::Symlink(_)) {
                    tar::EntryType::Symlink
                } else {
                    tar::EntryType::Link
                });
                let t = t.as_bytes();
                let m = t.len().min(99);
                h.as_old_mut().linkname[..m].copy_from_slice(&t[..m]);
                &[]
            }
        };
        h.set_size(body.len() as u64);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(body);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

/// A valid image, for cutting and flipping.
fn valid() -> Vec<u8> {
    archive(&[
        (
            "manifest".into(),
            Kind::File(
                br#"{"acKind":"ImageManifest","name":"x","app":{"exec":["/bin/x"]}}"#.to_vec(),
            ),
        ),
        ("rootfs".into(), Kind::Dir),
        ("rootfs/bin".into(), Kind::Dir),
        ("rootfs/bin/x".into(), Kind::File(b"#!/bin/sh\n".to_vec())),
        ("rootfs/bin/y".into(), Kind::Symlink("x".into())),
    ])
}

/// Everything under `dir`, relative.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

/// Unpacks into a fresh `outer/dest`; checks that nothing lands beside `dest`, that a
/// refusal leaves `dest` empty, and that every link of an accepted image stays inside.
fn check_unpack(bytes: &[u8]) -> Result<(), TestCaseError> {
    let outer = tempfile::tempdir().unwrap();
    let dest = outer.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    let result = aci::unpack(bytes, &dest);
    prop_assert_eq!(
        tree(outer.path())
            .iter()
            .filter(|p| !p.starts_with("dest"))
            .count(),
        0
    );
    match result {
        Ok(image) => {
            prop_assert!(!image.exec.is_empty() && image.id.starts_with("sha512-"));
            let root = dest.join("rootfs").canonicalize().unwrap();
            for p in tree(&root) {
                let full = root.join(&p);
                if let Ok(target) = std::fs::read_link(&full) {
                    if target.is_relative() {
                        // Every prefix of the path stays inside, not only the end: a link
                        // may climb out of the image and back down by as many steps.
                        let resolved = full.parent().unwrap().join(&target);
                        let lowest = resolved.strip_prefix(&root).map(|r| {
                            r.components()
                                .scan(0i64, |d, c| {
                                    *d += match c {
                                        std::path::Component::ParentDir => -1,
                                        _ => 1,
                                    };
                                    Some(*d)
                                })
                                .min()
                                .unwrap_or(0)
                        });
                        prop_assert!(
                            lowest.is_ok_and(|d| d >= 0),
                            "{} -> {}",
                            p,
                            target.display()
                        );
                    }
                }
            }
        }
        Err(e) => {
            prop_assert!(!e.to_string().is_empty());
            prop_assert_eq!(
                tree(&dest),
                Vec::<String>::new(),
                "a refused image left files: {}",
                e
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn any_configuration_is_read_or_refused(v in json_value(), raw in "\\PC{0,40}") {
        for text in [v.to_string(), raw, json!({"pod_networks": [v]}).to_string()] {
            match Config::parse(&text) {
                Ok(c) => {
                    let mut names: Vec<&str> = c.networks.iter().map(|n| n.name.as_str()).collect();
                    let all = names.len();
                    names.sort();
                    names.dedup();
                    prop_assert_eq!(names.len(), all);
                    for n in &c.networks {
                        prop_assert!(!n.aci.is_empty());
                        prop_assert!(serde_json::from_str::<Value>(&n.text).is_ok());
                    }
                }
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }
    }

    #[test]
    fn templates_give_a_new_short_name_or_an_error(
        template in "([a-z]{0,6}|\\{\\{(num|uuid|shortuuid|random [0-9]{1,2}|x)\\}\\}){0,4}",
        taken in prop::collection::vec("eth[0-9]{1,2}", 0..12),
    ) {
        let mut n = 0u64;
        let random = |len: usize| { n += 1; format!("{n:0len$x}") };
        match config::interface_name(&template, "146d7cef-fbf6-41da-a2f8-eba218597f9c", &taken, random) {
            Ok(name) => {
                prop_assert!(!name.is_empty() && name.len() <= config::MAX_IFNAME);
                prop_assert!(!taken.contains(&name));
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    #[test]
    fn add_and_del_arguments_and_results(
        args in prop::collection::vec("\\PC{0,10}", 0..5),
        out in prop::collection::vec(any::<u8>(), 0..80),
        result in json_value(),
    ) {
        for action in [Action::Add, Action::Del] {
            match Call::parse(action, &args) {
                Ok(call) => prop_assert!(args.len() == 2 || args.len() == 3, "{:?}", call),
                Err(e) => prop_assert!(e.to_string().starts_with("usage:")),
            }
        }
        let entry = json!({"cniVersion": "1.0.0", "type": "bridge"});
        for bytes in [out, result.to_string().into_bytes()] {
            if let Ok(v) = invoke::kurma_result(&bytes, &entry) {
                prop_assert!(v.is_object());
            }
        }
    }
}

proptest! {
    #![proptest_config(cases(500))]

    #[test]
    fn archives_of_any_entries_never_escape(entries in prop::collection::vec((entry_path(), kind()), 0..8)) {
        check_unpack(&archive(&entries))?;
    }

    #[test]
    fn valid_images_cut_or_flipped(cut in 0usize..8192, flips in prop::collection::vec((0usize..8192, any::<u8>()), 0..4)) {
        let mut bytes = valid();
        for (at, b) in flips {
            let len = bytes.len();
            bytes[at % len] ^= b;
        }
        bytes.truncate(cut);
        check_unpack(&bytes)?;
    }
}
