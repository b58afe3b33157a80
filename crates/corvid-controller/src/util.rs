//! Small generators the API needs: UUIDs, random numbers, timestamps.

use std::time::SystemTime;

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    // getrandom only fails without any entropy source, where nothing else would work either.
    getrandom::fill(&mut b).expect("the kernel's random source");
    b
}

/// A time-ordered (version 7) UUID: IDs made one after another sort together, so their
/// store keys land on the same few pages instead of one page each.
pub fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// A random number below `n` (n > 0).
pub fn random_below(n: u128) -> u128 {
    u128::from_le_bytes(random()) % n
}

/// The current time as Neutron prints it: `2026-11-21T21:00:10Z`.
pub fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_times_have_their_shapes() {
        let id = new_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "7");
        assert!(id.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit() && !c.is_ascii_uppercase(),
        }));
        assert!("89ab".contains(&id[19..20]), "RFC 4122 variant");
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(new_id() > id, "time-ordered across milliseconds");
        let t = now();
        assert_eq!(t.len(), 20);
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T');
        assert!(t.as_str() > "2025-01-01");
    }
}
