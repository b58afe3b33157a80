//! Property-based fuzzing of the host-local store against what another process (or a
//! crash, or the reference plugin) may leave in it: lease files with any name and any
//! content (truncated, garbage, huge), torn rotation hints, a corrupt owners index.
//! Property: every read gives an error or a value, never a panic, and the store still
//! leases, finds and releases correctly afterwards.
//!
//! 2,000 cases by default; `CORVID_FUZZ_CASES` for a longer run.

#[path = "../../corvid/tests/support/fuzz.rs"]
#[macro_use]
mod fuzz;

use std::net::IpAddr;

use corvid_ipam::leases::LeaseDir;
use proptest::prelude::*;

fn config() -> ProptestConfig {
    fuzz_config!(2000)
}

/// Names another writer may use in a lease directory.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        (1u8..255).prop_map(|n| format!("10.0.0.{n}")),
        any::<u128>().prop_map(|a| std::net::Ipv6Addr::from(a).to_string()),
        (0usize..3).prop_map(|n| format!("last_reserved_ip.{n}")),
        "[a-z0-9]{1,12}".prop_map(|n| format!(".corvid-owners/{n}")),
        "[a-zA-Z0-9._-]{1,16}",
    ]
}

/// What such a file may hold.
fn content() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[a-z0-9]{0,20}(\r\n[a-z0-9]{0,8})?".prop_map(String::into_bytes),
        "(10\\.0\\.0\\.[0-9]{1,3}\n){0,4}".prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..64),
        (0usize..4).prop_map(|k| vec![b'x'; k * 300_000]),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_store_reads_whatever_it_finds_and_still_works(
        files in prop::collection::vec((name(), content()), 0..8),
    ) {
        let data = tempfile::tempdir().unwrap();
        let store = LeaseDir::open(data.path(), "net").unwrap();
        for (name, body) in &files {
            let path = store.dir().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            // A name that collides with a directory made above is skipped.
            let _ = std::fs::write(&path, body);
        }
        let lock = store.lock().unwrap();
        if let Ok(leases) = lock.leases() {
            for l in &leases {
                prop_assert!(files.iter().any(|(n, _)| n.parse::<IpAddr>().ok() == Some(l.ip)));
            }
        }
        for range_set in 0..3 {
            let _ = lock.last_reserved(range_set);
        }
        let _ = lock.held("c1", "eth0");
        let _ = lock.get_by_id("c1", "eth0");
        let _ = lock.release_by_id("c1", "eth0");
        let _ = lock.prune_index();

        // A fresh address still leases, is found by its owner, and releases.
        let ip: IpAddr = "10.0.1.7".parse().unwrap();
        let lease = store.prepare_lease("fuzz-owner", "eth9").unwrap();
        prop_assert!(lock.reserve(lease, ip, 0).unwrap().is_ok());
        lock.note_held("fuzz-owner", "eth9", &[ip]).unwrap();
        prop_assert_eq!(lock.get_by_id("fuzz-owner", "eth9").unwrap(), vec![ip]);
        prop_assert_eq!(lock.release_by_id("fuzz-owner", "eth9").unwrap(), vec![ip]);
        prop_assert!(!lock.is_reserved(ip));
    }
}
