//! Small generators the API needs: UUIDs, MACs, timestamps.

use std::time::{SystemTime, UNIX_EPOCH};

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    // getrandom only fails without any entropy source, where nothing else would work either.
    getrandom::getrandom(&mut b).expect("the kernel's random source");
    b
}

/// A random (version 4) UUID.
pub fn new_id() -> String {
    let mut b: [u8; 16] = random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A random MAC in Neutron's `fa:16:3e` range.
pub fn new_mac() -> String {
    let b: [u8; 3] = random();
    format!("fa:16:3e:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2])
}

/// A random number below `n` (n > 0).
pub fn random_below(n: u128) -> u128 {
    u128::from_le_bytes(random()) % n
}

/// The current time as Neutron prints it: `2026-11-21T21:00:10Z`.
pub fn now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_macs_and_times_have_their_shapes() {
        let id = new_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!(new_mac().starts_with("fa:16:3e:"));
        let t = now();
        assert_eq!(t.len(), 20);
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T');
        assert!(t.as_str() > "2025-01-01");
    }
}
